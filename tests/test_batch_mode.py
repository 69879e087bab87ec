"""`--batch`: chat calls through the OpenAI Batch API and Anthropic Message
Batches, end to end: the CLI as a subprocess against the loopback server in
another process (`python -m engine.loopback --batch-polls N ...`), real HTTP,
the real cache file; the engine in-process for the finer cases."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.batching import SIZE_MARGIN
from engine.benchmark.evaluation.results import load_results
from engine.config import Config
from engine.loopback.batches import BatchKnobs
from engine.loopback.server import LoopbackServer
from engine.requests import ChatRequest
from engine.retry import RetryPolicy
from engine.scheduler import Engine
from providers.base import ChatResult
from providers.kinds import batch_api_for
from tests import cli

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["reader-model", "judge-model", "test-model", "model-a", "model-b", "embedder"]

REPO = Path(__file__).resolve().parents[1]
FAST_RETRY = RetryPolicy(base=0.01, cap=0.05)


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("TULVING_CONFIG", None)
    e.pop("TULVING_CACHE", None)
    return e


class Server:
    """The loopback server in its own process."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "engine.loopback", "--models", ",".join(SERVED), *args],
                                     env=env(),
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.openai = self.proc.stdout.readline().strip().split("=", 1)[1]
        self.anthropic = self.proc.stdout.readline().strip().split("=", 1)[1]

    def get(self, url: str) -> dict:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.loads(reply.read())

    def stats(self) -> dict:
        return self.get(self.anthropic + "/loopback/stats")

    def openai_batches(self) -> list[dict]:
        return self.get(self.openai + "/batches?limit=100")["data"]

    def batches(self, kind: str) -> list[dict]:
        """The batches created on the server, newest first."""
        if kind == "openai":
            return self.openai_batches()
        request = urllib.request.Request(self.anthropic + "/v1/messages/batches?limit=100",
                                         headers={"anthropic-version": "2023-06-01"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            return json.loads(reply.read())["data"]

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=10)


@pytest.fixture
def server_factory() -> Iterator:
    servers: list[Server] = []

    def make(*args: str) -> Server:
        servers.append(Server(*args))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def write_config(tmp_path: Path, server: Server, *, kind: str = "openai", **options: object) -> Path:
    url = server.openai if kind == "openai" else server.anthropic
    # These calls send temperature 0: on Anthropic, the version that still takes it (2026-10-21 does not).
    version = {"anthropic_version": "2023-06-01"} if kind == "anthropic" else {}
    opts = ", ".join(f"{k} = {json.dumps(v)}" for k, v in {"batch_poll": 0.02, "batch_poll_max": 0.05,
                                                             **version, **options}.items())
    path = tmp_path / "tulving.toml"
    path.write_text(f'[endpoints.lb]\nkind = "{kind}"\nbase_url = "{url}"\nfree = true\nmax_attempts = 3\n'
                    f'options = {{ {opts} }}\n\n'
                    '[models.lb-reader]\nendpoints = ["lb"]\nmodel = "reader-model"\n'
                    'params = { temperature = 0.0, max_tokens = 32 }\n')
    return path


def tulving(tmp_path: Path, *args: str) -> cli.Done:
    """The command in this process (tests/cli.py); the runs killed below are real processes."""
    return cli.tulving(tmp_path, "--quiet", "--config", "tulving.toml", "--cache", "cache.sqlite", *args, env=env())


RUN = ["run", "--book", "synaptic-echoes-short", "--models", "lb-reader", "--modes", "in-context",
       "--judge", "builtin:judge"]


def scores(out: Path) -> dict:
    data = json.loads((out / "scores.json").read_text())
    for run in data["runs"]:
        run.pop("wall_seconds")
    data.pop("provenance")  # each execution's own command line and times
    data.pop("memory")  # each execution's memory systems: their time and latency
    # Spending: the same calls; prompt-cache reads differ (a batch is processed in its own order,
    # so the provider's cache is warm for other lines than in a direct run).
    data["spending"] = [(s["model"], s["role"], s["calls"], s["cached"]) for s in data.get("spending", [])]
    return data


def records(out: Path) -> list[tuple]:
    return [(r.q_idx, r.answer, r.f1) for r in load_results(out / "results.jsonl")]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_batch_run_scores_like_a_direct_run_and_answers_are_interchangeable(tmp_path, server_factory, kind):
    server = server_factory("--batch-polls", "3")
    write_config(tmp_path, server, kind=kind)
    batch = tulving(tmp_path, *RUN, "--batch", "--out", "batch")
    assert batch.returncode == 0, batch.stderr
    stats = server.stats()
    assert stats["batch_requests"] == {"succeeded": 456}
    direct_calls = stats["by_path"].get("/v1/chat/completions", 0) + stats["by_path"].get("/v1/messages", 0)
    assert direct_calls == 0
    if kind == "openai":
        assert len(server.openai_batches()) == 1  # the whole round in one batch
    # A direct rerun on the same cache: every answer is a cache hit, 0 calls.
    before = server.stats()["requests"]
    rerun = tulving(tmp_path, *RUN, "--out", "rerun")
    assert rerun.returncode == 0, rerun.stderr
    assert server.stats()["requests"] == before
    run = json.loads((tmp_path / "rerun" / "run.json").read_text())
    assert run["engine"]["calls"] == 0, run["engine"]
    # A direct run on a fresh cache scores the same.
    direct = subprocess.run([sys.executable, "-m", "engine.cli", "--quiet", "--config", "tulving.toml", "--cache",
                             "fresh.sqlite", *RUN, "--out", "direct"], cwd=tmp_path, env=env(), capture_output=True,
                            text=True, timeout=300)
    assert direct.returncode == 0, direct.stderr
    assert records(tmp_path / "batch") == records(tmp_path / "direct") == records(tmp_path / "rerun")
    assert scores(tmp_path / "batch") == scores(tmp_path / "direct")
    listed = tulving(tmp_path, "batches")
    assert listed.returncode == 0 and "no pending batches" in listed.stdout
    everything = tulving(tmp_path, "batches", "--all")
    assert "ended" in everything.stdout or "completed" in everything.stdout


def test_rounds_that_depend_on_earlier_answers_are_successive_batches(tmp_path, server_factory):
    """Answers, then judgments, then three re-draws of the (unparsable)
    loopback judge's replies: five rounds, five batches of 30 lines."""
    server = server_factory("--batch-polls", "2")
    write_config(tmp_path, server)
    with (tmp_path / "tulving.toml").open("a") as f:
        f.write('\n[models.lb-judge]\nendpoints = ["lb"]\nmodel = "judge-model"\nparams = { temperature = 0.0 }\n')
    run = ["run", "--book", "synaptic-echoes-short", "--models", "lb-reader", "--modes", "in-context",
           "--judge", "lb-judge", "--sample", "30"]
    batch = tulving(tmp_path, *run, "--batch", "--out", "batch")
    assert batch.returncode == 3, batch.stderr  # no valid judgment: said, and exit 3 (engine/errors.py)
    assert "no valid judgments for lb-reader / in-context" in batch.stderr
    batches = server.openai_batches()[::-1]  # oldest first
    assert [b["model"] for b in batches] == ["reader-model"] + ["judge-model"] * 4
    assert [b["request_counts"]["total"] for b in batches] == [30] * 5
    direct = subprocess.run([sys.executable, "-m", "engine.cli", "--quiet", "--config", "tulving.toml", "--cache",
                             "fresh.sqlite", *run, "--out", "direct"], cwd=tmp_path, env=env(), capture_output=True,
                            text=True, timeout=300)
    assert direct.returncode == 3, direct.stderr
    assert records(tmp_path / "batch") == records(tmp_path / "direct")
    assert scores(tmp_path / "batch") == scores(tmp_path / "direct")
    assert all(r.judge_failed and r.judge_draws == 4 for r in load_results(tmp_path / "batch" / "results.jsonl"))


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_run_killed_while_waiting_on_its_batch_resumes_it_and_pays_nothing_twice(tmp_path, server_factory, kind):
    # Ends on its 100th poll: the run is killed after its 3rd (polling every 0.1 s at most, it has
    # about 10 s left to be killed in); the rerun polls without waiting between polls. 40 questions:
    # the resume is the subject, not the size of the batch.
    server = server_factory("--batch-polls", "100")
    write_config(tmp_path, server, kind=kind, batch_poll_max=0.1)
    poll_path = "/v1/batches/{batch_id}" if kind == "openai" else "/v1/messages/batches/{batch_id}"
    args = [sys.executable, "-m", "engine.cli", "--quiet", "--config", "tulving.toml", "--cache", "cache.sqlite",
            *RUN, "--sample", "40", "--batch", "--out", "out"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the batch is recorded and being polled
        if server.batches(kind) and server.stats()["by_path"].get(poll_path, 0) >= 3:
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert len(server.batches(kind)) == 1
    conn = sqlite3.connect(tmp_path / "cache.sqlite")
    (batch_id, owed), = conn.execute("SELECT id, (SELECT count(*) FROM batch_keys WHERE batch_id = id) FROM batches")
    conn.close()
    assert owed == 40 and batch_id == server.batches(kind)[0]["id"]
    pending = subprocess.run(args[:8] + ["batches"], cwd=tmp_path, env=env(), capture_output=True, text=True)
    [row] = [line.split() for line in pending.stdout.splitlines() if batch_id in line]
    assert row[4:6] == ["40", "40"], pending.stdout  # its requests, all owed
    polls = server.stats()["by_path"][poll_path]
    refreshed = subprocess.run(args[:8] + ["batches", "--refresh"], cwd=tmp_path, env=env(), capture_output=True,
                               text=True)
    assert refreshed.returncode == 0 and batch_id in refreshed.stdout and "in_progress" in refreshed.stdout
    assert server.stats()["by_path"][poll_path] == polls + 1

    write_config(tmp_path, server, kind=kind, batch_poll=0.001, batch_poll_max=0.001)
    rerun = subprocess.run(args, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert len(server.batches(kind)) == 1  # resumed, not submitted again
    assert server.stats()["batch_requests"] == {"succeeded": 40}  # each request answered (and paid) once
    assert len(load_results(tmp_path / "out" / "results.jsonl")) == 40
    engine = json.loads((tmp_path / "out" / "run.json").read_text())["engine"]
    assert engine["batches"] == 0 and engine["batches_resumed"] == 1 and engine["batched_calls"] == 0


def _in_ledger(cache: Path, batch_id: str) -> bool:
    try:
        with contextlib.closing(sqlite3.connect(cache)) as conn:
            return conn.execute("SELECT 1 FROM batches WHERE id = ?", (batch_id,)).fetchone() is not None
    except sqlite3.OperationalError:  # the file or its ledger table not made yet
        return False


def test_batches_cancel_ends_the_wait_with_cancelled_calls(tmp_path, server_factory):
    server = server_factory("--batch-polls", "400")
    write_config(tmp_path, server, batch_poll_max=0.02)
    args = [sys.executable, "-m", "engine.cli", "--quiet", "--config", "tulving.toml", "--cache", "cache.sqlite",
            "run", "--book", "synaptic-echoes-short", "--models", "lb-reader", "--modes", "in-context",
            "--judge", "builtin:judge", "--sample", "20", "--batch", "--out", "out"]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not server.openai_batches() and time.monotonic() < deadline:
        time.sleep(0.05)
    batch_id = server.openai_batches()[0]["id"]
    while not _in_ledger(tmp_path / "cache.sqlite", batch_id) and time.monotonic() < deadline:
        time.sleep(0.05)  # recorded in the ledger right after creation
    cancel = tulving(tmp_path, "batches", "cancel", batch_id)
    assert cancel.returncode == 0, cancel.stderr
    assert f"batch {batch_id} on lb: cancelling" in cancel.stdout
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err  # incomplete: the cancelled calls are final errors, rerun to retry
    errors = [r.answer_error for r in load_results(tmp_path / "out" / "results.jsonl") if r.answer_error]
    assert errors and all(e.startswith("cancelled: ") and "was cancelled" in e for e in errors)  # not bad_request
    missing = tulving(tmp_path, "batches", "cancel", "batch_nope")
    assert missing.returncode == 2 and "no batch 'batch_nope'" in missing.stderr


# -- the engine in-process: partial failure, expiry, all failed, splitting ---------------------

def engine_config(server: LoopbackServer, kind: str = "openai", **options: object) -> Config:
    url = server.openai_base_url if kind == "openai" else server.anthropic_base_url
    return Config.from_dicts({"lb": {"kind": kind, "base_url": url, "max_attempts": 3,
                                     "options": {"batch_poll": 0.01, "batch_poll_max": 0.02, **options}}},
                             {"m": {"endpoints": ["lb"], "model": "test-model", "params": {"max_tokens": 16}}})


def requests(n: int) -> list[ChatRequest]:
    return [ChatRequest(model="m", messages=[{"role": "user", "content": f"question {i}"}], tag=i) for i in range(n)]


async def run_batch(config: Config, cache: Path, reqs: list[ChatRequest],
                    retry_policy: RetryPolicy = FAST_RETRY) -> tuple[list, Engine]:
    async with Engine(config, cache_path=str(cache), batch=True, retry_policy=retry_policy) as engine:
        outcomes = await engine.run(reqs)
    return outcomes, engine


async def test_a_rounds_failed_lines_wait_for_each_other_however_far_apart_their_retries_come(tmp_path):
    """The failed lines of a batch come back at their retries' times, here spread over a
    second (a loaded machine spreads them too): the next batch waits for them all rather
    than going out at each gap of QUIET_IDLE (before: 13 batches where 3 do)."""
    spread = RetryPolicy(base=1.0, cap=1.0, jitter=1.0)  # each retry at a random time within 1 s
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=2, fail_share=0.3)) as server:
        outcomes, _ = await run_batch(engine_config(server), tmp_path / "c.sqlite", requests(40), spread)
        sizes = [len(entry["run"].lines) for entry in server.batches.openai.values()]
    assert len(sizes) == 3 and sizes[0] == 40 and sizes[1] == 12, sizes
    assert sum(o.ok for o in outcomes) >= 34


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_failed_lines_are_retried_in_the_next_batch(tmp_path, kind):
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=2, fail_share=0.3)) as server:
        outcomes, engine = await run_batch(engine_config(server, kind), tmp_path / "c.sqlite", requests(40))
        submitted = len(server.batches.openai) + len(server.batches.anthropic)
    # 30% of every batch fails with a 500 (retryable): 40 -> 12 -> 4 (or so) -> ..., 3 attempts each.
    ok = [o for o in outcomes if o.ok]
    failed = [o for o in outcomes if not o.ok]
    assert submitted == 3
    assert all(o.attempts == 3 and o.error.kind == "overloaded" for o in failed)
    assert len(ok) + len(failed) == 40 and len(ok) >= 34
    assert server.stats.batch_requests["injected_500"] == 12 + 4 + len(failed)
    assert engine.stats.calls == 40 + 12 + 4


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_expired_lines_are_sent_again_then_final(tmp_path, kind):
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=2, expire_after=0.5)) as server:
        outcomes, engine = await run_batch(engine_config(server, kind), tmp_path / "c.sqlite", requests(8))
    # Each batch expires with half its lines done: 8 -> 4 -> 2, then final after 3 attempts.
    assert sum(o.ok for o in outcomes) == 4 + 2 + 1
    failed = [o for o in outcomes if not o.ok]
    assert len(failed) == 1 and failed[0].error.kind == "timeout" and "expired" in str(failed[0].error)
    assert len(server.batches.openai) + len(server.batches.anthropic) == 3


async def test_an_openai_batch_where_every_line_failed_has_no_output_file(tmp_path):
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1, fail_share=1.0)) as server:
        outcomes, _ = await run_batch(engine_config(server), tmp_path / "c.sqlite", requests(5))
        batches = [entry["batch"] for entry in server.batches.openai.values()]
    assert all(b["output_file_id"] is None and b["status"] == "completed" for b in batches)
    assert len(batches) == 3  # retried twice, then final
    assert all(not o.ok and o.error.kind == "overloaded" and o.attempts == 3 for o in outcomes)


async def test_an_openai_batch_with_empty_file_ids_is_harvested_once(tmp_path):
    # OpenAI has answered `"error_file_id": ""` for a batch with no failed line. Read as a
    # file id it was a 404 (`/files//content`) that made the batch look gone: every line
    # was sent again, the answered ones paid twice.
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1, empty_file_ids=True)) as server:
        outcomes, engine = await run_batch(engine_config(server), tmp_path / "c.sqlite", requests(6))
        batches = [entry["batch"] for entry in server.batches.openai.values()]
        succeeded = server.stats.batch_requests["succeeded"]
    assert [b["error_file_id"] for b in batches] == [""]
    assert all(o.ok for o in outcomes) and succeeded == 6 and engine.stats.calls == 6


async def test_an_unreadable_error_file_throws_no_paid_answer_away(tmp_path):
    # Half of each batch fails, and the error file that lists the failures answers 404: the
    # answers of the output file are kept, only the failed lines go out again.
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1, fail_share=0.5, error_file_lost=True)) as server:
        outcomes, _ = await run_batch(engine_config(server), tmp_path / "c.sqlite", requests(20))
        succeeded = server.stats.batch_requests["succeeded"]
        first = len(next(iter(server.batches.openai.values()))["run"].lines)
    assert first == 20 and sum(o.ok for o in outcomes) >= 10
    assert succeeded == sum(o.ok for o in outcomes)  # no line answered twice


async def test_an_openai_file_holds_one_model(tmp_path):
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1)) as server:
        # Two models on one endpoint: the engine files them separately (one model per OpenAI file).
        config = Config.from_dicts(
            {"lb": {"kind": "openai", "base_url": server.openai_base_url, "options": {"batch_poll": 0.01}}},
            {"m": {"endpoints": ["lb"], "model": "model-a"}, "n": {"endpoints": ["lb"], "model": "model-b"}})
        reqs = requests(3) + [ChatRequest(model="n", messages=[{"role": "user", "content": "x"}], tag=9)]
        outcomes, _ = await run_batch(config, tmp_path / "c.sqlite", reqs)
        models = sorted(entry["batch"]["model"] for entry in server.batches.openai.values())
    assert models == ["model-a", "model-b"] and all(o.ok for o in outcomes)


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_batches_split_at_the_request_and_size_limits(tmp_path, kind):
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1)) as server:
        outcomes, _ = await run_batch(engine_config(server, kind, batch_max_requests=10), tmp_path / "a.sqlite",
                                      requests(25))
        sizes = [len(e["run"].lines) for e in [*server.batches.openai.values(), *server.batches.anthropic.values()]]
        assert all(o.ok for o in outcomes) and sorted(sizes) == [5, 10, 10]
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1)) as server:
        spec = engine_config(server, kind).endpoints["lb"]
        line = batch_api_for(spec, None).line("0" * 64, "test-model", requests(1)[0].messages, {"max_tokens": 16})
        limit = 3 * (len(line) + 1) + 2 + SIZE_MARGIN  # three lines (questions 0-6 are all the same size)
        outcomes, _ = await run_batch(engine_config(server, kind, batch_max_bytes=limit), tmp_path / "b.sqlite",
                                      requests(7))
        sizes = [len(e["run"].lines) for e in [*server.batches.openai.values(), *server.batches.anthropic.values()]]
        assert all(o.ok for o in outcomes) and sorted(sizes) == [1, 3, 3]


async def test_batch_mode_leaves_other_kinds_and_embeddings_direct(tmp_path):
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1)) as server:
        config = Config.from_dicts(
            {"lb": {"kind": "openai", "base_url": server.openai_base_url, "options": {"batch_poll": 0.01}},
             "plain": {"kind": "openai", "base_url": server.openai_base_url, "options": {"batch": False}}},
            {"m": {"endpoints": ["lb"], "model": "test-model"}, "p": {"endpoints": ["plain"], "model": "test-model"},
             "e": {"endpoints": ["lb"], "model": "embedder"}})
        from engine.requests import EmbedRequest
        reqs = [*requests(3), ChatRequest(model="p", messages=[{"role": "user", "content": "direct"}]),
                EmbedRequest(model="e", texts=["a", "b"])]
        outcomes, _ = await run_batch(config, tmp_path / "c.sqlite", reqs)
        assert all(o.ok for o in outcomes), [o.error for o in outcomes]
        assert server.stats.batch_requests == {"succeeded": 3}
        assert server.stats.by_path["/v1/chat/completions"] == 1 and server.stats.by_path["/v1/embeddings"] == 1



def test_generate_by_batch_writes_what_a_direct_generation_writes(tmp_path, server_factory):
    server = server_factory("--batch-polls", "2")
    write_config(tmp_path, server)
    gen = ["generate", "--events", "3", "--itermax", "2", "--model", "lb-reader"]
    batch = tulving(tmp_path, *gen, "--batch", "--out", "b1")
    stats = server.stats()
    assert stats["batch_requests"].get("succeeded", 0) > 0 and "/v1/chat/completions" not in stats["by_path"]
    direct = subprocess.run([sys.executable, "-m", "engine.cli", "--quiet", "--config", "tulving.toml", "--cache",
                             "fresh.sqlite", *gen, "--out", "b2"], cwd=tmp_path, env=env(), capture_output=True,
                            text=True, timeout=300)
    # (the loopback model writes no valid chapter: both runs end with the same refusal)
    assert batch.returncode == direct.returncode and batch.stderr.replace("b1", "b2") == direct.stderr
    assert (tmp_path / "b1" / "generation_log.jsonl").read_text() == (tmp_path / "b2" / "generation_log.jsonl").read_text()


def test_dry_run_says_how_many_calls_go_by_batch(tmp_path, server_factory):
    server = server_factory()
    write_config(tmp_path, server)
    plan = tulving(tmp_path, *RUN, "--sample", "10", "--batch", "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "--batch: 10 of the 10 uncached calls known now go by batch (lb: 10), 0 direct" in plan.stdout
    assert "--batch: judge calls (builtin:judge): direct" in plan.stdout
    assert server.stats()["requests"] == 0


async def test_batch_lines_cost_the_batch_price_and_max_cost_holds(tmp_path):
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1)) as server:
        config = Config.from_dicts(
            {"lb": {"kind": "openai", "base_url": server.openai_base_url, "options": {"batch_poll": 0.01}}},
            {"m": {"endpoints": ["lb"], "model": "test-model", "params": {"max_tokens": 16},
                   "price_in": 1000.0, "price_out": 2000.0}})
        async with Engine(config, cache_path=str(tmp_path / "c.sqlite"), batch=True) as engine:
            outcomes = await engine.run(requests(10))
        alias = config.alias("m")
        for o in outcomes:
            full = alias.cost(o.result.input_tokens, o.result.output_tokens)
            assert o.cost == pytest.approx(full * 0.5) and o.cost > 0
        spent = engine.stats.cost
        # The same calls again under a cap that admits only some of them (worst case reserved at the batch price).
        one = max(o.cost for o in outcomes) * 3
        async with Engine(config, cache_path=str(tmp_path / "d.sqlite"), batch=True, max_cost=4 * one) as engine:
            capped = await engine.run(requests(10))
        sent = [o for o in capped if o.ok]
        assert 0 < len(sent) < 10 and all(o.error.kind == "budget" for o in capped if not o.ok)
        assert engine.stats.cost <= 4 * one and spent > engine.stats.cost


async def test_a_recorded_batch_the_provider_no_longer_knows_is_forgotten_and_its_calls_sent_again(tmp_path):
    from cache.batches import BatchLedger
    from engine.resolve import resolve

    cache = tmp_path / "c.sqlite"
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1)) as server:
        config = engine_config(server)
        reqs = requests(4)
        async with Engine(config, cache_path=str(cache)):  # creates the cache file
            pass
        ledger = BatchLedger(cache)
        await ledger.record("batch_gone", endpoint="lb", kind="openai", base_url=None, model="test-model",
                            state="in_progress", keys=[resolve(config, r).key for r in reqs])
        outcomes, engine = await run_batch(config, cache, reqs)
        assert all(o.ok and o.attempts == 2 for o in outcomes)
        assert engine.stats.batches == 1 and engine.stats.batches_resumed == 1 and engine.stats.batched_calls == 4
        assert server.stats.by_path["/v1/batches/{batch_id}"] >= 2  # the unknown one (404), then the new one
        assert len(server.batches.openai) == 1
        assert [b.id for b in await ledger.batches(owing_only=True)] == []
        assert [b.id for b in await ledger.batches()] == list(server.batches.openai)
        ledger.close()


async def test_the_ledger_owes_only_keys_whose_results_are_not_in_the_cache(tmp_path):
    from cache.batches import BatchLedger
    from cache.store import ResponseCache

    path = tmp_path / "c.sqlite"
    async with ResponseCache(path) as cache:
        cache.put("a" * 64, {"op": "chat", "model": "m", "messages": []}, ChatResult(text="stored"))
    ledger = BatchLedger(path)
    await ledger.record("batch_1", endpoint="lb", kind="openai", base_url=None, model="m", state="in_progress",
                        keys=["a" * 64, "b" * 64, "c" * 64])
    await ledger.settled("batch_1", ["c" * 64])
    (batch,) = await ledger.batches()
    assert batch.requests == 3 and batch.owed == 1  # a: in the cache (a kill before settling), c: settled
    assert await ledger.owing("lb", ["a" * 64, "b" * 64, "c" * 64]) == {"a" * 64: "batch_1", "b" * 64: "batch_1"}
    assert await ledger.owing("other", ["b" * 64]) == {}
    await ledger.update("batch_1", "completed", {"total": 3})
    ledger.close()
    reopened = BatchLedger(path)  # durable across processes
    (batch,) = await reopened.batches(owing_only=True)
    assert batch.state == "completed" and batch.counts == {"total": 3}
    await reopened.forget("batch_1")
    assert await reopened.batches() == []
    reopened.close()


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_batches_wait_for_room_in_the_accounts_batch_queue(tmp_path, kind):
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=3)) as server:
        live_lines: list[int] = []

        async def sample() -> None:
            while True:
                openai_live = [e["run"] for e in server.batches.openai.values()
                               if e["batch"]["status"] not in ("completed", "failed", "expired", "cancelled")]
                anthropic_live = [e["run"] for e in server.batches.anthropic.values() if e["status"] != "ended"]
                live_lines.append(sum(len(run.lines) for run in openai_live + anthropic_live))
                await asyncio.sleep(0.002)

        sampler = asyncio.ensure_future(sample())
        outcomes, engine = await run_batch(engine_config(server, kind, batch_queue_requests=10),
                                           tmp_path / "c.sqlite", requests(25))
        sampler.cancel()
        sizes = [len(e["run"].lines) for e in [*server.batches.openai.values(), *server.batches.anthropic.values()]]
    assert all(o.ok for o in outcomes) and sorted(sizes) == [5, 10, 10]
    assert max(live_lines) == 10  # one batch in the queue at a time
    assert any("batch queue full" in n for n in engine.stats.notices)


@pytest.mark.parametrize("created", [True, False])
async def test_a_run_killed_between_upload_and_batch_id_finds_its_batch_or_sends_again(tmp_path, created):
    """The keys are recorded under the uploaded file's id before the (paid)
    batch is created: a rerun finds the batch made from that file, or, when
    none was, sends the calls again."""
    from cache.batches import BatchLedger
    from engine.resolve import resolve

    cache = tmp_path / "c.sqlite"
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=2)) as server:
        config = engine_config(server)
        reqs = requests(5)
        async with Engine(config, cache_path=str(cache)):
            pass
        api = batch_api_for(config.endpoints["lb"], None)
        resolved = [resolve(config, r) for r in reqs]
        lines = [api.line(r.key, r.alias.model, r.messages, r.params) for r in resolved]
        handle = await api.prepare(lines)  # what the killed run did: upload, record the intent, (create)
        ledger = BatchLedger(cache)
        await ledger.record(f"pending:{handle}", endpoint="lb", kind="openai", base_url=None, model="test-model",
                            state="creating", keys=[r.key for r in resolved])
        if created:
            made = await api.create(handle, lines)
        await api.aclose()
        outcomes, engine = await run_batch(config, cache, reqs)
        assert all(o.ok for o in outcomes)
        assert len(server.batches.openai) == 1  # created once, by the killed run or by the rerun
        assert server.stats.batch_requests == {"succeeded": 5}
        recorded = [b.id for b in await ledger.batches()]
        ledger.close()
    assert recorded == list(server.batches.openai)
    if created:
        assert recorded == [made.id] and engine.stats.batches == 0 and engine.stats.batches_resumed == 1
        assert all(o.attempts == 1 for o in outcomes)
    else:
        assert engine.stats.batches == 1 and all(o.attempts == 2 for o in outcomes)
