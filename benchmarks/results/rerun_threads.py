"""Cached rerun: CPU of the event-loop thread and of the cache reader thread over each of N
reruns in one process (the hand-off figures of rerun_inline_reads.txt: reader 10-17 us a row on 76096ec).

    python benchmarks/results/rerun_threads.py TREE N

Needs /tmp/rerun/rerun.sqlite and /tmp/rerun/base_url as rerun_trees_ab.py says. A scratch tool kept
beside the figures it produced."""
import asyncio, os, sys, time, threading
tree = sys.argv[1]
sys.path.insert(0, tree); sys.path.insert(0, tree + "/benchmarks")
import engine_bench as eb
from engine.scheduler import Engine
import cache.store as cs
N = 10_000
spent = {}
orig = cs._ReaderThread._main
def main_(self):
    t = time.thread_time(); orig(self); spent.setdefault(threading.current_thread().name, []).append(time.thread_time() - t)
cs._ReaderThread._main = main_
config = eb.config_for(open("/tmp/rerun/base_url").read(), 64, max_attempts=1)
reqs = list(eb.requests(N))
async def main():
    for _ in range(int(sys.argv[2])):
        async with Engine(config, cache_path="/tmp/rerun/rerun.sqlite") as engine:
            t0 = os.times(); c, w, th = time.process_time(), time.perf_counter(), time.thread_time()
            await engine.run(reqs)
            c, w, th = time.process_time() - c, time.perf_counter() - w, time.thread_time() - th
        t1 = os.times(); time.sleep(0.05)
        print(f"{N/w:8,.0f}/s cpu {c/N*1e6:5.1f} loop {th/N*1e6:5.1f} reader(whole life) {spent['tulving-cache-read'][-1]/N*1e6:5.1f} user {(t1.user-t0.user)/N*1e6:5.1f} sys {(t1.system-t0.system)/N*1e6:5.1f}")
import uvloop; uvloop.install()
asyncio.run(main())
