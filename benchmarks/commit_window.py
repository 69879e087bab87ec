"""How long a paid answer lives only in memory, and how many answers a kill -9 loses.

1. The window: COLD distinct chat requests through the engine on an empty
   SQLite cache, the loopback server (real HTTP, this process) answering
   each after LATENCY; for every call, the time from the reply's last byte
   (the HTTP client's read of the body returned) to the commit of its row
   (the cache writer's transaction returned), with its two parts: reply to
   `put` (parsing, pricing: the engine) and `put` to commit (the writer's
   batch: up to 512 rows or 20 ms, then the transaction). p50, p90, p99, max;
   then the same with the writer committing as soon as it wakes (no
   gathering), beside it, with both runs' calls/s.
2. The kill trials: TRIALS times, two `tulving run` of the short book (456
   questions, in-context, the built-in judge) started at once on one empty
   SQLite file; after a random number of replies (KILL_AFTER) one of them is
   killed with SIGKILL; the other finishes the run. The loopback stamps every
   answer it sends (its handler returned a 200). An answer *lost* is one
   sent before the kill and then asked for again, by the survivor: it was
   not on disk. Its age at the kill (the kill's time minus the answer's) is
   printed; calls in flight at the kill (no answer sent) are counted apart:
   they are paid twice by design (the provider billed a call whose answer
   never came).

    python benchmarks/commit_window.py [--calls 2000] [--trials 10] [--seed 1]

The loopback and this script share one clock (time.perf_counter): no skew.
"""
from __future__ import annotations

import argparse
import asyncio
import contextvars
import hashlib
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import orjson  # noqa: E402

from cache.store import ResponseCache  # noqa: E402
from engine.config import Config  # noqa: E402
from engine.loopback.server import LoopbackServer  # noqa: E402
from engine.requests import ChatRequest  # noqa: E402
from engine.scheduler import Engine  # noqa: E402
from providers.http_client import JsonHttpClient  # noqa: E402

LATENCY = 0.02  # seconds the loopback takes per answer in the window's run
KILL_AFTER = (20, 300)  # the kill comes after this many answers (uniform)
_LAST_BYTE: contextvars.ContextVar[float] = contextvars.ContextVar("last_byte")
_ORIGINAL: dict[str, Any] = {}
GATHERS = (0.02, 0.0)  # the writer's gathering time: as shipped, then none (the baseline's trade-off)


def config_text(server: LoopbackServer, concurrency: int) -> str:
    return (f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n'
            f'max_concurrency = {concurrency}\n\n[models.loop-reader]\nendpoint = "loop"\nmodel = "reader"\n')


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    if not ordered:
        return "none"

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return f"p50 {at(0.5):.1f} ms, p90 {at(0.9):.1f} ms, p99 {at(0.99):.1f} ms, max {ordered[-1] * 1000:.1f} ms"


def _instrument(puts: dict[str, tuple[float, float]], commits: dict[str, float]) -> None:
    """Stamp the last byte of each reply (in the calling task's context), each `put`, each commit."""
    post = JsonHttpClient.post

    async def timed_post(self: JsonHttpClient, *args: Any, **kwargs: Any) -> Any:
        reply = await post(self, *args, **kwargs)
        _LAST_BYTE.set(time.perf_counter())  # the body was read (and parsed: microseconds) just now
        return reply

    put = ResponseCache.put

    def timed_put(self: ResponseCache, key: str, *args: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        puts[key] = (_LAST_BYTE.get(now), now)
        put(self, key, *args, **kwargs)

    commit = ResponseCache._commit

    def timed_commit(self: ResponseCache, conn: Any, rows: list[Any]) -> None:
        commit(self, conn, rows)
        now = time.perf_counter()
        for row in rows:
            commits.setdefault(row[0], now)

    _ORIGINAL.update(post=post, put=put, commit=commit)
    JsonHttpClient.post = timed_post  # type: ignore[method-assign]
    ResponseCache.put = timed_put  # type: ignore[method-assign]
    ResponseCache._commit = timed_commit  # type: ignore[method-assign]


def _uninstrument() -> None:
    JsonHttpClient.post = _ORIGINAL["post"]  # type: ignore[method-assign]
    ResponseCache.put = _ORIGINAL["put"]  # type: ignore[method-assign]
    ResponseCache._commit = _ORIGINAL["commit"]  # type: ignore[method-assign]


async def window(folder: Path, calls: int, gather: float) -> dict[str, list[float]]:
    """The window's parts over `calls` calls, the cache writer gathering rows for up to `gather` s
    (shipped: ResponseCache's batch_seconds, 0.02); "rate": calls/s of the run, flush included."""
    puts: dict[str, tuple[float, float]] = {}
    commits: dict[str, float] = {}
    _instrument(puts, commits)
    async with LoopbackServer(models=["reader"], latency=lambda: LATENCY) as server:
        path = folder / "window.toml"
        path.write_text(config_text(server, 64))
        requests = [ChatRequest(model="loop-reader", messages=[{"role": "user", "content": f"window {gather} {i}"}],
                                max_tokens=16) for i in range(calls)]
        async with Engine(Config.load(str(path)), cache_path=str(folder / f"window-{gather}.sqlite")) as engine:
            store = engine._cache
            assert isinstance(store, ResponseCache)
            store.batch_seconds = gather
            start = time.perf_counter()
            outcomes = await engine.run(requests)
            await store.flush()
            seconds = time.perf_counter() - start
    _uninstrument()
    assert all(o.ok for o in outcomes) and len(commits) == calls, (len(commits), calls)
    return {"total": [commits[k] - last for k, (last, _) in puts.items()],
            "reply_to_put": [put - last for last, put in puts.values()],
            "put_to_commit": [commits[k] - put for k, (_, put) in puts.items()], "rate": [calls / seconds]}


def _stamp_calls(server: LoopbackServer, seen: dict[tuple[str, str], list[tuple[str, float]]]) -> None:
    """Record, by (run, prompt), each call's arrival ("asked") and its answer sent ("answered": the
    plain reply returned a 200), on this process's clock; the run is the X-Bench-Run header."""
    plain = server._plain_reply

    async def stamped(request: Any, *args: Any, **kwargs: Any) -> Any:
        body = orjson.loads(await request.read())
        key = (request.headers.get("X-Bench-Run", ""), hashlib.sha256(orjson.dumps(body.get("messages"))).hexdigest())
        seen[key].append(("asked", time.perf_counter()))
        response = await plain(request, *args, **kwargs)
        if response.status == 200:
            seen[key].append(("answered", time.perf_counter()))
        return response

    server._plain_reply = stamped  # type: ignore[method-assign]


def _start(folder: Path, server: LoopbackServer, cache: Path, run: str) -> subprocess.Popen[bytes]:
    """One `tulving run` of the short book; its calls carry the header X-Bench-Run: RUN (headers are not
    part of a request's cache key, so both runs share every key)."""
    config = folder / f"{run}.toml"
    config.write_text(config_text(server, 16).replace(
        "free = true\n", f'free = true\noptions = {{ headers = {{ "X-Bench-Run" = "{run}" }} }}\n'))
    return subprocess.Popen(
        [sys.executable, "-m", "engine.cli", "--quiet", "--config", str(config), "--cache", str(cache), "run",
         "--book", "synaptic-echoes-short", "--models", "loop-reader", "--modes", "in-context",
         "--judge", "builtin:judge", "--out", run], cwd=folder, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


async def kill_trial(folder: Path, rng: random.Random) -> Mapping[str, Any]:
    seen: dict[tuple[str, str], list[tuple[str, float]]] = defaultdict(list)
    cache = folder / "trial.sqlite"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{cache}{suffix}").unlink(missing_ok=True)
    async with LoopbackServer(models=["reader"], latency=lambda: rng.uniform(0.005, 0.05)) as server:
        _stamp_calls(server, seen)
        runs = {name: _start(folder, server, cache, name) for name in ("a", "b")}
        kill_after = rng.randint(*KILL_AFTER)

        def answers(run: str) -> int:
            return sum(1 for (r, _), events in seen.items() if r == run for e in events if e[0] == "answered")

        while answers("a") + answers("b") < kill_after and all(p.poll() is None for p in runs.values()):
            await asyncio.sleep(0.001)
        # The run making the calls (the one that claimed the keys; the other waits for its results).
        victim = max(runs, key=answers)
        survivor = "b" if victim == "a" else "a"
        if runs[victim].poll() is not None:
            raise SystemExit(f"the run to kill ended first ({runs[victim].returncode}): "
                             f"{runs[victim].communicate()[1].decode()[-500:]}")
        killed_at = time.perf_counter()
        os.kill(runs[victim].pid, signal.SIGKILL)
        runs[victim].wait()
        _, err = await asyncio.to_thread(runs[survivor].communicate)
        if runs[survivor].returncode:
            raise SystemExit(f"the surviving run failed: {err.decode()[-500:]}")
    return _verdict(seen, killed_at, victim, survivor)


def _verdict(seen: Mapping[tuple[str, str], list[tuple[str, float]]], killed_at: float, victim: str,
             survivor: str) -> Mapping[str, Any]:
    """Lost: the victim's answer sent before the kill, asked again by the survivor. In flight: the victim
    asked before the kill and had no answer by then, and the survivor asked again (paid twice by design)."""
    survivor_asked = {prompt for (run, prompt) in seen if run == survivor}
    lost_ages, in_flight, before = [], 0, 0
    for (run, prompt), events in seen.items():
        if run != victim:
            continue
        answered = [t for kind, t in events if kind == "answered" and t < killed_at]
        asked = [t for kind, t in events if kind == "asked" and t < killed_at]
        before += bool(answered)
        if prompt in survivor_asked and answered:
            lost_ages.append(killed_at - answered[0])
        elif prompt in survivor_asked and asked:
            in_flight += 1
    return {"answers_before_kill": before, "lost": len(lost_ages), "lost_ages": lost_ages,
            "in_flight_paid_twice": in_flight, "questions": len({prompt for _, prompt in seen})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000, help="calls for the window's distribution")
    parser.add_argument("--trials", type=int, default=10, help="kill -9 trials")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="tulving-bench-") as tmp:
        folder = Path(tmp)
        trials = []
        for i in range(args.trials):
            trial = asyncio.run(kill_trial(folder, rng))
            trials.append(trial)
            ages = ", ".join(f"{a * 1000:.1f} ms" for a in sorted(trial["lost_ages"])) or "-"
            print(f"trial {i + 1}: the killed run had {trial['answers_before_kill']} answers, {trial['lost']} lost "
                  f"(their age at the kill: {ages}), {trial['in_flight_paid_twice']} in flight (paid twice); "
                  f"{trial['questions']} questions", flush=True)
        windows = {gather: asyncio.run(window(folder, args.calls, gather)) for gather in GATHERS}
    for gather, parts in windows.items():
        print(f"\nwindow over {args.calls:,} calls (loopback answering after {LATENCY * 1000:.0f} ms, 64 at a "
              f"time), the cache writer gathering rows for up to {gather * 1000:.0f} ms"
              f"{' (as shipped)' if gather == GATHERS[0] else ''}: {parts['rate'][0]:,.0f} calls/s")
        print(f"  last byte of the reply -> row committed: {percentiles(parts['total'])}")
        print(f"    last byte -> put (the engine):         {percentiles(parts['reply_to_put'])}")
        print(f"    put -> committed (the writer):         {percentiles(parts['put_to_commit'])}")
    lost = sum(t["lost"] for t in trials)
    before = sum(t["answers_before_kill"] for t in trials)
    ages = sorted(a for t in trials for a in t["lost_ages"])
    print(f"kill -9 of one of two runs on one SQLite file, {args.trials} trials: {lost} answers lost of {before} "
          f"the killed runs had ({100 * lost / max(before, 1):.1f}%); "
          f"their age at the kill: {percentiles(ages)}; mean in flight (paid twice by design) "
          f"{statistics.mean(t['in_flight_paid_twice'] for t in trials):.1f} a trial")


if __name__ == "__main__":
    main()
