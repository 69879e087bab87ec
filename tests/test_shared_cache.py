"""One cache shared by real `tulving run` processes (a SQLite file, and a
PostgreSQL database) against the loopback server, which counts the calls it
is paid for: two runs at once pay each call once; the calls of a process
killed with SIGKILL are made by the next run (on PostgreSQL its claims are
taken over at their lease's end; on SQLite the killed run was alone on the
file, claimed in memory, and its session is dropped at once: cache/sessions.py); shards meet in the
database; a bad URL is one line; the password never shows."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from cache.location import split_password
from engine.benchmark.evaluation.questions import write_questions
from engine.loopback.server import LoopbackServer
from tests.report_runs import copied_run, offline_run, tulving
from tests.test_run_cli import env
from tests.test_shards import _scores

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["reader"]

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = 30

def loop_config(tmp_path: Path, server: LoopbackServer) -> Path:
    path = tmp_path / "tulving.toml"
    path.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n\n'
                    '[models.loop-reader]\nendpoint = "loop"\nmodel = "reader"\n')
    return path


async def start(tmp_path: Path, cache: str, config: Path, out: str, *extra: str,
                environ: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "engine.cli", "--quiet", "--config", str(config), "--cache", cache, "run",
        "--questions", "q.jsonl", "--models", "loop-reader", "--modes", "in-context", "--judge", "builtin:judge",
        "--out", out, *extra, cwd=tmp_path, env={**env(), **(environ or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def run(tmp_path: Path, cache: str, config: Path, out: str, *extra: str,
              environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await start(tmp_path, cache, config, out, *extra, environ=environ)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode is not None
    return proc.returncode, stdout.decode(), stderr.decode()


@pytest.fixture
def questions(tmp_path, short_questions):
    write_questions(tmp_path / "q.jsonl", short_questions[:QUESTIONS])
    return tmp_path / "q.jsonl"


def _calls(tmp_path: Path, out: str) -> int:
    return int(json.loads((tmp_path / out / "run.json").read_text())["engine"]["calls"])


async def _two_runs_at_once_pay_each_call_once(tmp_path: Path, cache: str) -> None:
    async with LoopbackServer(models=SERVED, latency=lambda: 0.05) as server:
        config = loop_config(tmp_path, server)
        (a, _, err_a), (b, _, err_b) = await asyncio.gather(run(tmp_path, cache, config, "a"),
                                                            run(tmp_path, cache, config, "b"))
        assert a == 0 and b == 0, err_a + err_b
        assert server.stats.requests == QUESTIONS  # was 59 of 30 before claims
        code, _, err = await run(tmp_path, cache, config, "c")
        assert code == 0, err
        assert server.stats.requests == QUESTIONS and _calls(tmp_path, "c") == 0
    assert (tmp_path / "a" / "results.jsonl").read_text() == (tmp_path / "b" / "results.jsonl").read_text()


async def test_two_runs_at_once_on_one_sqlite_file_pay_each_call_once(tmp_path, questions):
    await _two_runs_at_once_pay_each_call_once(tmp_path, "shared.sqlite")


async def test_two_runs_at_once_on_one_postgresql_cache_pay_each_call_once(tmp_path, questions, pg_url):
    await _two_runs_at_once_pay_each_call_once(tmp_path, pg_url)


async def _a_killed_runs_claims_are_taken_over(tmp_path: Path, cache: str) -> None:
    lease = {"TULVING_CACHE_LEASE": "2"}
    stuck = [True]  # the server answers nobody until the first run is killed
    async with LoopbackServer(models=SERVED, latency=lambda: 3600.0 if stuck[0] else 0.0) as server:
        config = loop_config(tmp_path, server)
        doomed = await start(tmp_path, cache, config, "doomed", environ=lease)
        try:
            for _ in range(1200):  # its calls are sent, so their keys are claimed
                if server.stats.requests:
                    break
                await asyncio.sleep(0.1)
            assert server.stats.requests > 0
            doomed.send_signal(signal.SIGKILL)
            await doomed.wait()
        finally:
            if doomed.returncode is None:
                doomed.kill()
                await doomed.wait()
        stuck[0] = False
        server.reset_stats()
        code, _, err = await run(tmp_path, cache, config, "after", environ=lease)
        assert code == 0, err
        assert server.stats.requests == QUESTIONS  # each call made once, the killed run's after its lease


async def test_a_sigkilled_processes_claims_are_taken_over_sqlite(tmp_path, questions):
    await _a_killed_runs_claims_are_taken_over(tmp_path, str(tmp_path / "held.sqlite"))


async def test_a_sigkilled_processes_claims_are_taken_over_postgresql(tmp_path, questions, pg_url):
    await _a_killed_runs_claims_are_taken_over(tmp_path, pg_url)


def test_a_postgresql_url_is_never_a_folder_and_a_bad_one_is_one_line(tmp_path):
    result = tulving(tmp_path, "--cache", "postgresql://someone:hunter2@127.0.0.1:1/tulving", "run", "--book",
                     "synaptic-echoes-short", "--models", "builtin:reader", "--modes", "in-context",
                     "--judge", "builtin:judge", "--out", "out")
    assert result.returncode != 0
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("tulving: error: cannot open the cache database postgresql://someone@127.0.0.1:1/tulving")
    assert "hunter2" not in result.stderr + result.stdout
    assert not (tmp_path / "postgresql:").exists() and not (tmp_path / "out" / "results.jsonl").exists()


def test_shards_meet_in_the_database_and_the_password_never_shows(tmp_path, pg_url, offline_short_run):
    password = split_password(pg_url)[1]
    assert password
    whole = copied_run(offline_short_run, tmp_path, "whole")  # the unsplit run (conftest.py: made once)
    for i in (1, 2, 3):
        offline_run(tmp_path, f"shard{i}", "--shard", f"{i}/3", cache=pg_url)
    rerun = offline_run(tmp_path, "rerun", cache=pg_url)
    assert json.loads((rerun / "run.json").read_text())["engine"]["calls"] == 0
    result = tulving(tmp_path, "report", "shard1", "shard2", "shard3", "--out", "report-3", "--no-figures")
    assert result.returncode == 0, result.stderr
    assert _scores(tmp_path / "report-3" / "scores.json") == _scores(whole / "scores.json")
    assert _scores(rerun / "scores.json") == _scores(whole / "scores.json")
    for folder in ("shard1", "shard2", "shard3", "rerun", "report-3"):
        for path in (tmp_path / folder).rglob("*"):
            if path.is_file():
                assert password.encode() not in path.read_bytes(), path
    assert not any(p.name.startswith("postgresql") for p in tmp_path.iterdir())
    assert os.environ.get("PGPASSWORD") != password  # the test process itself was never told
