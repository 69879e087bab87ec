"""`tulving cache copy SRC DST`: every entry of one cache into another,
between any two backends (a SQLite file, a postgresql:// URL), checksums
verified; idempotent (a key DST holds is kept, and checked to be the same).

    report = await copy_cache("runs/cache.sqlite", "postgresql://team@db/tulving")
    print(report.format())

An entry is copied with the chunks its identity uses. One whose checksum
does not match its response, or whose chunk is missing or does not match its
digest, is left out and counted as damaged; after each page DST's checksums
of the keys are read back and compared with SRC's.

The ledgers the cache holds beside its entries go along: the batch ledger
(`batches`, `batch_keys`: batches submitted and not yet collected, so a run
on DST collects them instead of paying for them again) and the spending
ledger (`spending`: what each invocation of a run paid, which `--max-cost`
counts). A row DST already holds is kept unless SRC's was updated later.
"""
from __future__ import annotations

import hashlib
import os
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import orjson

from cache.codec import CHUNKS, chunk_digests
from cache.location import is_postgres_url, redact
from cache.store import ENTRY_COLUMNS, INSERT_BLOB, CacheError, _Entry, _insert_entries, connect, decode_entry

if TYPE_CHECKING:
    import asyncpg

PAGE = 1000
_SELECT = f"SELECT {', '.join(ENTRY_COLUMNS)} FROM entries"
_Blobs = dict[str, tuple[str, int]]

# The ledger tables (the same columns in both backends: cache/batches.py,
# cache/spending_ledger.py, cache/pg_schema.py), their key columns, and
# whether a row holds an `updated_at` (then the later row wins).
_LEDGERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "batches": (("id", "endpoint", "kind", "base_url", "model", "state", "counts", "requests", "submitted_at",
                 "updated_at"), ("id",)),
    "batch_keys": (("batch_id", "key"), ("batch_id", "key")),
    "spending": (("run", "invocation", "label", "spent_usd", "calls", "started_at", "updated_at"),
                 ("run", "invocation")),
}


def _upsert_sql(table: str, placeholders: list[str]) -> str:
    """INSERT of a ledger row: a new key is added; an existing one is updated
    only when the incoming row is newer (`updated_at`), else kept."""
    columns, key = _LEDGERS[table]
    sql = (f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(placeholders)}) "
           f"ON CONFLICT ({', '.join(key)}) DO ")
    rest = [c for c in columns if c not in key]
    if "updated_at" not in columns:
        return sql + "NOTHING"
    return (sql + "UPDATE SET " + ", ".join(f"{c} = excluded.{c}" for c in rest)
            + f" WHERE excluded.updated_at > {table}.updated_at")


@dataclass
class CopyReport:
    source: str
    target: str
    copied: int = 0      # entries written to the target
    present: int = 0     # entries the target already held (the same checksum)
    differ: int = 0      # keys the target holds with another checksum (kept as they are)
    damaged: int = 0     # source entries left out: checksum or chunks wrong
    chunks: int = 0      # chunks sent along (the target keeps those it had)
    batches: int = 0     # batch ledger rows of the source (batches submitted)
    invocations: int = 0  # spending ledger rows of the source (invocations of runs)

    def format(self) -> str:
        ledgers = []
        if self.batches:
            ledgers.append(f"{self.batches:,} batches of the batch ledger")
        if self.invocations:
            ledgers.append(f"{self.invocations:,} invocations of the spending ledger")
        return (f"copied {self.copied:,} entries from {self.source} to {self.target} ({self.present:,} already "
                f"there, {self.chunks:,} chunks checked); {self.damaged:,} damaged entries left out"
                + (f"; {self.differ:,} keys differ in the target (kept)" if self.differ else "")
                + (f"; with {' and '.join(ledgers)}" if ledgers else ""))


class _Side(Protocol):
    async def page(self, after: str) -> list[_Entry]: ...
    async def blobs(self, digests: list[str]) -> dict[str, str]: ...
    async def write(self, entries: list[_Entry], blobs: _Blobs) -> int: ...
    async def checksums(self, keys: list[str]) -> dict[str, str | None]: ...
    async def ledger(self, table: str) -> list[tuple[object, ...]]: ...
    async def write_ledger(self, table: str, rows: list[tuple[object, ...]]) -> None: ...
    async def close(self) -> None: ...


def _lenient_text(raw: bytes) -> str:
    """A TEXT value of the source as a str even when it is not UTF-8 (its
    bytes kept as surrogates): such a row then fails its checksum and is left
    out as damaged, as lookups and `cache check` treat it, instead of ending
    the copy."""
    return raw.decode("utf-8", "surrogateescape")


class _SqliteSide:
    def __init__(self, path: str, *, create: bool):
        self.conn = connect(path, create=create)
        if not create:  # the source: a damaged row is counted, not fatal
            self.conn.text_factory = _lenient_text

    async def page(self, after: str) -> list[_Entry]:
        return self.conn.execute(f"{_SELECT} WHERE key > ? ORDER BY key LIMIT {PAGE}", (after,)).fetchall()

    async def blobs(self, digests: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for i in range(0, len(digests), 500):
            part = digests[i:i + 500]
            found.update(self.conn.execute(f"SELECT digest, text FROM blobs WHERE digest IN ({','.join('?' * len(part))})",
                                           part))
        return found

    async def write(self, entries: list[_Entry], blobs: _Blobs) -> int:
        before = self.conn.total_changes
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(INSERT_BLOB, [(d, size, text) for d, (text, size) in blobs.items()])
            blob_changes = self.conn.total_changes - before
            _insert_entries(self.conn, entries)
        return self.conn.total_changes - before - blob_changes

    async def checksums(self, keys: list[str]) -> dict[str, str | None]:
        found: dict[str, str | None] = {}
        for i in range(0, len(keys), 500):
            part = keys[i:i + 500]
            found.update(self.conn.execute(f"SELECT key, checksum FROM entries WHERE key IN ({','.join('?' * len(part))})",
                                           part))
        return found

    async def ledger(self, table: str) -> list[tuple[object, ...]]:
        """Every row of a ledger table (none when this file never had one)."""
        if not self.conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone():
            return []
        return self.conn.execute(f"SELECT {', '.join(_LEDGERS[table][0])} FROM {table}").fetchall()

    async def write_ledger(self, table: str, rows: list[tuple[object, ...]]) -> None:
        from cache.batches import SCHEMA as BATCHES
        from cache.spending_ledger import SCHEMA as SPENDING

        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            for statement in (SPENDING if table == "spending" else BATCHES).split(";"):
                if statement.strip():
                    self.conn.execute(statement)
            self.conn.executemany(_upsert_sql(table, ["?"] * len(_LEDGERS[table][0])), rows)

    async def close(self) -> None:
        self.conn.close()


class _PostgresSide:
    def __init__(self, pool: asyncpg.Pool, *, owned: bool):
        self.pool, self.owned = pool, owned

    async def page(self, after: str) -> list[_Entry]:
        rows = await self.pool.fetch(f"{_SELECT} WHERE key > $1 ORDER BY key LIMIT {PAGE}", after)
        return [(*tuple(r)[:7], bytes(r["vectors"]) if r["vectors"] is not None else None, *tuple(r)[8:])
                for r in rows]

    async def blobs(self, digests: list[str]) -> dict[str, str]:
        rows = await self.pool.fetch("SELECT digest, text FROM blobs WHERE digest = ANY($1::text[])", digests)
        return {r[0]: r[1] for r in rows}

    async def write(self, entries: list[_Entry], blobs: _Blobs) -> int:
        from cache.pg_schema import insert_rows

        async with self.pool.acquire() as conn, conn.transaction():
            return await insert_rows(conn, entries, blobs)

    async def checksums(self, keys: list[str]) -> dict[str, str | None]:
        rows = await self.pool.fetch("SELECT key, checksum FROM entries WHERE key = ANY($1::text[])", keys)
        return {r[0]: r[1] for r in rows}

    async def ledger(self, table: str) -> list[tuple[object, ...]]:
        return [tuple(r) for r in await self.pool.fetch(f"SELECT {', '.join(_LEDGERS[table][0])} FROM {table}")]

    async def write_ledger(self, table: str, rows: list[tuple[object, ...]]) -> None:
        placeholders = [f"${i}" for i in range(1, len(_LEDGERS[table][0]) + 1)]
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.executemany(_upsert_sql(table, placeholders), rows)

    async def close(self) -> None:
        if self.owned:
            await self.pool.close()


async def _side(location: str, *, target: bool, pool: asyncpg.Pool | None = None) -> _Side:
    if is_postgres_url(location):
        from cache.pg_schema import open_pool

        return _PostgresSide(pool or await open_pool(location), owned=pool is None)
    if not target and not os.path.isfile(location):
        raise CacheError(f"no cache file at {location}")
    return _SqliteSide(location, create=target)


def _verified(entry: _Entry) -> _Entry | None:
    """The entry with its checksum (computed for a row written before
    checksums), or None when its response does not match it."""
    key, text, vectors, dtype, count, checksum = entry[0], entry[6], entry[7], entry[8], entry[9], entry[11]
    try:
        decode_entry(key, text, vectors, dtype, count, checksum)
    except Exception:  # noqa: BLE001 -- damaged: left out
        return None
    if checksum is None:
        from cache.store import entry_checksum

        return (*entry[:11], entry_checksum(key, text, vectors))
    return entry


async def _copy_page(src: _Side, dst: _Side, rows: list[_Entry], report: CopyReport) -> None:
    entries: list[_Entry] = []
    wanted: dict[str, set[str]] = {}
    for row in rows:
        entry = _verified(row)
        if entry is None:
            report.damaged += 1
            continue
        entries.append(entry)
        if CHUNKS in entry[10]:
            wanted[entry[0]] = chunk_digests(orjson.loads(entry[10]))
    texts = await src.blobs(sorted(set().union(*wanted.values()))) if wanted else {}
    good = {d for d, t in texts.items() if hashlib.sha256(t.encode("utf-8", "surrogatepass")).hexdigest() == d}
    kept = [e for e in entries if wanted.get(e[0], set()) <= good]
    report.damaged += len(entries) - len(kept)
    blobs = {d: (texts[d], len(texts[d].encode("utf-8", "surrogatepass"))) for d in good}
    report.chunks += len(blobs)
    copied = await dst.write(kept, blobs)
    report.copied += copied
    stored = await dst.checksums([e[0] for e in kept])
    differ = sum(1 for e in kept if stored.get(e[0]) not in (e[11], None))
    report.differ += differ
    report.present += len(kept) - copied - differ


async def copy_cache(source: str | os.PathLike[str], target: str | os.PathLike[str], *,
                     pool: asyncpg.Pool | None = None) -> CopyReport:
    """Copy every entry of `source` into `target` (see the module
    docstring). `pool`: an open pool of `target` (a PostgreSQL cache writing
    its spill file back)."""
    source, target = os.fspath(source), os.fspath(target)
    if source == target:
        raise CacheError("cache copy needs two different caches")
    report = CopyReport(redact(source), redact(target))
    src = await _side(source, target=False)
    try:
        dst = await _side(target, target=True, pool=pool)
        try:
            after = ""
            while rows := await src.page(after):
                await _copy_page(src, dst, rows, report)
                after = rows[-1][0]
            for table in _LEDGERS:  # after the entries: a batch's collected replies are there first
                ledger = await src.ledger(table)
                if ledger:
                    await dst.write_ledger(table, ledger)
                report.batches += len(ledger) if table == "batches" else 0
                report.invocations += len(ledger) if table == "spending" else 0
        finally:
            await dst.close()
    except sqlite3.DatabaseError as exc:
        raise CacheError(f"cache copy from {report.source} to {report.target} failed: {exc}") from None
    finally:
        await src.close()
    return report
