"""Time, lost results and paid duplicates of engine runs under injected faults,
each against a fault-free baseline measured in the same run.

    python benchmarks/fault_bench.py                 # every fault kind, 120 calls each
    python benchmarks/fault_bench.py --kinds 429,429-none --calls 120 --rpm 600

Each run sends `--calls` distinct chat requests through the engine (no cache)
to tests/fault_server.py, which answers a share `--rate` (default 30%) of the
replies with the fault; retries get fresh draws. Printed per fault kind: wall
time, its ratio to the fault-free run, calls lost (no result), paid duplicates
(prompts the server answered well more than once) and 429s whose wait was capped.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fault_server import KINDS, FaultServer  # noqa: E402

from engine.config import Config  # noqa: E402
from engine.requests import ChatRequest  # noqa: E402
from engine.scheduler import Engine  # noqa: E402

DEFAULT_KINDS = ["429", "429-ms", "429-reset", "429-none", "429-huge", "500", "503", "529", "str-tokens",
                 "null-content", "list-content", "empty-content", "html-200", "truncated"]


async def one_run(kind: str | None, args: argparse.Namespace) -> dict:
    faults = {kind: args.rate} if kind else {}
    with FaultServer(faults, seed=args.seed, latency=args.latency) as server:
        endpoint = {"kind": "openai", "base_url": server.openai_base_url, "max_concurrency": args.concurrency,
                    "timeout": 10.0, "max_attempts": 6,
                    "max_retry_after": args.max_retry_after}
        if args.rpm:
            endpoint["rpm"] = args.rpm
        config = Config.from_dicts({"fault": endpoint}, {"m": {"endpoint": "fault", "model": "m",
                                                               "params": {"temperature": 0.0, "max_tokens": 8}}})
        requests = [ChatRequest(model="m", messages=[{"role": "user", "content": f"q {args.seed} {i}"}])
                    for i in range(args.calls)]
        start = time.perf_counter()
        async with Engine(config, cache_path=None) as engine:
            outcomes = await engine.run(requests)
        wall = time.perf_counter() - start
        return {"wall": wall, "lost": sum(not o.ok for o in outcomes), "duplicates": server.stats.paid_duplicates,
                "faults": sum(n for k, n in server.stats.by_kind.items() if k != "ok"),
                "capped": engine.stats.retry_after_capped}


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default=",".join(DEFAULT_KINDS), help="comma-separated fault kinds")
    parser.add_argument("--calls", type=int, default=120)
    parser.add_argument("--rate", type=float, default=0.3, help="share of replies that are the fault")
    parser.add_argument("--latency", type=float, default=0.25, help="server latency per reply, seconds")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rpm", type=float, default=None, help="endpoint rpm set in the config")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-retry-after", type=float, default=5.0,
                        help="the endpoint's cap on a server's retry-after (default %(default)s s; the "
                             "engine's default is 60 s)")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    for k in kinds:
        if k not in KINDS:
            parser.error(f"unknown kind {k!r} (known: {', '.join(KINDS)})")
    base = await one_run(None, args)
    print(f"fault-free: {args.calls} calls in {base['wall']:.2f} s (lost {base['lost']})")
    print(f"{'fault':<14} {'faults':>6} {'wall s':>7} {'x base':>7} {'lost':>5} {'dup paid':>8} {'capped':>6}")
    for kind in kinds:
        r = await one_run(kind, args)
        print(f"{kind:<14} {r['faults']:>6} {r['wall']:>7.2f} {r['wall'] / base['wall']:>7.2f} {r['lost']:>5} "
              f"{r['duplicates']:>8} {r['capped']:>6}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
