"""Zero latency with cache writes on: where the cache's cost goes. In one process, against one
loopback server, interleaved rounds of cold engine runs of 3,000 zero-latency calls (engine.stream into a
fresh cache, then a flush), each variant once a round:
  cache    the engine as it is;
  noclaim  ResponseCache.claim takes every key without asking the file (no claims thread);
  nowrite  no claims, and ResponseCache.put stores nothing (no writer work);
  nocache  no cache at all;
  batchROWS/SECONDS  the cache with the writer's batch_rows / batch_seconds changed.
Prints calls/s, process CPU us a call and CPU us a call by thread (medians).

    ROUNDS=4 VARIANTS=cache,noclaim,nowrite,nocache python benchmarks/results/cold_run_cache_variants.py

A scratch tool kept beside the figures it produced (cold_run_zero_latency.txt)."""
import asyncio, os, sys, time, json, tempfile, threading, statistics
HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, HERE); sys.path.insert(0, os.path.join(HERE, "benchmarks"))
import engine_bench as eb
from engine.scheduler import Engine
import cache.store as cs
N = 3000
WINDOW = int(os.environ.get("WINDOW", "0"))
VARIANTS = os.environ.get("VARIANTS", "cache,noclaim,nowrite,nocache").split(",")
ROUNDS = int(os.environ.get("ROUNDS", "4"))
def cpu_by_thread():
    out = {}
    for t in threading.enumerate():
        try: out[t.name.split("-")[-1] if t.name.startswith("tulving") else t.name] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except Exception: pass
    return out
orig_claim = cs.ResponseCache.claim
async def no_claim(self, keys): return set(keys)
orig_put = cs.ResponseCache.put
def no_put(self, *a, **k): pass
DEFAULTS = dict(cs.ResponseCache.__init__.__kwdefaults__)
async def one(config, variant, off):
    cs.ResponseCache.__init__.__kwdefaults__.update(DEFAULTS)
    if variant.startswith("batch"):
        rows, secs = variant[5:].split("/")
        cs.ResponseCache.__init__.__kwdefaults__.update(batch_rows=int(rows), batch_seconds=float(secs))
    cs.ResponseCache.claim = no_claim if variant in ("noclaim", "nowrite") else orig_claim
    cs.ResponseCache.put = no_put if variant == "nowrite" else orig_put
    with tempfile.TemporaryDirectory() as tmp:
        async with Engine(config, cache_path=None if variant == "nocache" else os.path.join(tmp, "c.sqlite")) as engine:
            if WINDOW: engine.window = WINDOW
            a = cpu_by_thread(); c, w = time.process_time(), time.perf_counter()
            async for o in engine.stream(list(eb.requests(N, offset=off * N)), total=N):
                assert o.ok
            if engine._cache is not None: await engine._cache.flush()
            w, c = time.perf_counter() - w, time.process_time() - c
            b = cpu_by_thread()
    return N / w, c / N * 1e6, {k: (b[k] - a.get(k, 0)) / N * 1e6 for k in b}
async def main():
    res = {}
    with eb.ServerProcess() as server:
        config = eb.config_for(server.base_url, 64)
        off = 1000
        for r in range(ROUNDS):
            for v in VARIANTS:
                off += 1
                res.setdefault(v, []).append(await one(config, v, off))
    for v, runs in res.items():
        th = {}
        for x in runs:
            for k, val in x[2].items(): th.setdefault(k, []).append(val)
        print(f"{v:8s} {statistics.median(x[0] for x in runs):7,.0f} calls/s  CPU {statistics.median(x[1] for x in runs):5.0f} us  " + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in th.items()))
import uvloop; uvloop.install(); asyncio.run(main())
