"""Cached rerun: read on the reader thread against read on the loop thread (monkeypatched),
in one process (the "Reading on the loop's thread instead" figures of rerun_inline_reads.txt, on 76096ec).

    python benchmarks/results/rerun_inline_ab.py TREE N thread|sync

Needs /tmp/rerun/rerun.sqlite and /tmp/rerun/base_url as rerun_trees_ab.py says. A scratch tool."""
import asyncio, os, sys, time, threading
tree = sys.argv[1]
sys.path.insert(0, tree); sys.path.insert(0, tree + "/benchmarks")
import engine_bench as eb
from engine.scheduler import Engine
import cache.store as cs
SYNC = sys.argv[3] == "sync"
if SYNC:
    orig_run = cs._ReaderThread.run
    def run(self, fn, *args):
        if fn is cs.read_results:
            loop = asyncio.get_running_loop(); f = loop.create_future()
            try: f.set_result(fn(*args))
            except BaseException as e: f.set_exception(e)
            return f
        return orig_run(self, fn, *args)
    cs._ReaderThread.run = run
N = 10_000
config = eb.config_for(open("/tmp/rerun/base_url").read(), 64, max_attempts=1)
reqs = list(eb.requests(N))
async def main():
    out = []
    for _ in range(int(sys.argv[2])):
        async with Engine(config, cache_path="/tmp/rerun/rerun.sqlite") as engine:
            c, w = time.process_time(), time.perf_counter()
            await engine.run(reqs)
            c, w = time.process_time() - c, time.perf_counter() - w
        out.append(f"{N/w:,.0f}/{c/N*1e6:.1f}")
    print(sys.argv[3], " ".join(out))
import uvloop; uvloop.install()
asyncio.run(main())
