"""Response cache throughput on a temporary file: writes with one commit per
row (the baseline) against the batching writer, lookups one `get` at a time
through the read thread (the baseline) against `get_many`, and the cache's
share of a cached rerun (resolve + key + get_many of chat requests); and
blobs: the published long book in context for its 686 questions (one cached
reply each) against the prompt text those entries stand for.

    python benchmarks/cache_bench.py [--rows 10000] [--book synaptic-echoes]
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cache.store import ResponseCache  # noqa: E402
from engine.benchmark.evaluation.answers import in_context_prompt, messages  # noqa: E402
from engine.benchmark.evaluation.questions import build_questions  # noqa: E402
from engine.benchmark.generation.published import load_book  # noqa: E402
from engine.config import Config  # noqa: E402
from engine.requests import ChatRequest  # noqa: E402
from engine.resolve import resolve  # noqa: E402
from providers.base import ChatResult  # noqa: E402

SYSTEM = {"role": "system", "content": "You are an expert in memory tests."}


def requests(n: int) -> list[ChatRequest]:
    return [ChatRequest(model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": f"Question {i}: where?"}])
            for i in range(n)]


def reply(i: int) -> ChatResult:
    return ChatResult(text=f"The answer to question {i} is London.", finish_reason="stop", input_tokens=40,
                      output_tokens=9, latency=1.25, request_id=f"req-{i}")


async def write(path: Path, resolved, batch_rows: int) -> float:
    async with ResponseCache(path, batch_rows=batch_rows) as cache:
        start = time.perf_counter()
        for i, r in enumerate(resolved):
            cache.put(r.key, r.identity, reply(i))
        await cache.flush()
        return len(resolved) / (time.perf_counter() - start)


async def read(path: Path, keys: list[str]) -> tuple[float, float]:
    async with ResponseCache(path) as cache:
        await cache.get_many(keys[:100])  # warm the page cache
        start = time.perf_counter()
        for key in keys:
            assert await cache.get(key) is not None
        single = len(keys) / (time.perf_counter() - start)
        start = time.perf_counter()
        found = await cache.get_many(keys)
        batched = len(keys) / (time.perf_counter() - start)
        assert len(found) == len(keys)
        return single, batched


async def rerun(path: Path, config: Config, reqs: list[ChatRequest]) -> float:
    async with ResponseCache(path) as cache:
        start = time.perf_counter()
        keys = [resolve(config, r).key for r in reqs]
        found = await cache.get_many(keys)
        elapsed = time.perf_counter() - start
        assert len(found) == len(reqs)
        return len(reqs) / elapsed


async def blobs(path: Path, config: Config, book_name: str) -> str:
    book = load_book(book_name)
    questions = build_questions(book)
    prompt_chars = 0
    async with ResponseCache(path) as cache:
        for i, q in enumerate(questions):
            prompt = messages(in_context_prompt(book.text, q.question))
            prompt_chars += sum(len(m["content"]) for m in prompt)
            r = resolve(config, ChatRequest(model="gpt-4o", messages=prompt))
            cache.put(r.key, r.identity, reply(i))
        await cache.flush()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        chunks, chunk_bytes = conn.execute("SELECT count(*), sum(size) FROM blobs").fetchone()
    size = sum(os.path.getsize(f"{path}{suffix}") for suffix in ("", "-wal") if os.path.exists(f"{path}{suffix}"))
    return (f"  blobs  : {len(questions)} in-context prompts over the {len(book.text.encode()) / 1e3:,.0f} KB book "
            f"({prompt_chars / 1e6:,.0f} MB of prompt text): {chunks} chunks, {chunk_bytes / 1e3:,.0f} KB, "
            f"in a {size / 1e6:.1f} MB file")


async def main(rows: int, book: str) -> None:
    config = Config.load(None)
    reqs = requests(rows)
    resolved = [resolve(config, r) for r in reqs]
    with tempfile.TemporaryDirectory() as tmp:
        single_path, batched_path = Path(tmp, "single.sqlite"), Path(tmp, "batched.sqlite")
        single_rows = min(rows, 3000)  # one commit a row is slow: time a slice
        single_write = await write(single_path, resolved[:single_rows], batch_rows=1)
        batched_write = await write(batched_path, resolved, batch_rows=512)
        single_read, batched_read = await read(batched_path, [r.key for r in resolved])
        rerun_rate = await rerun(batched_path, config, reqs)
        blob_line = await blobs(Path(tmp, "book.sqlite"), config, book)
    print(f"cache benchmark, {rows:,} rows on a temporary file")
    print(f"  writes : one commit per row {single_write:>10,.0f} rows/s  | batched writer {batched_write:>10,.0f} rows/s"
          f"  (x{batched_write / single_write:.1f})")
    print(f"  lookups: get() one at a time {single_read:>9,.0f} keys/s  | get_many       {batched_read:>10,.0f} keys/s"
          f"  (x{batched_read / single_read:.1f})")
    print(f"  rerun  : resolve + key + get_many of {rows:,} chat requests: {rerun_rate:,.0f} requests/s "
          f"(engine target >= 20,000 overall)")
    print(blob_line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--book", default="synaptic-echoes", help="a published book (default %(default)s)")
    args = parser.parse_args()
    asyncio.run(main(args.rows, args.book))
