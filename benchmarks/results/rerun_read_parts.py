"""Cached rerun: read_results as it was (the response decoded to text, re-encoded to hash) against
read_results now (the response as its stored bytes), 10,000 keys 128 at a time, interleaved, us a row; and the
Outcome of a hit built by keywords against positionally (the figures of rerun_inline_reads.txt).

    python benchmarks/results/rerun_read_parts.py

Run from the repository; needs /tmp/rerun/rerun.sqlite and /tmp/rerun/base_url as rerun_trees_ab.py says.
A scratch tool kept beside the figures it produced."""
import os
import statistics
import sys
import time
import timeit

sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import orjson  # noqa: E402

import cache.store as cs  # noqa: E402
import engine_bench as eb  # noqa: E402
from cache.codec import result_from_record  # noqa: E402
from engine.requests import ChatRequest, Outcome, cached_outcome  # noqa: E402
from engine.resolve import resolve_many  # noqa: E402

N = 10_000
config = eb.config_for(open("/tmp/rerun/base_url").read(), 64, max_attempts=1)
keys = [r.key for r in resolve_many(config, list(eb.requests(N)))]
conn = cs.connect("/tmp/rerun/rerun.sqlite", create=False)
conn.execute(f"PRAGMA mmap_size = {cs.READ_MMAP_BYTES}")


def read_as_text() -> dict:
    """read_results before 41f212a: the response as text, hashed after an encode."""
    found = {}
    for i in range(0, N, 128):
        for key, text, vectors, dtype, count, checksum in cs._entry_rows(conn, keys[i:i + 128]):
            if checksum is not None and checksum != cs.entry_checksum(key, text, vectors):
                continue
            found[key] = result_from_record(orjson.loads(text))
    return found


def read_as_bytes() -> dict:
    found = {}
    for i in range(0, N, 128):
        found.update(cs.read_results(conn, keys[i:i + 128], []))
    return found


assert read_as_text() == read_as_bytes()
runs: dict[str, list[float]] = {"text": [], "bytes": []}
for _ in range(9):
    for name, fn in (("text", read_as_text), ("bytes", read_as_bytes)):
        start = time.process_time()
        fn()
        runs[name].append((time.process_time() - start) / N * 1e6)
for name, values in runs.items():
    print(f"read_results, response as {name:5s}: {statistics.median(values):.2f} us a row (min {min(values):.2f})")
request = ChatRequest(model="m", messages=[{"role": "user", "content": "x"}])
result = read_as_bytes()[keys[0]]
for name, fn in (("keywords", lambda: Outcome(request=request, result=result, cached=True, key="k")),
                 ("cached_outcome", lambda: cached_outcome(request, result, "k"))):
    print(f"a hit's Outcome by {name}: {min(timeit.repeat(fn, number=200_000, repeat=7)) / 200_000 * 1e6:.2f} us")
