"""Which PostgreSQL driver for the shared cache (cache/postgres.py): asyncpg
or psycopg 3 (async, with psycopg_pool), timed on the two things the cache
does all day: a batched lookup of 1,000 keys and a put of 1,000 rows.

    python benchmarks/pg_drivers.py postgresql://user:pw@127.0.0.1:5432/db [--rounds 20]

Each driver gets a table of its own (dropped at the end); rows look like the
cache's (a 64-hex key, a ~300-byte JSON response). The median of the rounds
is printed, per driver and operation.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import time

import orjson

ROWS = 1000
RESPONSE = orjson.dumps({"text": "x" * 250, "finish_reason": "stop", "input_tokens": 1200,
                         "output_tokens": 80}).decode()
SCHEMA = "CREATE TABLE IF NOT EXISTS {t} (key TEXT PRIMARY KEY, response TEXT NOT NULL, identity TEXT NOT NULL)"


def rows(round_no: int) -> list[tuple[str, str, str]]:
    return [(hashlib.sha256(f"{round_no}:{i}".encode()).hexdigest(), RESPONSE, '{"op": "chat"}')
            for i in range(ROWS)]


async def bench_asyncpg(url: str, rounds: int) -> dict[str, float]:
    import asyncpg

    pool = await asyncpg.create_pool(url, min_size=2, max_size=2)
    table = "bench_asyncpg"
    times: dict[str, list[float]] = {"put": [], "get": []}
    try:
        await pool.execute(f"DROP TABLE IF EXISTS {table}; " + SCHEMA.format(t=table))
        for n in range(rounds):
            batch = rows(n)
            start = time.perf_counter()
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    f"INSERT INTO {table} (key, response, identity) SELECT * FROM unnest($1::text[], $2::text[], "
                    "$3::text[]) ON CONFLICT DO NOTHING",
                    [r[0] for r in batch], [r[1] for r in batch], [r[2] for r in batch])
            times["put"].append(time.perf_counter() - start)
            start = time.perf_counter()
            found = await pool.fetch(f"SELECT key, response FROM {table} WHERE key = ANY($1::text[])",
                                     [r[0] for r in batch])
            times["get"].append(time.perf_counter() - start)
            assert len(found) == ROWS
    finally:
        await pool.execute(f"DROP TABLE IF EXISTS {table}")
        await pool.close()
    return {op: statistics.median(t) for op, t in times.items()}


async def bench_psycopg(url: str, rounds: int) -> dict[str, float]:
    from psycopg_pool import AsyncConnectionPool

    table = "bench_psycopg"
    times: dict[str, list[float]] = {"put": [], "get": []}
    async with AsyncConnectionPool(url, min_size=2, max_size=2, open=False) as pool:
        async with pool.connection() as conn:
            await conn.execute(f"DROP TABLE IF EXISTS {table}")
            await conn.execute(SCHEMA.format(t=table))
        try:
            for n in range(rounds):
                batch = rows(n)
                start = time.perf_counter()
                async with pool.connection() as conn, conn.cursor() as cur:
                    await cur.execute(
                        f"INSERT INTO {table} (key, response, identity) SELECT * FROM unnest(%s::text[], "
                        "%s::text[], %s::text[]) ON CONFLICT DO NOTHING",
                        ([r[0] for r in batch], [r[1] for r in batch], [r[2] for r in batch]))
                times["put"].append(time.perf_counter() - start)
                start = time.perf_counter()
                async with pool.connection() as conn, conn.cursor() as cur:
                    await cur.execute(f"SELECT key, response FROM {table} WHERE key = ANY(%s::text[])",
                                      ([r[0] for r in batch],))
                    found = await cur.fetchall()
                times["get"].append(time.perf_counter() - start)
                assert len(found) == ROWS
        finally:
            async with pool.connection() as conn:
                await conn.execute(f"DROP TABLE IF EXISTS {table}")
    return {op: statistics.median(t) for op, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    for name, bench in (("asyncpg", bench_asyncpg), ("psycopg3", bench_psycopg)):
        result = asyncio.run(bench(args.url, args.rounds))
        print(f"{name:9s} get {ROWS} keys: {result['get'] * 1000:6.2f} ms ({ROWS / result['get']:,.0f} keys/s)   "
              f"put {ROWS} rows: {result['put'] * 1000:6.2f} ms ({ROWS / result['put']:,.0f} rows/s)")


if __name__ == "__main__":
    main()
