"""What a memory system's model call costs through Tulving's endpoint on
loopback (engine/benchmark/memory/proxy.py), against calling the engine
directly, each figure beside its baseline measured in the same run.

    python benchmarks/memory_endpoint_bench.py [--calls 2000] [--concurrency 16] [--rounds 3]

The endpoint and the engine run in this process (on uvloop); the HTTP client
is a bare aiohttp + orjson loop in a child process (the memory system's
side), so this process's CPU (`time.process_time`, the cache's threads
included) is the endpoint's and the engine's alone. The model is
`builtin:reader`, answering in-process at once: the zero-latency case.

Cases, in interleaved rounds (this 2-core machine is shared):
- cached: the same prompts again (every call a cache hit);
- uncached: new prompts each time (every call made, and written to the cache).
Paths, each one call per `engine.run` (as the endpoint makes them):
- direct: `engine.run([ChatRequest])` from `--concurrency` tasks here;
- endpoint: POST /v1/chat/completions from the child, `--concurrency` connections;
- bare server: an aiohttp + orjson server here answering a canned completion
  to the same child (the least any HTTP endpoint costs: the floor);
- bare client: the child's own CPU per call against the endpoint.
Printed: per-call CPU of this process for each path, the endpoint's added
CPU (endpoint - direct), and the added latency of one call at a time
(concurrency 1, median). Goals (issue "memory systems as contestants"):
added latency under 1 ms; added CPU per call under the bare loop's.
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

import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.benchmark.memory.meter import PhaseMeter  # noqa: E402
from engine.benchmark.memory.proxy import ModelEndpoint, completion  # noqa: E402
from engine.config import Config  # noqa: E402
from engine.requests import ChatRequest  # noqa: E402
from engine.scheduler import Engine  # noqa: E402
from providers.base import ChatResult  # noqa: E402

MODEL = "builtin:reader"


def prompt(i: int) -> str:
    return f"Which events happened in Boston? (call {i})"


# -- the child: a bare aiohttp + orjson client ------------------------------------------------
async def client_loop(url: str, secret: str, first: int, n: int, concurrency: int) -> dict[str, object]:
    """`n` calls from `concurrency` connections; wall, CPU and each call's latency."""
    import aiohttp

    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {secret}"}
    numbers = iter(range(first, first + n))
    latencies: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def worker() -> None:
            for i in numbers:
                body = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt(i)}]})
                start = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as reply:
                    data = orjson.loads(await reply.read())
                latencies.append(time.perf_counter() - start)
                assert data["choices"][0]["message"]["content"], data

        cpu, wall = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
                "median": statistics.median(latencies)}


def child_main(argv: list[str]) -> None:
    url, secret, first, n, concurrency = argv[0], argv[1], *map(int, argv[2:5])
    import uvloop

    print(json.dumps(uvloop.run(client_loop(url, secret, first, n, concurrency))))


# -- this process: the endpoint, the direct path, the bare server ------------------------------
async def run_child(base_url: str, secret: str, first: int, n: int, concurrency: int) -> tuple[dict, float]:
    """The child's figures and this process's CPU while it ran."""
    cpu = time.process_time()
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--child", f"{base_url}/chat/completions", secret, str(first), str(n),
        str(concurrency), stdout=subprocess.PIPE, cwd=ROOT)
    out, _ = await child.communicate()
    assert child.returncode == 0, "the client child failed"
    return json.loads(out), time.process_time() - cpu


async def direct(engine: Engine, first: int, n: int, concurrency: int) -> tuple[float, float, float]:
    """(wall, CPU, median latency) of `n` one-request engine.run calls from `concurrency` tasks."""
    numbers = iter(range(first, first + n))
    latencies: list[float] = []

    async def worker() -> None:
        for i in numbers:
            start = time.perf_counter()
            outcome = (await engine.run([ChatRequest(MODEL, [{"role": "user", "content": prompt(i)}])]))[0]
            latencies.append(time.perf_counter() - start)
            assert outcome.ok, outcome.error

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - wall, time.process_time() - cpu, statistics.median(latencies)


async def bare_server() -> web.AppRunner:
    """aiohttp + orjson answering a canned completion: the floor of an HTTP endpoint."""
    canned = completion("chatcmpl-bare", MODEL, ChatResult(text="No event in the text matches this question.",
                                                           input_tokens=12, output_tokens=10))

    async def chat(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        return web.Response(body=orjson.dumps({**canned, "model": body["model"]}), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner


def spread(values: list[float], fmt: str) -> str:
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.median(values), fmt)} [{format(min(values), fmt)}-{format(max(values), fmt)}]"


class Figures:
    """Per-call figures of each (case, path), one value per round."""

    def __init__(self) -> None:
        self.cpu: dict[tuple[str, str], list[float]] = {}
        self.latency: dict[tuple[str, str], list[float]] = {}

    def add(self, case: str, path: str, cpu_us: float, latency_us: float | None = None) -> None:
        self.cpu.setdefault((case, path), []).append(cpu_us)
        if latency_us is not None:
            self.latency.setdefault((case, path), []).append(latency_us)


async def one_round(engine: Engine, endpoint: ModelEndpoint, secret: str, bare_url: str, figures: Figures,
                    n: int, concurrency: int, offset: int) -> None:
    """Every path of both cases once. Prompts 0..n-1 are in the cache; `offset` starts new ones."""
    for case, first in (("cached", 0), ("uncached", offset)):
        wall, cpu, _ = await direct(engine, first, n, concurrency)
        figures.add(case, "direct", cpu / n * 1e6)
        start = first if case == "cached" else first + n
        child, cpu = await run_child(endpoint.base_url, secret, start, n, concurrency)
        figures.add(case, "endpoint", cpu / n * 1e6)
        figures.add(case, "bare client", child["cpu"] / n * 1e6)
        child, cpu = await run_child(bare_url, "-", first, n, concurrency)
        figures.add(case, "bare server", cpu / n * 1e6)
    # One call at a time: the latency the endpoint adds to a call (cached: no model time at all).
    m = min(n, 500)
    _, _, latency = await direct(engine, 0, m, 1)
    figures.latency.setdefault(("cached", "direct"), []).append(latency * 1e6)
    child, _ = await run_child(endpoint.base_url, secret, 0, m, 1)
    figures.latency.setdefault(("cached", "endpoint"), []).append(child["median"] * 1e6)
    child, _ = await run_child(bare_url, "-", 0, m, 1)
    figures.latency.setdefault(("cached", "bare server"), []).append(child["median"] * 1e6)


def report(figures: Figures, n: int, concurrency: int, rounds: int) -> None:
    which = f"median [min-max] of {rounds} interleaved rounds" if rounds > 1 else "one round"
    print(f"Tulving's memory endpoint, {n:,} calls of {MODEL} per path and case, concurrency {concurrency}; {which}")
    for case in ("cached", "uncached"):
        cpu = {path: figures.cpu[(case, path)] for path in ("direct", "endpoint", "bare server", "bare client")}
        added = [e - d for e, d in zip(cpu["endpoint"], cpu["direct"])]
        over_bare = [a / b for a, b in zip(added, cpu["bare server"])]
        print(f"  {case}: CPU per call in this process (us): direct engine {spread(cpu['direct'], '.0f')}, "
              f"through the endpoint {spread(cpu['endpoint'], '.0f')}, bare aiohttp server {spread(cpu['bare server'], '.0f')}")
        print(f"    the endpoint adds {spread(added, '.0f')} us CPU per call = {spread(over_bare, '.2f')}x the bare "
              f"server's   [goal <= 1.0x]; the bare client (the memory system's side) spends "
              f"{spread(cpu['bare client'], '.0f')} us per call")
    lat = {path: figures.latency[("cached", path)] for path in ("direct", "endpoint", "bare server")}
    added = [e - d for e, d in zip(lat["endpoint"], lat["direct"])]
    print(f"  one call at a time (cached), median latency (us): direct {spread(lat['direct'], '.0f')}, "
          f"through the endpoint {spread(lat['endpoint'], '.0f')}, bare server {spread(lat['bare server'], '.0f')}")
    print(f"    the endpoint adds {spread(added, '.0f')} us per call   [goal < 1,000 us]")


async def main(args: argparse.Namespace) -> None:
    figures = Figures()
    with tempfile.TemporaryDirectory() as tmp:
        async with Engine(Config.load(), cache_path=os.path.join(tmp, "cache.sqlite")) as engine:
            endpoint = await ModelEndpoint(engine).start()
            secret = endpoint.grant(PhaseMeter("bench"), [MODEL])
            bare = await bare_server()
            bare_url = f"http://127.0.0.1:{bare.addresses[0][1]}/v1"
            try:
                await direct(engine, 0, args.calls, args.concurrency)  # the cached case's prompts
                await run_child(endpoint.base_url, secret, 0, min(args.calls, 500), args.concurrency)  # warm-up
                for k in range(args.rounds):
                    await one_round(engine, endpoint, secret, bare_url, figures, args.calls, args.concurrency,
                                    offset=(k + 1) * 10 * args.calls)
            finally:
                await endpoint.close()
                await bare.cleanup()
    report(figures, args.calls, args.concurrency, args.rounds)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child_main(sys.argv[2:])
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2_000, help="calls per path and case (default %(default)s)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import uvloop

    uvloop.run(main(args))
