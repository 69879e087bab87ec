"""How close `tulving bench`'s measured TTFT and inter-token gaps come to the
waits the server actually drew, beside a bare client measuring the same.

    python benchmarks/bench_accuracy.py [-n 120] [--latency lognormal|uniform|constant]

The loopback server runs in its own process and draws each stream's time to
first token and token gaps from seeded generators (engine/loopback/cli.py:
seed 0 for TTFT, 1 for the gaps), so this script draws the very same values.
One request at a time: the i-th request meets the i-th draws. Printed per
percentile: the drawn value, what `tulving bench` measured and its excess,
and what a bare aiohttp streaming loop measured against a fresh server with
the same seeds (the baseline of the same run: the network, the event loops
and the machine's load, without the engine). The tests check only that no
measurement falls below its draw (tests/test_bench.py); these figures are how
far above it they land.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.loopback.server import constant, lognormal, uniform  # noqa: E402

TTFT_MS, GAP_MS, OUTPUT_TOKENS = 40.0, 10.0, 6


class Server:
    """`python -m engine.loopback` with the script's latencies, in its own process."""

    def __init__(self, latency: str):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine.loopback", "--models", "m-model", "--ttft-ms", str(TTFT_MS),
             "--token-delay-ms", str(GAP_MS), "--latency", latency], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip().partition("=")[2]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def draws(latency: str, n: int) -> tuple[list[float], list[float]]:
    """The server's first n TTFTs and n * (OUTPUT_TOKENS - 1) gaps, drawn as it draws them."""
    make = {"lognormal": lambda median, seed: lognormal(median, 0.5, seed),
            "uniform": lambda median, seed: uniform(0.0, 2 * median, seed),
            "constant": lambda median, seed: constant(median)}[latency]
    ttft, gap = make(TTFT_MS / 1000, 0), make(GAP_MS / 1000, 1)
    return [ttft() for _ in range(n)], [gap() for _ in range(n * (OUTPUT_TOKENS - 1))]


def bench_run(url: str, n: int, folder: Path) -> tuple[list[float], list[float]]:
    config = folder / "c.toml"
    config.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{url}"\n\n'
                      '[models.m]\nendpoint = "loop"\nmodel = "m-model"\n')
    out = folder / "bench.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TULVING")}
    subprocess.run([sys.executable, "-m", "engine.cli", "--config", str(config), "--quiet", "bench", "--models", "m",
                    "-n", str(n), "--max-concurrency", "1", "--warmup", "0", "--output-tokens", str(OUTPUT_TOKENS),
                    "--json", str(out), "--per-request"], cwd=ROOT, env=env, check=True, capture_output=True)
    rows = sorted(json.loads(out.read_text())["runs"][0]["requests"], key=lambda r: r["index"])
    return [r["ttft"] for r in rows], [gap for r in rows for gap in r.get("itl") or []]


async def bare_run(url: str, n: int) -> tuple[list[float], list[float]]:
    """The same calls from a bare aiohttp loop: TTFT to the first content chunk, then the gaps."""
    body = {"model": "m-model", "messages": [{"role": "user", "content": "latency probe " * 64}],
            "max_tokens": OUTPUT_TOKENS, "stream": True}
    ttfts: list[float] = []
    gaps: list[float] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            sent = time.perf_counter()
            times = []
            async with session.post(url + "/chat/completions", json=body) as reply:
                async for line in reply.content:
                    if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
                        times.append(time.perf_counter())
            ttfts.append(times[0] - sent)
            gaps += [b - a for a, b in zip(times, times[1:])]
    return ttfts, gaps


def row(name: str, p: float, drawn: list[float], bench: list[float], bare: list[float]) -> str:
    d, b, r = (float(np.percentile(x, p)) * 1000 for x in (drawn, bench, bare))
    return f"{name:5} p{p:<3g} {d:9.2f} {b:9.2f} {b - d:+8.2f} {r:9.2f} {r - d:+8.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=120)
    parser.add_argument("--latency", default="lognormal", choices=["lognormal", "uniform", "constant"])
    args = parser.parse_args()
    drawn_ttft, drawn_gaps = draws(args.latency, args.n)
    with tempfile.TemporaryDirectory() as folder:
        server = Server(args.latency)
        try:
            bench_ttft, bench_gaps = bench_run(server.url, args.n, Path(folder))
        finally:
            server.stop()
    server = Server(args.latency)  # fresh draws for the baseline
    try:
        bare_ttft, bare_gaps = asyncio.run(bare_run(server.url, args.n))
    finally:
        server.stop()
    print(f"{args.n} requests one at a time, {args.latency} TTFT median {TTFT_MS:g} ms, gaps {GAP_MS:g} ms, "
          f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores\n")
    print(f"{'':10} {'drawn ms':>9} {'bench ms':>9} {'excess':>8} {'bare ms':>9} {'excess':>8}")
    for p in (10, 50, 90, 99):
        print(row("TTFT", p, drawn_ttft, bench_ttft, bare_ttft))
    for p in (10, 50, 90, 99):
        print(row("ITL", p, drawn_gaps, bench_gaps, bare_gaps))


if __name__ == "__main__":
    main()
