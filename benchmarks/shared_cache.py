"""SQLite against PostgreSQL as the response cache, on one machine, against
the loopback server (which counts the calls it is paid for):

1. cold run: `tulving run` of the short book (456 questions, in-context)
   answered by the loopback server, on an empty cache: calls/s;
2. cached rerun: 10,000 distinct chat requests through the engine, all in
   the cache already: requests/s;
3. two processes: two `tulving run` of the short book started at once on one
   empty cache: calls paid (456 needed) and wall time.

    python benchmarks/shared_cache.py postgresql://user:pw@127.0.0.1:5432/db

The PostgreSQL database is emptied (schema `tulving` dropped) before each case.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.config import Config  # noqa: E402
from engine.loopback.server import LoopbackServer  # noqa: E402
from engine.requests import ChatRequest  # noqa: E402
from engine.scheduler import Engine  # noqa: E402

RERUN = 10_000


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


async def rerun(folder: Path, cache: str) -> dict[str, float]:
    async with LoopbackServer(models=["reader"]) as server:
        path = folder / "rerun.toml"
        path.write_text(config_text(server))
        config = Config.load(str(path))
        requests = [ChatRequest(model="loop-reader", messages=[{"role": "user", "content": f"question {i}"}],
                                max_tokens=16) for i in range(RERUN)]
        await reset(cache)
        async with Engine(config, cache_path=cache) as engine:
            await engine.run(requests)
        async with Engine(config, cache_path=cache) as engine:
            start = time.perf_counter()
            outcomes = await engine.run(requests)
            seconds = time.perf_counter() - start
        assert all(o.cached for o in outcomes)
        return {"rerun_seconds": seconds, "rerun_per_s": RERUN / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="a PostgreSQL URL whose database may be emptied")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tulving-bench-") as tmp:
        folder = Path(tmp)
        for name, cache in (("sqlite", str(folder / "cache.sqlite")), ("postgresql", args.url)):
            figures = asyncio.run(cold_and_two(folder, cache))
            figures.update(asyncio.run(rerun(folder, cache)))
            print(f"{name:10s} cold run: {figures['cold_calls']:.0f} calls in {figures['cold_seconds']:.1f} s "
                  f"({figures['cold_calls_per_s']:.0f} calls/s) | cached rerun of {RERUN:,}: "
                  f"{figures['rerun_per_s']:,.0f} requests/s | two runs at once: {figures['two_paid']:.0f} calls "
                  f"paid (456 needed), {figures['two_seconds']:.1f} s", flush=True)


if __name__ == "__main__":
    main()
