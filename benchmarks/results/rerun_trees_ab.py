"""Cached rerun: two source trees side by side (before/after a change), in interleaved rounds.

    python benchmarks/results/rerun_trees_ab.py ROUNDS TREE_BEFORE TREE_AFTER

Each round runs, per tree, a child process (cwd = the tree, so its modules are imported)
that makes 3 cached reruns of benchmark 3's 10,000 requests through Engine.run; prints
requests/s, process CPU us a request and event-loop thread CPU us a request (median [min-max]).
Needs /tmp/rerun/rerun.sqlite filled with those requests and /tmp/rerun/base_url holding the
base URL it was filled with (engine_bench.py part 3's fill; the key hashes the base URL).
A scratch tool kept beside the figures it produced (rerun_cpu.txt)."""
import json
import statistics
import subprocess
import sys

trees = sys.argv[2:]
rounds = int(sys.argv[1])
child = r'''
import asyncio, os, sys, time, json
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import engine_bench as eb
from engine.scheduler import Engine
path = "/tmp/rerun/rerun.sqlite"; N = 10_000
async def main():
    config = eb.config_for(open("/tmp/rerun/base_url").read(), 64, max_attempts=1)
    reqs = list(eb.requests(N))
    out = []
    for _ in range(3):
        async with Engine(config, cache_path=path) as engine:
            c, w, t = time.process_time(), time.perf_counter(), time.thread_time()
            res = await engine.run(reqs)
            c, w, t = time.process_time() - c, time.perf_counter() - w, time.thread_time() - t
            assert engine.stats.cache_hits == N
        out.append((N / w, c / N * 1e6, t / N * 1e6))
    print(json.dumps(out))
import uvloop; uvloop.install()
asyncio.run(main())
'''
res = {t: [] for t in trees}
for _ in range(rounds):
    for t in trees:
        res[t] += json.loads(subprocess.run([sys.executable, "-c", child], cwd=t, capture_output=True, text=True, check=True).stdout)
for t, runs in res.items():
    rate = [x[0] for x in runs]
    cpu = [x[1] for x in runs]
    loop = [x[2] for x in runs]
    print(f"{t:22s} {statistics.median(rate):7,.0f}/s [{min(rate):,.0f}-{max(rate):,.0f}]  "
          f"CPU {statistics.median(cpu):.1f} us [{min(cpu):.1f}-{max(cpu):.1f}]  loop {statistics.median(loop):.1f} [{min(loop):.1f}]")
