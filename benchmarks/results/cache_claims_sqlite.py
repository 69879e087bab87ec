"""The cost of claiming a cold run's misses in SQLite (cache/store.py _claim_rows), the
executemany of one row a key against one INSERT of the chunk's keys from a JSON array; and of deleting
the claims (what the writer does when it stores the replies). 3,072 new keys, 128 a transaction, as the
engine claims them; thread CPU us a key, two runs of each, in turn.

    python benchmarks/results/cache_claims_sqlite.py

A scratch tool kept beside the figures it produced (cold_run_zero_latency.txt)."""
import asyncio
import hashlib
import os
import sqlite3
import sys
import tempfile
import time

import orjson

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from cache.store import CLAIMS_SCHEMA, ResponseCache, connect  # noqa: E402

path = os.path.join(tempfile.mkdtemp(), "c.sqlite")


async def create() -> None:
    async with ResponseCache(path):
        pass


asyncio.run(create())
conn = connect(path, create=True)
conn.execute(CLAIMS_SCHEMA)
conn.isolation_level = None
owner, lease = "host:1:abcdef12", 60.0


def rows(keys: list[str]) -> set[str]:
    now = time.time()
    marks = ",".join("?" * len(keys))
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(f"DELETE FROM claims WHERE lease_until < ? AND key IN ({marks})", [now, *keys])
    conn.executemany("INSERT OR IGNORE INTO claims (key, owner, lease_until) SELECT ?, ?, ? "
                     "WHERE ? OR NOT EXISTS (SELECT 1 FROM entries WHERE key = ?)",
                     [(k, owner, now + lease, False, k) for k in keys])
    mine = {k for (k,) in conn.execute(f"SELECT key FROM claims WHERE owner = ? AND key IN ({marks})", [owner, *keys])}
    conn.execute("COMMIT")
    return mine


def json_array(keys: list[str]) -> set[str]:
    now = time.time()
    marks = ",".join("?" * len(keys))
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(f"DELETE FROM claims WHERE lease_until < ? AND key IN ({marks})", [now, *keys])
    conn.execute("INSERT OR IGNORE INTO claims (key, owner, lease_until) SELECT value, ?, ? FROM json_each(?) "
                 "WHERE NOT EXISTS (SELECT 1 FROM entries WHERE key = value)", (owner, now + lease, orjson.dumps(keys)))
    mine = {k for (k,) in conn.execute(f"SELECT key FROM claims WHERE owner = ? AND key IN ({marks})", [owner, *keys])}
    conn.execute("COMMIT")
    return mine


def delete(keys: list[str]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany("DELETE FROM claims WHERE key = ? AND owner = ?", [(k, owner) for k in keys])
    conn.execute("COMMIT")


print(f"SQLite {sqlite3.sqlite_version}")
for claim in (rows, json_array, rows, json_array):
    keys = [hashlib.sha256(f"{claim.__name__} {i} {time.time()}".encode()).hexdigest() for i in range(3072)]
    cpu = time.thread_time()
    for i in range(0, len(keys), 128):
        assert len(claim(keys[i:i + 128])) == 128
    claimed = time.thread_time() - cpu
    cpu = time.thread_time()
    for i in range(0, len(keys), 128):
        delete(keys[i:i + 128])
    deleted = time.thread_time() - cpu
    print(f"{claim.__name__:10s} claim {claimed / len(keys) * 1e6:5.1f} us a key; delete {deleted / len(keys) * 1e6:5.1f} us a key")
