"""Generation of a book against the loopback OpenAI-compatible server, whose
replies come from the builtin writer (flawed share 0.2) after a set latency,
under a requests-per-minute limit.

Reports the wall time next to
- the reference's schedule: one call at a time with a sleep after each,
  calls x (latency + sleep) -- the sleep is a parameter (default 1 s);
- the limit-bound minimum: the largest of calls / rpm, calls x latency /
  concurrency, and the longest chain of dependent calls of one event x latency.

    python benchmarks/generation_bench.py [--events 200] [--latency 0.5] [--rpm 3000] [--concurrency 64]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.benchmark.builtin import writer as builtin_writer  # noqa: E402
from engine.benchmark.generation.chapters import ChapterGenerator  # noqa: E402
from engine.benchmark.generation.events import sample_events, sample_meta_events  # noqa: E402
from engine.benchmark.generation.universe import load_universe  # noqa: E402
from engine.config import Config  # noqa: E402
from engine.loopback.server import LoopbackServer, constant  # noqa: E402
from engine.scheduler import Engine  # noqa: E402


def _reply(api: str, body: dict) -> str:
    return builtin_writer.respond(body["messages"], body)


async def bench(events: int, latency: float, rpm: float, concurrency: int, sleep: float, itermax: int) -> dict:
    universe = load_universe("default")
    evs = sample_events(universe, events)
    metas = sample_meta_events(universe, len(evs))
    async with LoopbackServer(models=["writer-http"], reply=_reply, latency=constant(latency), rpm=rpm) as server:
        config = Config.from_dicts(
            {"loop": {"kind": "openai", "base_url": server.openai_base_url, "max_concurrency": concurrency,
                      "rpm": rpm}},
            {"writer": {"endpoint": "loop", "model": "writer-http",
                        "params": {"temperature": 1.0, "max_tokens": 4096, "flaw_rate": 0.2}}})
        with tempfile.TemporaryDirectory() as tmp:
            cache = str(Path(tmp) / "cache.sqlite")
            timings = []
            for _ in range(2):  # fresh, then a rerun from the cache
                start = time.perf_counter()
                async with Engine(config, cache_path=cache) as engine:
                    run = await ChapterGenerator(engine, evs, metas, universe.spec.styles, model="writer",
                                                 itermax=itermax, seed_draws=True).run()
                timings.append((time.perf_counter() - start, run))
        sent = server.stats.by_path["/v1/chat/completions"]
        rate_limited = server.stats.rate_limited
    (wall, run), (rerun_wall, rerun) = timings
    per_event: Counter[int] = Counter()
    for r in run.log:
        per_event[r["event"]] += 1 if r["outcome"] == "failed_exact" else 2
    chain = max(per_event.values())
    return {"events": len(evs), "chapters": len(run.valid), "calls": run.calls, "server_requests": sent,
            "rate_limited_429": rate_limited, "batches": run.batches, "wall": wall,
            "reference": run.calls * (latency + sleep),
            "bound_rpm": run.calls * 60 / rpm, "bound_concurrency": run.calls * latency / concurrency,
            "bound_chain": chain * latency, "rerun_wall": rerun_wall, "rerun_calls": rerun.calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per call (realistic: 5)")
    parser.add_argument("--rpm", type=float, default=3000, help="server's requests-per-minute limit")
    parser.add_argument("--concurrency", type=int, default=64, help="engine's max concurrency")
    parser.add_argument("--reference-sleep", type=float, default=1.0,
                        help="the reference's sleep after each call, seconds (assumed)")
    parser.add_argument("--itermax", type=int, default=10)
    args = parser.parse_args(argv)
    r = asyncio.run(bench(args.events, args.latency, args.rpm, args.concurrency, args.reference_sleep,
                          args.itermax))
    bound = max(r["bound_rpm"], r["bound_concurrency"], r["bound_chain"])
    print(f"{r['events']} events -> {r['chapters']} chapters; {r['calls']} calls "
          f"({r['server_requests']} HTTP requests, {r['rate_limited_429']} answered 429), {r['batches']} engine streams")
    print(f"latency {args.latency} s, rpm {args.rpm:g}, concurrency {args.concurrency}")
    print(f"wall time            {r['wall']:9.1f} s")
    print(f"reference schedule   {r['reference']:9.1f} s  (calls x (latency + {args.reference_sleep} s sleep)), "
          f"{r['reference'] / r['wall']:.0f}x slower")
    print(f"limit-bound minimum  {bound:9.1f} s  (rpm {r['bound_rpm']:.1f} s, concurrency "
          f"{r['bound_concurrency']:.1f} s, longest event chain {r['bound_chain']:.1f} s); "
          f"wall / bound = {r['wall'] / bound:.2f}")
    print(f"rerun from cache     {r['rerun_wall']:9.1f} s  ({r['rerun_calls']} calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
