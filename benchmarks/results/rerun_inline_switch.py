"""Cached rerun: how many of N cached reruns of benchmark 3's 10,000 requests ended with their
lookups sent to the cache's reader thread (ResponseCache._read_inline's switch tripped), and their requests/s.

    python benchmarks/results/rerun_inline_switch.py TREE N

Needs /tmp/rerun/rerun.sqlite and /tmp/rerun/base_url as rerun_trees_ab.py says. A scratch tool kept
beside the figures it produced (rerun_inline_switch.txt)."""
import asyncio, sys, time, os
tree = sys.argv[1]
sys.path.insert(0, tree); sys.path.insert(0, tree + "/benchmarks")
import engine_bench as eb
from engine.scheduler import Engine
config = eb.config_for(open("/tmp/rerun/base_url").read(), 64, max_attempts=1)
reqs = list(eb.requests(10_000))
async def main():
    tripped, rates = 0, []
    for _ in range(int(sys.argv[2])):
        async with Engine(config, cache_path="/tmp/rerun/rerun.sqlite") as engine:
            w = time.perf_counter(); await engine.run(reqs); w = time.perf_counter() - w
            tripped += engine._cache.inline_read_seconds == 0
        rates.append(1e4 / w)
    rates.sort()
    print(f"{tree}: {tripped} of {len(rates)} reruns sent lookups to the reader thread; requests/s median {rates[len(rates)//2]:,.0f} [{rates[0]:,.0f}-{rates[-1]:,.0f}]")
import uvloop; uvloop.run(main())
