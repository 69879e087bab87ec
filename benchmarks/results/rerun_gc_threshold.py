"""Cached rerun: the young-generation GC threshold 10,000 against 50,000 (and gc.freeze), alternating
in one process, with the collections gc.callbacks saw (the "Tried and not kept" figures of rerun_inline_reads.txt).

    python benchmarks/results/rerun_gc_threshold.py TREE

Needs /tmp/rerun/rerun.sqlite and /tmp/rerun/base_url as rerun_trees_ab.py says. A scratch tool."""
import asyncio, os, sys, time, statistics, gc
tree = sys.argv[1]
sys.path.insert(0, tree); sys.path.insert(0, tree + "/benchmarks")
import engine_bench as eb
from engine.scheduler import Engine
import engine.gc_tuning as G
N = 10_000
config = eb.config_for(open("/tmp/rerun/base_url").read(), 64, max_attempts=1)
reqs = list(eb.requests(N))
stats = {}
cur = [None]; t0 = [0.0]
def cb(phase, info):
    if phase == "start": t0[0] = time.perf_counter()
    else:
        s = stats.setdefault(cur[0], [0.0, [0, 0, 0]]); s[0] += time.perf_counter() - t0[0]; s[1][info["generation"]] += 1
gc.callbacks.append(cb)
async def main():
    res = {}
    for _ in range(6):
        for mode in ("10k", "50k", "10k+freeze", "50k+freeze"):
            G.YOUNG_THRESHOLD = 50_000 if mode.startswith("50k") else 10_000
            cur[0] = mode
            async with Engine(config, cache_path="/tmp/rerun/rerun.sqlite") as engine:
                if "freeze" in mode: gc.freeze()
                c, t = time.process_time(), time.perf_counter()
                out = await engine.run(reqs)
                c, t = time.process_time() - c, time.perf_counter() - t
                if "freeze" in mode: gc.unfreeze()
            res.setdefault(mode, []).append((N / t, c / N * 1e6))
    for w, v in res.items():
        print(f"{w:12s}", f"{statistics.median(x[0] for x in v):,.0f}/s", f"{statistics.median(x[1] for x in v):.1f} us", f"gc {stats[w][0]*1e3/6:.0f} ms/run gens {stats[w][1]}")
import uvloop; uvloop.install()
asyncio.run(main())
