"""The PostgreSQL cache against a real server (tests/pg_cluster.py): the same
rows, checksums and chunks as the SQLite store, its schema version, claims,
the batch ledger, `cache copy` both ways, and the database going away mid-run."""
from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from cache.backend import open_cache, open_ledger, open_spending_ledger
from cache.copy import copy_cache
from cache.keys import request_key
from cache.location import redact, split_password
from cache.pg_schema import SCHEMA_VERSION, CacheUnavailable
from cache.postgres import PostgresCache
from cache.store import CacheError, ResponseCache
from providers.base import ChatResult, EmbedResult
from tests.pg_cluster import Cluster, with_database

REPO = Path(__file__).resolve().parents[1]
BOOK = "\n\n".join(f"Paragraph {i}: " + "word " * 400 for i in range(60))  # ~120 KB, cut into chunks


def identity(i: int, book: str = BOOK) -> dict[str, object]:
    return {"op": "chat", "kind": "openai", "base_url": "http://x", "model": "m", "params": {"temperature": 0},
            "messages": [{"role": "user", "content": f"{book}\n\nQuestion {i}?"}], "draw": 0}


async def fill(cache: PostgresCache | ResponseCache, n: int) -> list[str]:
    keys = [request_key(identity(i)) for i in range(n)]
    for i, key in enumerate(keys):
        cache.put(key, identity(i), ChatResult(text=f"answer {i}", input_tokens=100 + i, output_tokens=5))
    await cache.flush()
    return keys


def test_the_url_picks_the_backend_and_its_password_never_shows():
    assert isinstance(open_cache("postgresql://u@h/db"), PostgresCache)
    assert isinstance(open_cache("postgres://u@h/db"), PostgresCache)
    assert isinstance(open_cache("runs/cache.sqlite"), ResponseCache)
    assert redact("postgresql://u:hunter2@h:5/db?sslmode=require") == "postgresql://u:***@h:5/db?sslmode=require"
    assert redact("postgresql://u@h/db?password=hunter2") == "postgresql://u@h/db?password=***"
    assert split_password("postgresql://u:p%40ss@h/db") == ("postgresql://u@h/db", "p@ss")
    assert split_password("postgresql://u@h/db?sslmode=disable&password=x") == ("postgresql://u@h/db?sslmode=disable",
                                                                                "x")
    assert split_password("cache.sqlite") == ("cache.sqlite", None)


async def test_rows_checksums_and_a_book_stored_once(pg_url):
    async with PostgresCache(pg_url) as cache:
        keys = await fill(cache, 40)
        vectors = EmbedResult(vectors=[[0.5, -1.25], [3.0, 4.0]], input_tokens=3)
        cache.put("e" * 64, {"op": "embed", "model": "emb", "texts": ["a", "b"]}, vectors)
        await cache.flush()
    async with PostgresCache(pg_url) as cache:  # a new process's view: nothing from memory
        found = await cache.get_many([*keys, "e" * 64, "f" * 64])
        assert len(found) == 41 and found[keys[7]] == ChatResult(text="answer 7", input_tokens=107, output_tokens=5)
        assert found["e" * 64] == vectors
    conn = await asyncpg.connect(pg_url)
    try:
        chunk_bytes = await conn.fetchval("SELECT sum(size) FROM tulving.blobs")
        assert len(BOOK) < chunk_bytes < 1.5 * len(BOOK)  # the book once, not 40 times
        assert await conn.fetchval("SELECT max(version) FROM tulving.schema_version") == SCHEMA_VERSION
        # A row whose response no longer matches its checksum is a miss, never a wrong answer.
        await conn.execute("UPDATE tulving.entries SET response = replace(response, 'answer 3', 'answer 9') "
                           "WHERE key = $1", keys[3])
        async with PostgresCache(pg_url) as cache:
            assert keys[3] not in await cache.get_many(keys)
        await conn.execute("UPDATE tulving.schema_version SET version = $1", SCHEMA_VERSION + 1)
    finally:
        await conn.close()
    with pytest.raises(CacheError, match="newer Tulving .schema version 2, this one reads 1"):
        await PostgresCache(pg_url).open()


async def test_a_claim_is_held_until_stored_and_a_lapsed_lease_is_taken_over(pg_url, monkeypatch):
    monkeypatch.setenv("TULVING_CACHE_LEASE", "1")
    keys = [request_key(identity(i)) for i in range(5)]
    async with PostgresCache(pg_url) as first, PostgresCache(pg_url) as second:
        assert await first.claim(keys) == set(keys)
        assert await second.claim(keys) == set()  # held by a live owner: renewed while it lives
        await asyncio.sleep(1.5)
        assert await second.claim(keys) == set()
        first.put(keys[0], identity(0), ChatResult(text="paid once"))
        first.release(keys[1:3])
        got: dict[str, object] = {}
        mine: set[str] = set()
        async for hits, claimed in second.wait_for(keys[:3]):
            got.update(hits)
            mine |= claimed
        assert got == {keys[0]: ChatResult(text="paid once")} and mine == set(keys[1:3])
        first._renewer._lease = 1e9  # noqa: SLF001 -- as if it were SIGKILLed: it renews no more
        await first._renewer.stop()  # noqa: SLF001
        await asyncio.sleep(1.2)
        assert await second.claim(keys[3:]) == set(keys[3:])  # lapsed: taken over


async def test_the_batch_ledger_is_shared(pg_url):
    one, two = open_ledger(pg_url), open_ledger(pg_url)
    try:
        await one.record("batch_1", endpoint="oa", kind="openai", base_url=None, model="m", state="in_progress",
                         keys=["k1", "k2"])
        assert await two.owing("oa", ["k1", "k2", "k3"]) == {"k1": "batch_1", "k2": "batch_1"}
        await two.settled("batch_1", ["k1"])
        [batch] = await one.batches(owing_only=True)
        assert batch.id == "batch_1" and batch.owed == 1 and batch.requests == 2
    finally:
        one.close()
        two.close()


async def test_cache_copy_both_ways_verified_and_idempotent(pg_url, tmp_path):
    source = tmp_path / "a.sqlite"
    async with ResponseCache(source) as cache:
        keys = await fill(cache, 30)
    with sqlite3.connect(source) as conn:  # one damaged row: left out, counted
        conn.execute("UPDATE entries SET response = replace(response, 'answer 4', 'answer 8') WHERE key = ?",
                     (keys[4],))
    ledger, spending = open_ledger(source), open_spending_ledger(source)  # the ledgers go along
    try:
        await ledger.record("batch_c", endpoint="oa", kind="openai", base_url=None, model="m", state="in_progress",
                            keys=keys[:3])
        await spending.record_spending("run_c", "inv_1", usd=2.5, calls=30, label="book: m")
    finally:
        ledger.close()
        spending.close()
    report = await copy_cache(source, pg_url)
    assert (report.copied, report.damaged, report.batches, report.invocations) == (29, 1, 1, 1)
    again = await copy_cache(source, pg_url)
    assert (again.copied, again.present, again.damaged) == (0, 29, 1)
    back = tmp_path / "b.sqlite"
    assert (await copy_cache(pg_url, back)).copied == 29
    for where in (pg_url, back):
        copied_ledger, copied_spending = open_ledger(where), open_spending_ledger(where)
        try:
            assert await copied_ledger.owing("oa", keys[:4]) == dict.fromkeys(keys[:3], "batch_c")
            assert (await copied_spending.ledger_total("run_c")).spent_usd == 2.5
        finally:
            copied_ledger.close()
            copied_spending.close()
    async with ResponseCache(back) as cache:
        found = await cache.get_many(keys)
    assert len(found) == 29 and found[keys[29]] == ChatResult(text="answer 29", input_tokens=129, output_tokens=5)
    cli = subprocess.run([sys.executable, "-m", "engine.cli", "cache", "copy", str(back), pg_url], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert "copied 0 entries" in cli.stdout and "29 already there" in cli.stdout
    assert split_password(pg_url)[1] not in cli.stdout + cli.stderr


async def test_bad_urls_are_one_line_before_anything(pg_server, tmp_path):
    wrong_password = pg_server.replace(split_password(pg_server)[1] or "", "not-the-password")
    for url, words in ((wrong_password, "password authentication failed"),
                       (with_database(pg_server, "no_such_db"), "does not exist"),
                       ("postgresql://u@127.0.0.1:1/db", "is PostgreSQL running there")):
        with pytest.raises(CacheError, match=words) as caught:
            await PostgresCache(url).open()
        assert "not-the-password" not in str(caught.value) and "\n" not in str(caught.value)


async def test_the_database_going_away_spills_and_writes_back(own_pg_cluster: Cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("TULVING_CACHE_OUTAGE", "30")
    url = own_pg_cluster.url
    cache = PostgresCache(url, spill_dir=tmp_path)
    await cache.open()
    try:
        before = await fill(cache, 10)
        own_pg_cluster.stop()
        keys = [request_key(identity(i)) for i in range(10, 30)]
        for i, key in enumerate(keys, 10):
            cache.put(key, identity(i), ChatResult(text=f"answer {i}"))
        await cache.flush()
        assert cache.spilled == 20 and cache.spill_path.exists()  # kept locally while the server is away
        own_pg_cluster.start()
        found = await cache.get_many(before + keys)  # reads wait for it to come back
        await cache.flush()
    finally:
        await cache.close()
    assert len(found) == 30 and not cache.spill_path.exists()  # written back, the spill removed
    async with PostgresCache(url) as fresh:
        assert len(await fresh.get_many(keys)) == 20


async def test_a_database_that_stays_away_stops_with_exit_5_naming_the_spill(own_pg_cluster: Cluster, tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("TULVING_CACHE_OUTAGE", "1")
    url = own_pg_cluster.url
    cache = PostgresCache(url, spill_dir=tmp_path)
    await cache.open()
    own_pg_cluster.stop()
    keys = [request_key(identity(i)) for i in range(5)]
    for i, key in enumerate(keys):
        cache.put(key, identity(i), ChatResult(text=f"answer {i}"))
    with pytest.raises(CacheUnavailable) as caught:
        await cache.close()
    message = str(caught.value)
    assert caught.value.exit_code == 5 and str(cache.spill_path) in message
    assert f"tulving cache copy {cache.spill_path} {redact(url)}" in message
    assert split_password(url)[1] not in message
    own_pg_cluster.start()
    report = await copy_cache(cache.spill_path, url)  # the one command the line names
    assert report.copied == 5
