"""Many models at once: 10 models over 4 endpoints with different
limits, the client configured with the limits the servers enforce; the call
phase against the limit-bound minimum, next to a simple client that paces
each endpoint by its known limits, in interleaved rounds.

    python benchmarks/many_models_bench.py [--rounds 2] [--questions 300]

Endpoints, each a loopback server in its own process (uvloop), limits
enforced over sliding windows (`--window sliding`: a second's share in any
1 s), lognormal latency (sigma 0.5), per-minute rate-limit headers:
  A  OpenAI format, RPM + TPM counting prompt + max_tokens (token-bound), 3 models
  B  OpenAI format, RPM + TPM (request-bound), 3 models
  C  Anthropic format, RPM + input TPM, 2 models
  D  local style (OpenAI format, no rate limit), a concurrency cap of 8, 2 models
300 questions per model = 3,000 calls. The requests are prebuilt RAG-sized
prompts (a question plus retrieved passages, 600-1,400 tokens) rather than
built through a RAG index: the index's embeddings would dominate the run
and are another helper's part of the issue.

The bound: the slowest endpoint's minimum, each endpoint's being the most
of calls / RPM, tokens / TPM (as its server counts them) and, for D, the sum
of its latencies / its concurrency cap. Goal: the call phase within 1.1x of
the bound, <= 1% of requests answered 429, 0 lost.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.config import Config  # noqa: E402
from engine.loopback.server import cheap_tokens  # noqa: E402
from engine.requests import ChatRequest  # noqa: E402
from engine.scheduler import Engine  # noqa: E402

MAX_TOKENS = 200
WORDS = ("memory episode chapter event location date character question answer passage retrieved "
         "context timeline witness garden harbour library museum station market festival").split()


@dataclass
class Endpoint:
    name: str
    api: str                       # "openai" or "anthropic"
    models: list[str]
    latency_ms: float
    rpm: float | None = None
    tpm: float | None = None       # prompt + max_tokens (OpenAI)
    input_tpm: float | None = None
    concurrency: int = 64
    base_url: str = ""
    root: str = ""                 # the server's root, for /loopback/stats
    proc: subprocess.Popen[str] | None = field(default=None, repr=False)

    def server_args(self) -> list[str]:
        args = ["--port", "0", "--uvloop", "--window", "sliding", "--latency", "lognormal",
                "--latency-ms", str(self.latency_ms), "--models", ",".join(self.models), "--seed", str(len(self.name))]
        for flag, value in (("--rpm", self.rpm), ("--tpm", self.tpm), ("--input-tpm", self.input_tpm)):
            if value:
                args += [flag, str(value)]
        return args

    def client_limits(self) -> dict[str, float]:
        return {k: v for k, v in (("rpm", self.rpm), ("tpm", self.tpm), ("input_tpm", self.input_tpm)) if v}


ENDPOINTS = [
    Endpoint("A", "openai", ["a1", "a2", "a3"], 300, rpm=3000, tpm=2_000_000),
    Endpoint("B", "openai", ["b1", "b2", "b3"], 300, rpm=1800, tpm=4_000_000),
    Endpoint("C", "anthropic", ["c1", "c2"], 300, rpm=1500, input_tpm=1_300_000),
    Endpoint("D", "openai", ["d1", "d2"], 350, concurrency=8),
]


def start_servers() -> None:
    for ep in ENDPOINTS:
        ep.proc = subprocess.Popen([sys.executable, "-m", "engine.loopback", *ep.server_args()], cwd=ROOT,
                                   stdout=subprocess.PIPE, text=True)
        assert ep.proc.stdout is not None
        urls = dict(ep.proc.stdout.readline().strip().partition("=")[::2] for _ in range(2))
        ep.base_url = urls["openai_base_url" if ep.api == "openai" else "anthropic_base_url"]
        ep.root = urls["openai_base_url"].removesuffix("/v1")


async def server_429s() -> dict[str, int]:
    """429s each server has answered so far."""
    async with aiohttp.ClientSession() as session:
        counts = {}
        for ep in ENDPOINTS:
            async with session.get(f"{ep.root}/loopback/stats") as resp:
                counts[ep.name] = (await resp.json())["rate_limited"]
        return counts


def stop_servers() -> None:
    for ep in ENDPOINTS:
        if ep.proc is not None:
            ep.proc.terminate()
            ep.proc.communicate(timeout=10)


def prompts(questions: int, salt: str) -> list[tuple[Endpoint, str, str]]:
    """(endpoint, model, prompt) interleaved across the models, as a run over them all sends them."""
    rng = random.Random(23)
    out = []
    for q in range(questions):
        for ep in ENDPOINTS:
            for model in ep.models:
                passages = " ".join(rng.choice(WORDS) for _ in range(rng.randint(550, 1350)))
                out.append((ep, model, f"{salt} question {q} for {model}: what happened? Passages: {passages}"))
    return out


def bound(work: list[tuple[Endpoint, str, str]]) -> dict[str, float]:
    """Each endpoint's limit-bound minimum (s), from its calls and their tokens as the server counts them."""
    mins: dict[str, float] = {}
    for ep in ENDPOINTS:
        mine = [cheap_tokens(p) for e, _, p in work if e is ep]
        floors = [len(mine) / ep.rpm * 60 if ep.rpm else 0.0]
        if ep.tpm:
            floors.append((sum(mine) + MAX_TOKENS * len(mine)) / ep.tpm * 60)
        if ep.input_tpm:
            floors.append(sum(mine) / ep.input_tpm * 60)
        if not ep.rpm:  # concurrency-capped: mean lognormal(median, 0.5) latency is median * e^(0.125)
            floors.append(len(mine) * ep.latency_ms / 1000 * 1.133 / ep.concurrency)
        mins[ep.name] = max(floors)
    return mins


async def engine_run(work: list[tuple[Endpoint, str, str]]) -> tuple[float, dict[str, list[float]], int, int]:
    """(wall, per endpoint [finish time, 429s], lost, 429s) of the engine over all the calls."""
    endpoints = {ep.name: {"kind": ep.api, "base_url": ep.base_url, "max_concurrency": ep.concurrency,
                           "timeout": 60.0, **ep.client_limits()} for ep in ENDPOINTS}
    models = {m: {"endpoint": ep.name, "model": m, "params": {"max_tokens": MAX_TOKENS, "temperature": 0.0}}
              for ep in ENDPOINTS for m in ep.models}
    requests = [ChatRequest(model=m, messages=[{"role": "user", "content": p}], tag=ep.name) for ep, m, p in work]
    finish = {ep.name: [0.0, 0.0] for ep in ENDPOINTS}
    lost = 0
    async with Engine(Config.from_dicts(endpoints, models)) as engine:
        wall = time.perf_counter()
        async for outcome in engine.stream(requests, total=len(requests)):
            lost += not outcome.ok
            finish[outcome.tag][0] = time.perf_counter() - wall
        wall = time.perf_counter() - wall
        limited = engine.stats.rate_limited
    return wall, finish, lost, limited


async def paced_run(work: list[tuple[Endpoint, str, str]]) -> tuple[float, dict[str, list[float]], int, int]:
    """The baseline: per endpoint, sends spaced by its known limits (the most of
    60/RPM and the call's tokens * 60/TPM), its concurrency cap, a 429 resent
    after its retry-after."""
    finish = {ep.name: [0.0, 0.0] for ep in ENDPOINTS}
    lost = limited = 0
    wall = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def endpoint(ep: Endpoint) -> None:
            nonlocal lost, limited
            gate, next_send = asyncio.Semaphore(ep.concurrency), time.perf_counter()

            async def call(model: str, prompt: str) -> None:
                nonlocal next_send, lost, limited
                tokens = cheap_tokens(prompt)
                spacing = max(60 / ep.rpm if ep.rpm else 0.0, (tokens + MAX_TOKENS) * 60 / ep.tpm if ep.tpm else 0.0,
                              tokens * 60 / ep.input_tpm if ep.input_tpm else 0.0)
                for _ in range(20):
                    async with gate:
                        at, next_send = max(next_send, time.perf_counter()), max(next_send, time.perf_counter()) + spacing
                        await asyncio.sleep(at - time.perf_counter())
                        status, wait = await _post(session, ep, model, prompt)
                    if status != 429:
                        lost += status != 200
                        break
                    limited += 1
                    await asyncio.sleep(wait)
                finish[ep.name][0] = time.perf_counter() - wall

            await asyncio.gather(*(call(m, p) for e, m, p in work if e is ep))

        await asyncio.gather(*(endpoint(ep) for ep in ENDPOINTS))
    return time.perf_counter() - wall, finish, lost, limited


async def _post(session: aiohttp.ClientSession, ep: Endpoint, model: str, prompt: str) -> tuple[int, float]:
    body = {"model": model, "max_tokens": MAX_TOKENS, "messages": [{"role": "user", "content": prompt}]}
    url = f"{ep.base_url}/chat/completions" if ep.api == "openai" else f"{ep.base_url}/v1/messages"
    async with session.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}) as resp:
        await resp.read()
        return resp.status, float(resp.headers.get("retry-after-ms", 1000)) / 1000


def _line(label: str, wall: float, finish: dict[str, list[float]], lost: int, limited: int, calls: int,
          mins: dict[str, float]) -> str:
    worst = max(mins.values())
    per = ", ".join(f"{n} {f[0] / mins[n]:.2f}x ({f[0]:.1f} s, {f[1]:.0f} 429s)" for n, f in finish.items())
    return (f"{label}: call phase {wall:.1f} s = {wall / worst:.2f}x the bound; 429s {limited} "
            f"({limited / calls:.1%}); lost {lost}; per endpoint (finish / its own bound): {per}")


async def main(args: argparse.Namespace) -> None:
    start_servers()
    try:
        ratios: dict[str, list[float]] = {"engine": [], "paced": []}
        for k in range(args.rounds):
            work = prompts(args.questions, f"r{k}")
            mins = bound(work)
            if k == 0:
                print(f"bound: {max(mins.values()):.1f} s (per endpoint: "
                      + ", ".join(f"{n} {s:.1f} s" for n, s in mins.items()) + f"); {len(work):,} calls", flush=True)
            for label, run in (("engine", engine_run), ("paced", paced_run)):
                before = await server_429s()
                wall, finish, lost, limited = await run([(e, m, f"{label} {p}") for e, m, p in work])
                for name, count in (await server_429s()).items():
                    finish[name][1] = count - before[name]
                ratios[label].append(wall / max(mins.values()))
                print(f"  round {k + 1} " + _line(label, wall, finish, lost, limited, len(work), mins), flush=True)
        for label, values in ratios.items():
            print(f"{label}: {statistics.median(values):.2f}x the bound [{min(values):.2f}-{max(values):.2f}] "
                  f"over {args.rounds} rounds   [goal <= 1.1x, <= 1% 429s, 0 lost]")
    finally:
        stop_servers()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--questions", type=int, default=300, help="questions per model")
    import uvloop

    uvloop.run(main(parser.parse_args()))
