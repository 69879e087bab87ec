"""30% random 429s: when each call of the engine finished, per second, and its attempts, against the bound of
limits_bench.py (171 / 10 s + the longest 429 chain) and the floor of every attempt at the limit's rate. Same server and
requests as `python benchmarks/limits_bench.py --cases random429`.

    python benchmarks/results/random429_timeline.py ROUNDS

A scratch tool kept beside the figures it produced (random429_timeline.txt)."""
import asyncio, sys, time, collections
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.dirname(__import__("os").path.abspath(__file__)))))
from benchmarks.limits_bench import ServerProcess, config_for, _requests, LATENCY_MS
from engine.scheduler import Engine
async def main():
    n, rpm = 171, 600
    with ServerProcess("--rpm", str(rpm), "--window", "sliding", "--fault", "429=0.3", "--try-again-ms", "1000",
                       "--latency", "lognormal", "--latency-ms", str(LATENCY_MS)) as server:
        for k in range(int(sys.argv[1])):
            config = config_for(server.base_url, 64, rpm=rpm)
            done = []
            async with Engine(config) as engine:
                t0 = time.perf_counter()
                async for o in engine.stream(_requests(n, 200_000 + k * 1000), total=n):
                    done.append((time.perf_counter() - t0, o.attempts))
                wall = time.perf_counter() - t0
                st = engine.stats
            attempts = sum(a for _, a in done)
            most = max(a for _, a in done)
            per = collections.Counter(int(t) for t, _ in done)
            print(f"wall {wall:.1f} s attempts {attempts} (ideal {attempts/10:.1f} s) 429s {st.rate_limited} most {most} bound {n/10 + most - 1:.1f} ratio {wall/(n/10+most-1):.2f}")
            print("  done per second:", [per[i] for i in range(int(wall)+1)])
asyncio.run(main())
