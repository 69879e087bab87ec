"""SQLite against PostgreSQL as the response cache, on one machine, against
the loopback server (which counts the calls it is paid for):

1. cold run: `tulving run` of the short book (456 questions, in-context)
   answered by the loopback server, on an empty cache: calls/s;
2. cached rerun: 10,000 distinct chat requests through the engine, all in
   the cache already: requests/s;
3. two processes: two `tulving run` of the short book started at once on one
   empty cache: calls paid (456 needed) and wall time;
4. the cost of claims: a cold run of 2,000 distinct requests through the
   engine (the loopback answering at once), claims on, then off (a store
   whose `claim` takes every key without asking the database).

Rounds are interleaved (SQLite, PostgreSQL, SQLite, ...) since the machine
may be shared; each figure is printed as the median and range of the rounds.

    python benchmarks/shared_cache.py postgresql://user:pw@127.0.0.1:5432/db [--rounds 3]

The PostgreSQL database is emptied (schema `tulving` dropped) before each case.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cache.backend import ResponseStore  # noqa: E402
from engine.config import Config  # noqa: E402
from engine.loopback.server import LoopbackServer  # noqa: E402
from engine.requests import ChatRequest  # noqa: E402
from engine.scheduler import Engine  # noqa: E402
from providers.base import Result  # noqa: E402

RERUN = 10_000
COLD = 2_000


def config_text(server: LoopbackServer) -> str:
    return (f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nmax_concurrency = 64\n\n'
            '[models.loop-reader]\nendpoint = "loop"\nmodel = "reader"\n')


async def reset(cache: str) -> None:
    if cache.startswith("postgresql"):
        import asyncpg

        conn = await asyncpg.connect(cache)
        await conn.execute("DROP SCHEMA IF EXISTS tulving CASCADE")
        await conn.close()
    else:
        for suffix in ("", "-wal", "-shm"):
            Path(cache + suffix).unlink(missing_ok=True)


async def cli_run(folder: Path, cache: str, config: Path, out: str) -> int:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "engine.cli", "--quiet", "--config", str(config), "--cache", cache, "run", "--book",
        "synaptic-echoes-short", "--models", "loop-reader", "--modes", "in-context", "--judge", "builtin:judge",
        "--out", out, cwd=folder, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode:
        raise SystemExit(f"tulving run failed: {err.decode()[-500:]}")
    return int(json.loads((folder / out / "run.json").read_text())["engine"]["calls"])


async def cold_and_two(folder: Path, cache: str) -> dict[str, float]:
    async with LoopbackServer(models=["reader"]) as server:
        config = folder / "tulving.toml"
        config.write_text(config_text(server))
        await reset(cache)
        start = time.perf_counter()
        await cli_run(folder, cache, config, "cold")
        cold = time.perf_counter() - start
        cold_calls = server.stats.requests
        await reset(cache)
        server.reset_stats()
        start = time.perf_counter()
        await asyncio.gather(cli_run(folder, cache, config, "one"), cli_run(folder, cache, config, "two"))
        return {"cold_calls": cold_calls, "cold_seconds": cold, "cold_calls_per_s": cold_calls / cold,
                "two_paid": server.stats.requests, "two_seconds": time.perf_counter() - start}


def loop_requests(server: LoopbackServer, path: Path, prefix: str, n: int) -> tuple[Config, list[ChatRequest]]:
    """A config for the loopback `server` written to `path`, and n distinct chat requests to it."""
    path.write_text(config_text(server))
    requests = [ChatRequest(model="loop-reader", messages=[{"role": "user", "content": f"{prefix} {i}"}],
                            max_tokens=16) for i in range(n)]
    return Config.load(str(path)), requests


async def rerun(folder: Path, cache: str) -> dict[str, float]:
    """Cached rerun: wall time and this process's CPU time (the gap is time
    the process waited: for the database's answers, or for a core)."""
    async with LoopbackServer(models=["reader"]) as server:
        config, requests = loop_requests(server, folder / "rerun.toml", "question", RERUN)
        await reset(cache)
        async with Engine(config, cache_path=cache) as engine:
            await engine.run(requests)
        async with Engine(config, cache_path=cache) as engine:
            waited = _time_lookups(engine)
            start, cpu = time.perf_counter(), time.process_time()
            outcomes = await engine.run(requests)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert all(o.cached for o in outcomes)
        return {"rerun_per_s": RERUN / seconds, "rerun_cpu_us": cpu / RERUN * 1e6,
                "rerun_lookup_share": 100 * waited[0] / seconds}


def _time_lookups(engine: Engine) -> list[float]:
    """Time the engine spends awaiting the cache's lookups (its `get_many`),
    summed into the list returned."""
    store = engine._cache
    assert store is not None
    waited = [0.0]
    get_many = store.get_many

    async def timed(keys: Sequence[str]) -> dict[str, Result]:
        start = time.perf_counter()
        try:
            return await get_many(keys)
        finally:
            waited[0] += time.perf_counter() - start

    store.get_many = timed  # type: ignore[method-assign]
    return waited


async def _claim_everything(self: ResponseStore, keys: Sequence[str]) -> set[str]:
    """A store without claims: every key is this process's, no round trip."""
    return set(keys)


async def cold_engine(folder: Path, cache: str, *, claims: bool) -> float:
    """Cold run through the engine (COLD distinct requests, an empty cache,
    the loopback answering at once): calls/s, with claims or without them."""
    async with LoopbackServer(models=["reader"]) as server:
        config, requests = loop_requests(server, folder / "cold.toml", "cold", COLD)
        await reset(cache)
        async with Engine(config, cache_path=cache) as engine:
            store = engine._cache
            assert store is not None
            if not claims:
                store.claim = types.MethodType(_claim_everything, store)  # type: ignore[method-assign]
            start = time.perf_counter()
            outcomes = await engine.run(requests)
            await store.flush()
            seconds = time.perf_counter() - start
        assert server.stats.requests == COLD and not any(o.cached for o in outcomes)
        return COLD / seconds


async def one_round(folder: Path, cache: str) -> dict[str, float]:
    figures = await cold_and_two(folder, cache)
    figures.update(await rerun(folder, cache))
    figures["claims_on"] = await cold_engine(folder, cache, claims=True)
    figures["claims_off"] = await cold_engine(folder, cache, claims=False)
    return figures


def summary(values: list[float], unit: str = "") -> str:
    """Median and range of a figure over the rounds."""
    if len(values) == 1:
        return f"{values[0]:,.1f}{unit}"
    return f"{statistics.median(values):,.1f}{unit} ({min(values):,.1f}-{max(values):,.1f})"


LINES = (("cold run of the short book (tulving run), calls/s", "cold_calls_per_s"),
         ("  its calls", "cold_calls"),
         (f"cached rerun of {RERUN:,} requests, requests/s", "rerun_per_s"),
         ("  CPU of the engine's process per cached request, us", "rerun_cpu_us"),
         ("  share of the wall time spent awaiting lookups, %", "rerun_lookup_share"),
         ("two tulving runs at once: calls paid (456 needed)", "two_paid"),
         ("  their wall time, s", "two_seconds"),
         (f"engine cold run of {COLD:,} requests, claims on, calls/s", "claims_on"),
         ("  the same, claims off, calls/s", "claims_off"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="a PostgreSQL URL whose database may be emptied")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (SQLite, PostgreSQL, ...)")
    args = parser.parse_args()
    rounds: dict[str, list[dict[str, float]]] = {"sqlite": [], "postgresql": []}
    with tempfile.TemporaryDirectory(prefix="tulving-bench-") as tmp:
        folder = Path(tmp)
        for i in range(args.rounds):
            for name, cache in (("sqlite", str(folder / "cache.sqlite")), ("postgresql", args.url)):
                figures = asyncio.run(one_round(folder, cache))
                rounds[name].append(figures)
                print(f"round {i + 1} {name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in figures.items()),
                      file=sys.stderr, flush=True)
    print(f"median (range) of {args.rounds} interleaved rounds | SQLite | PostgreSQL")
    for label, key in LINES:
        print(f"{label} | {summary([r[key] for r in rounds['sqlite']])} | "
              f"{summary([r[key] for r in rounds['postgresql']])}")


if __name__ == "__main__":
    main()
