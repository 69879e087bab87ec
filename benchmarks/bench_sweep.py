"""How far `tulving bench` can be trusted on this machine: a rate sweep against
the loopback server with a known time to first token.

    python benchmarks/bench_sweep.py                       # rates 10,30,100,300,1000/s, 3 s each
    python benchmarks/bench_sweep.py --rates 10,100 --duration 2 --ttft-ms 50 --token-delay-ms 5

The loopback server runs in its own process (`python -m engine.loopback
--ttft-ms 50 --token-delay-ms 5`, constant delays) and `tulving bench --sweep
rate=...` runs as a user would, in another, writing its JSON. Printed per
rate: requests, achieved request rate, measured TTFT (median, p99) and its
distance from the configured one, the time to the reply's first byte (the
server sends its headers before it waits) and the median of TTFT - TTFB (the
server's wait and the first chunk's delivery), ITL median, the client's CPU per request and
share of a core (and its CPU per request net of what it spends idle: the lag
probe and timers, which dominate at low rates), and its event-loop lag; then the highest rate at which the
median TTFT stays within --tolerance-ms (default 1 ms) of the configured one.
First, as the floor this machine and server allow, a bare aiohttp streaming
client (no engine) sends Poisson requests at --baseline-rate for --duration
seconds in this process; the rates whose median TTFT stays within the
tolerance of that floor are printed too.
The figure (`--out`, default benchmarks/bench_sweep.png) draws the measured
TTFT against the rate beside the client's cost. The machine's load average is
printed before and after: on shared cores the figures move with it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TULVING")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="10,30,100,300,1000")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds of arrivals per rate")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--token-delay-ms", type=float, default=5.0)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--tolerance-ms", type=float, default=1.0)
    parser.add_argument("--server-uvloop", action="store_true", help="run the loopback server on uvloop")
    parser.add_argument("--baseline-rate", type=float, default=30.0,
                        help="rate of the bare aiohttp client measured first (0: none)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "bench_sweep.png"))
    args = parser.parse_args()

    load_before = os.getloadavg()[0]
    server = subprocess.Popen([sys.executable, "-m", "engine.loopback", "--ttft-ms", str(args.ttft_ms),
                               "--token-delay-ms", str(args.token_delay_ms), "--models", "loop-model", *(["--uvloop"] if args.server_uvloop else [])],
                              cwd=ROOT, env=_env(),
                              stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip().partition("=")[2]
        baseline = uvloop.run(_raw_client(url, args)) if args.baseline_rate > 0 else None
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "loop.toml"
            config.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{url}"\nmax_concurrency = 4096\n'
                              f'timeout = 60\n\n[models.loop]\nendpoint = "loop"\nmodel = "loop-model"\n')
            out = Path(tmp) / "sweep.json"
            started, server_cpu0 = time.perf_counter(), _cpu_of(server.pid)
            run = subprocess.run([sys.executable, "-m", "engine.cli", "--config", str(config), "--quiet", "bench",
                                  "--models", "loop", "--sweep", f"rate={args.rates}", "--duration",
                                  str(args.duration), "--warmup", str(args.warmup), "--output-tokens",
                                  str(args.output_tokens), "--input-tokens", "64", "--json", str(out), "--per-request"],
                                 cwd=ROOT, env=_env(), capture_output=True, text=True)
            wall, server_cpu = time.perf_counter() - started, _cpu_of(server.pid) - server_cpu0
            if run.returncode != 0:
                print(run.stdout, run.stderr, file=sys.stderr)
                return 1
            doc = json.loads(out.read_text())
    finally:
        server.terminate()
        server.wait(10)
    load_after = os.getloadavg()[0]

    print(f"loopback: TTFT {args.ttft_ms:g} ms, token gap {args.token_delay_ms:g} ms (constant); "
          f"{args.duration:g} s of Poisson arrivals per rate; {wall:.1f} s in all; "
          f"load average {load_before:.2f} before, {load_after:.2f} after, {os.cpu_count()} cores")
    head = ("rate/s", "requests", "achieved/s", "TTFT med ms", "TTFT p99 ms", "med - set ms", "TTFB med ms",
            "TTFT-TTFB med ms", "ITL med ms", "CPU µs/req", "net µs/req", "CPU % core", "lag p99 ms")
    rows = [head]
    trusted = None
    points = []
    for r in doc["runs"]:
        s, c = r["summary"], r["client"]
        ttft = s["ttft"] or {}
        median = ttft.get("median", float("nan")) * 1000
        off = median - args.ttft_ms
        core = c["cpu_seconds"] / s["duration"] if s["duration"] else float("nan")
        points.append((r["load"]["rate"], median, ttft.get("percentiles", {}).get("p99", float("nan")) * 1000,
                       c["cpu_us_per_request"], 100 * core, c["loop_lag_p99_ms"], c["net_cpu_us_per_request"]))
        if abs(off) <= args.tolerance_ms:
            trusted = r["load"]["rate"]
        after_first_byte = [q["ttft"] - q["ttfb"] for q in r["requests"] if q["ttft"] is not None and q["ttfb"]]
        rows.append((f"{r['load']['rate']:g}", str(s["requests"]), f"{s['request_throughput']:.1f}", f"{median:.2f}",
                     f"{points[-1][2]:.2f}", f"{off:+.2f}", f"{(s['ttfb'] or {}).get('median', float('nan')) * 1000:.2f}",
                     f"{statistics.median(after_first_byte) * 1000:.2f}" if after_first_byte else "-",
                     f"{(s['itl'] or {}).get('median', float('nan')) * 1000:.2f}",
                     f"{c['cpu_us_per_request']:.0f}", f"{c['net_cpu_us_per_request']:.0f}", f"{100 * core:.1f}",
                     f"{c['loop_lag_p99_ms']:.2f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        print("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    print(f"highest rate with median TTFT within {args.tolerance_ms:g} ms of {args.ttft_ms:g} ms: "
          f"{trusted:g}/s" if trusted is not None else "no rate kept the median TTFT within the tolerance")
    sent = sum(r["summary"]["requests"] for r in doc["runs"])
    print(f"loopback server's CPU over the sweep: {server_cpu:.1f} s, {server_cpu / sent * 1e6:.0f} µs per request "
          f"(warm-ups left out of the count)")
    if baseline is not None:
        b_med, b_p99, b_cpu, b_n = baseline
        near = [p[0] for p in points if abs(p[1] - b_med) <= args.tolerance_ms]
        print(f"baseline, a bare aiohttp streaming client in this process at {args.baseline_rate:g}/s: {b_n} requests, "
              f"TTFT median {b_med:.2f} ms ({b_med - args.ttft_ms:+.2f}), p99 {b_p99:.2f} ms, CPU {b_cpu:.0f} µs/request")
        print(f"rates whose median TTFT is within {args.tolerance_ms:g} ms of the bare client's: "
              f"{', '.join(f'{r:g}' for r in near) or 'none'}")
    args.load = (load_before + load_after) / 2
    _plot(Path(args.out), points, args, baseline)
    print(f"figure: {args.out}")
    return 0


def _cpu_of(pid: int) -> float:
    """A process's CPU seconds (user + system) from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _raw_client(url: str, args: argparse.Namespace) -> tuple[float, float, float, int]:
    """The floor on this machine and server: Poisson requests from a bare
    aiohttp client (no engine), TTFT to the first chunk carrying content.
    Returns (median ms, p99 ms, CPU µs per request, requests)."""
    import aiohttp
    import numpy as np
    import orjson

    rng = np.random.default_rng(0)
    times, ttfts = [0.0], []
    while times[-1] < args.duration:
        times.append(times[-1] + rng.exponential(1 / args.baseline_rate))

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        body = {"model": "loop-model", "max_tokens": args.output_tokens, "stream": True,
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": f"Baseline {i}: " + "word " * 60}]}
        t0 = time.perf_counter()
        async with session.post(url + "/chat/completions", data=orjson.dumps(body),
                                headers={"Content-Type": "application/json"}) as reply:
            first = None
            async for line in reply.content:
                if first is None and line.startswith(b"data: {"):
                    choices = orjson.loads(line[6:]).get("choices") or [{}]
                    if choices[0].get("delta", {}).get("content"):
                        first = time.perf_counter() - t0
            if first is not None:
                ttfts.append(first)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, -i) for i in range(1, 6)))  # connections and first-use costs
        ttfts.clear()
        cpu0, start, tasks = time.process_time(), time.perf_counter(), []
        for i, t in enumerate(times[:-1]):
            wait = start + t - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(session, i)))
        await asyncio.gather(*tasks)
        cpu = time.process_time() - cpu0
    a = np.asarray(ttfts) * 1000
    return float(np.median(a)), float(np.percentile(a, 99)), cpu / len(tasks) * 1e6, len(tasks)


def _plot(path: Path, points: list[tuple], args: argparse.Namespace,
          baseline: tuple[float, float, float, int] | None) -> None:
    """Left: how far the measured TTFT is above the configured one (median and
    p99, log scale, the tolerance as a line); right: the client's CPU per
    request (raw and net of idle) and its event-loop lag."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    rates = [p[0] for p in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    floor = 0.01  # ms: a log axis has no zero
    left.plot(rates, [max(floor, p[1] - args.ttft_ms) for p in points], "o-", label="median")
    left.plot(rates, [max(floor, p[2] - args.ttft_ms) for p in points], "s--", label="p99")
    left.axhline(args.tolerance_ms, color="grey", lw=1, ls=":", label=f"{args.tolerance_ms:g} ms")
    if baseline is not None:
        left.plot([args.baseline_rate], [max(floor, baseline[0] - args.ttft_ms)], "kD",
                  label="bare aiohttp client, median")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("offered rate (requests/s, Poisson)")
    left.set_ylabel(f"measured TTFT - configured {args.ttft_ms:g} ms (ms)")
    left.legend(fontsize=8, loc="upper left")
    left.grid(alpha=0.3, which="both")
    right.plot(rates, [p[3] for p in points], "o-", color="C2", label="CPU µs / request")
    right.plot(rates, [p[6] for p in points], "o:", color="C2", alpha=0.6, label="... net of idle")
    right.set_xscale("log")
    right.set_xlabel("offered rate (requests/s, Poisson)")
    right.set_ylabel("client CPU µs per request")
    right.set_ylim(bottom=0)
    twin = right.twinx()
    twin.plot(rates, [p[5] for p in points], "s--", color="C3", label="event-loop lag p99 (ms)")
    twin.set_yscale("log")
    for axis in (left.yaxis, twin.yaxis):  # 0.1, 1, 10, 100 rather than powers of ten
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    twin.set_ylabel("event-loop lag p99 (ms)")
    right.grid(alpha=0.3)
    handles = right.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    right.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="upper center")
    fig.suptitle(f"tulving bench vs the loopback server (TTFT {args.ttft_ms:g} ms, token gap "
                 f"{args.token_delay_ms:g} ms; 2 shared cores, load average {args.load:.1f})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
