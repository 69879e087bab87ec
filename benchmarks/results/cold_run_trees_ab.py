"""Zero latency with cache writes on (benchmark 1's engine side): source trees side by side.

    python benchmarks/results/cold_run_trees_ab.py ROUNDS TREE...

One loopback server (this tree's engine.loopback, its own process); each round, per tree, a child
process (cwd = the tree, so its modules are imported) makes 2 cold engine runs of 3,000 zero-latency
calls into a fresh cache (engine.stream, then a flush), and prints calls/s, process CPU us a call
and CPU us a call by thread (MainThread = the event loop; read, write, claims = the cache's threads):
median [min-max] over all runs. A scratch tool kept beside the figures it produced
(cold_run_zero_latency.txt)."""
import json, statistics, subprocess, sys, os
HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, HERE); sys.path.insert(0, os.path.join(HERE, "benchmarks"))
import engine_bench as eb
rounds, trees = int(sys.argv[1]), sys.argv[2:]
child = r'''
import asyncio, os, sys, time, json, tempfile, threading
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import engine_bench as eb
from engine.scheduler import Engine
N = 3000
def cpu_by_thread():
    out = {}
    for t in threading.enumerate():
        try: out[t.name.split("-")[-1] if t.name.startswith("tulving") else t.name] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except Exception: pass
    return out
async def main():
    config = eb.config_for(sys.argv[1], 64)
    out = []
    for r in range(2):
        with tempfile.TemporaryDirectory() as tmp:
            async with Engine(config, cache_path=os.path.join(tmp, "c.sqlite")) as engine:
                a = cpu_by_thread(); c, w = time.process_time(), time.perf_counter()
                reqs = list(eb.requests(N, offset=(int(sys.argv[2]) * 2 + r) * N))
                async for o in engine.stream(reqs, total=N):
                    assert o.ok
                await engine._cache.flush()
                w, c = time.perf_counter() - w, time.process_time() - c
                b = cpu_by_thread()
        out.append((N / w, c / N * 1e6, {k: round((b[k] - a.get(k, 0)) / N * 1e6, 1) for k in b}))
    print(json.dumps(out))
import uvloop; uvloop.install()
asyncio.run(main())
'''
res = {t: [] for t in trees}
with eb.ServerProcess() as server:
    for i in range(rounds):
        for t in trees:
            res[t] += json.loads(subprocess.run([sys.executable, "-c", child, server.base_url, str(i * 10 + trees.index(t))], cwd=t, capture_output=True, text=True, check=True).stdout)
for t, runs in res.items():
    rate = [x[0] for x in runs]; cpu = [x[1] for x in runs]
    threads = {}
    for x in runs:
        for k, v in x[2].items(): threads.setdefault(k, []).append(v)
    print(f"{t:14s} {statistics.median(rate):7,.0f} calls/s [{min(rate):,.0f}-{max(rate):,.0f}]  CPU {statistics.median(cpu):.0f} us [{min(cpu):.0f}-{max(cpu):.0f}]  by thread (median): " + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in threads.items()))
