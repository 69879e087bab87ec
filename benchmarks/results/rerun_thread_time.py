"""Cached rerun: the cost of two time.thread_time() calls made beside each inline cache read of a
cached rerun of benchmark 3's 10,000 requests (what measuring a read's CPU time would add).

    python benchmarks/results/rerun_thread_time.py

Run from the repository; needs /tmp/rerun/rerun.sqlite and /tmp/rerun/base_url as rerun_trees_ab.py
says. A scratch tool kept beside the figures it produced (rerun_inline_switch.txt)."""
import asyncio, os, sys, time
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import engine_bench as eb
from engine.scheduler import Engine
import cache.store as cs
acc = [0.0, 0]
orig = cs.read_results
def rr(*a):
    t = time.perf_counter(); time.thread_time(); acc[0] += time.perf_counter() - t
    r = orig(*a)
    t = time.perf_counter(); time.thread_time(); acc[0] += time.perf_counter() - t
    acc[1] += 2
    return r
cs.read_results = rr
config = eb.config_for(open("/tmp/rerun/base_url").read(), 64, max_attempts=1)
reqs = list(eb.requests(10_000))
async def main():
    for _ in range(4):
        acc[:] = [0.0, 0]
        async with Engine(config, cache_path="/tmp/rerun/rerun.sqlite") as engine:
            w = time.perf_counter(); await engine.run(reqs); w = time.perf_counter() - w
        print(f"{1e4/w:,.0f}/s  time.thread_time: {acc[1]} calls, {acc[0]*1e3:.1f} ms in all, {acc[0]/acc[1]*1e6:.0f} us a call")
import uvloop; uvloop.run(main())
