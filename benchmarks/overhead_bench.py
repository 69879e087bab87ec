"""Where the engine's CPU goes: the figures behind README's "Where the time
goes" (after the engine benchmark's table).

    python benchmarks/overhead_bench.py [--calls 20000] [--rounds 5]

1. The engine's own work per call, with an in-process provider that answers
   at once (one event-loop step): CPU of the event-loop thread per call,
   without a cache and with one (the writer and reader threads' CPU shown
   apart), minimum and median over interleaved rounds.
2. Garbage collection while the engine (cache writes on) makes 20,000 calls
   to the loopback server at zero latency (benchmark 1 of engine_bench.py),
   with the collector's default young threshold (700) against the engine's
   (engine/gc_tuning.py): collections per generation and their time per call.
3. The cache writer's CPU per row at ~5,000 rows/s arriving in batches of 32,
   committing every 20 ms (the default) or every 100 ms.
4. The providers' HTTP client: CPU per call of `JsonHttpClient.post` over
   providers/http_pool.py (the default) and over aiohttp.ClientSession
   (`http_client = "aiohttp"`), the same chat body to the loopback server at
   concurrency 64, interleaved rounds.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # engine_bench's server process and requests

from engine_bench import ServerProcess, config_for, requests  # noqa: E402

from cache.store import ResponseCache  # noqa: E402
from engine import gc_tuning  # noqa: E402
from engine.config import Config  # noqa: E402
from engine.resolve import resolve  # noqa: E402
from engine.scheduler import Engine  # noqa: E402
from providers.base import ChatResult, Provider  # noqa: E402
from providers.http_client import JsonHttpClient  # noqa: E402
from providers.kinds import ProviderKind, registry, set_registry  # noqa: E402


class InstantProvider(Provider):
    """Answers after one event-loop step: what is left is the engine's work."""

    kind = "instant"

    async def chat(self, model, messages, *, params, timeout):
        await asyncio.sleep(0)
        return ChatResult(text="The answer is London.", finish_reason="stop", input_tokens=40,
                          output_tokens=9, latency=0.0, request_id="instant")


# The benchmark's own kind, beside the installed ones (not registered by an import).
set_registry(registry().with_kinds(ProviderKind("instant", f"{__name__}:InstantProvider", "answers at once")))
CONFIG = Config.from_dicts({"instant": {"kind": "instant", "max_concurrency": 64}},
                           {"m": {"endpoint": "instant", "model": "x",
                                  "params": {"temperature": 0.0, "max_tokens": 64}}})


async def one_run(n: int, offset: int, cache_path: str | None) -> tuple[float, float]:
    """(event-loop thread CPU, whole process CPU) per call, in microseconds."""
    async with Engine(CONFIG, cache_path=cache_path) as engine:
        thread, process = time.thread_time(), time.process_time()
        async for _ in engine.stream(requests(n, offset=offset), total=n):
            pass
        if engine._cache is not None:
            await engine._cache.flush()
        return (time.thread_time() - thread) / n * 1e6, (time.process_time() - process) / n * 1e6


async def engine_work(n: int, rounds: int, tmp: str) -> None:
    runs: dict[str, list[tuple[float, float]]] = {"no cache": [], "cache": []}
    for k in range(rounds):
        runs["no cache"].append(await one_run(n, 2 * k * n, None))
        runs["cache"].append(await one_run(n, (2 * k + 1) * n, os.path.join(tmp, f"engine{k}.sqlite")))
    print(f"1. the engine's own work, {n:,} calls to an instant in-process provider, {rounds} rounds")
    for name, values in runs.items():
        loop = [v[0] for v in values]
        other = statistics.median(v[1] for v in values) - statistics.median(loop)
        print(f"   {name:9s} event-loop thread {min(loop):5.1f} us/call min, {statistics.median(loop):5.1f} median;"
              f" other threads (cache writer, reader) {max(0.0, other):5.1f} us/call")


async def gc_cost(n: int, tmp: str) -> None:
    timings: dict[int, list[float]] = {}
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            timings.setdefault(info["generation"], []).append(time.perf_counter() - started[0])

    print(f"2. garbage collection during {n:,} zero-latency calls to the loopback server (engine with a cache)")
    saved = gc.get_threshold()
    young = gc_tuning.YOUNG_THRESHOLD
    gc.callbacks.append(callback)
    try:
        with ServerProcess() as server:
            config = config_for(server.base_url, 64)
            for label, threshold in (("default threshold (700)", 700), (f"engine's threshold ({young:,})", young)):
                gc.collect()
                async with Engine(config, cache_path=os.path.join(tmp, f"gc{threshold}.sqlite")) as engine:
                    gc.set_threshold(threshold, *saved[1:])  # over what the engine set as it opened
                    timings.clear()
                    async for outcome in engine.stream(requests(n, offset=threshold * n), total=n):
                        assert outcome.ok, outcome.error
                counts = ", ".join(f"gen{g}: {len(t):,}" for g, t in sorted(timings.items())) or "none"
                total = sum(sum(t) for t in timings.values())
                print(f"   {label:27s} collections {counts}; {total / n * 1e6:5.1f} us/call")
    finally:
        gc.callbacks.remove(callback)
        gc.set_threshold(*saved)


async def writer_cost(n: int, tmp: str) -> None:
    config = config_for("http://127.0.0.1:9/v1", 64)  # never called: only the keys and identities are used
    resolved = [resolve(config, r) for r in requests(n)]
    print(f"3. cache writer CPU per row, {n:,} rows arriving at ~5,000/s in batches of 32")
    for seconds in (0.02, 0.1):
        spent = [0.0]

        class TimedCache(ResponseCache):
            spent_box = spent  # this round's counter, bound now (not the loop variable at call time)

            def _commit(self, conn, rows):
                start = time.thread_time()
                try:
                    super()._commit(conn, rows)
                finally:
                    self.spent_box[0] += time.thread_time() - start

        async with TimedCache(os.path.join(tmp, f"writer{seconds}.sqlite"), batch_seconds=seconds) as cache:
            for i, r in enumerate(resolved):
                cache.put(r.key, r.identity, ChatResult(text=f"The answer to question {i} is London.",
                                                        finish_reason="stop", input_tokens=40, output_tokens=9,
                                                        latency=0.001, request_id=f"chatcmpl-{i:024d}"),
                          canonical=r.canonical)
                if i % 32 == 31:
                    await asyncio.sleep(32 / 5000)
            await cache.flush()
        print(f"   commits every {seconds * 1000:3.0f} ms: {spent[0] / n * 1e6:5.1f} us/row")


async def http_client_run(client: JsonHttpClient, url: str, n: int, concurrency: int) -> tuple[float, float]:
    """(calls/s, event-loop thread CPU per call in us)."""
    counter = iter(range(n))

    async def worker() -> None:
        for i in counter:
            body = {"model": "bench", "messages": [{"role": "user", "content": f"question {i}"}],
                    "temperature": 0.0, "max_tokens": 64}
            data, _headers, _latency = await client.post(url, body, 60.0)
            assert data["choices"][0]["message"]["content"]

    thread, wall = time.thread_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return n / (time.perf_counter() - wall), (time.thread_time() - thread) / n * 1e6


async def http_client_cost(n: int, rounds: int) -> None:
    runs: dict[str, list[tuple[float, float]]] = {"pool": [], "aiohttp": []}
    with ServerProcess() as server:
        url = f"{server.base_url}/chat/completions"
        clients = {name: JsonHttpClient(endpoint="bench", max_concurrency=64, headers={}, secret=None,
                                        request_id_header="x-request-id", http_client=name) for name in runs}
        try:
            for client in clients.values():  # warm up: connections open
                await http_client_run(client, url, 1000, 64)
            for _ in range(rounds):
                for name, client in clients.items():
                    runs[name].append(await http_client_run(client, url, n, 64))
        finally:
            for client in clients.values():
                await client.aclose()
    print(f"4. JsonHttpClient.post, {n:,} chat calls to the loopback server at concurrency 64, {rounds} rounds")
    for name, values in runs.items():
        cpu = [v[1] for v in values]
        print(f"   over {name:8s} event-loop thread {min(cpu):5.1f} us/call min, {statistics.median(cpu):5.1f} median;"
              f" {statistics.median(v[0] for v in values):6,.0f} calls/s median")
    ratio = statistics.median(v[1] for v in runs["aiohttp"]) / statistics.median(v[1] for v in runs["pool"])
    print(f"   aiohttp / pool CPU per call, medians: {ratio:.2f}x")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        await engine_work(args.calls, args.rounds, tmp)
        await gc_cost(args.calls, tmp)
        await writer_cost(args.calls, tmp)
        await http_client_cost(args.calls // 2, args.rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    import uvloop

    uvloop.run(main(parser.parse_args()))
