"""A native crash in the middle of a run (the worker's test hook sends it
SIGSEGV on a marked prompt), through the real engine, the real SmolLM2 worker
and the SQLite cache on disk, then through `tulving run`: the run ends
normally with the other answers, the crash is one classified error in the
report, and a rerun asks the model only for it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.benchmark.evaluation.questions import write_questions
from engine.benchmark.evaluation.results import load_results
from engine.config import Config
from engine.errors import EXIT_INCOMPLETE
from engine.requests import ChatRequest
from engine.scheduler import Engine
from providers.base import CONNECTION, CRASHED
from providers.llama_worker import CRASH_HOOK_ENV

pytest.importorskip("llama_cpp", reason="llama-cpp-python is the [local] extra")

MARKER = "ZQX-CRASH-HOOK"
CONTEXT = " ".join(f"On day {i} the archivist of the harbour town sorted {i * 3} letters and two maps."
                   for i in range(1, 9))  # a shared prefix to reuse; short: the crash is the subject
QUESTIONS = ["How many maps?", f"Who sorted the letters? {MARKER}", "Which town?", "What did the archivist do?",
             "On which day were 24 letters sorted?"]


def requests(model: str = "local:smollm2") -> list[ChatRequest]:
    return [ChatRequest(model=model, messages=[{"role": "user", "content": f"{CONTEXT}\n\nQuestion: {q}"}],
                        max_tokens=6, temperature=0.0, tag=str(i)) for i, q in enumerate(QUESTIONS)]


def local_endpoint(engine: Engine):
    return engine._endpoints["local"].provider


def config(tmp_path, max_attempts: int) -> Config:
    path = tmp_path / "tulving.toml"
    path.write_text(f"[endpoints.local]\nmax_attempts = {max_attempts}\n")
    return Config.load(path)


@pytest.mark.parametrize("max_attempts", [1, 2])
async def test_a_worker_crash_mid_run_fails_only_its_call_and_a_rerun_asks_only_it(tmp_path, monkeypatch,
                                                                                  max_attempts):
    cache = str(tmp_path / "cache.sqlite")
    monkeypatch.setenv(CRASH_HOOK_ENV, MARKER)
    async with Engine(config(tmp_path, max_attempts), cache_path=cache) as engine:
        first = await engine.run(requests())
        stats = engine.stats
        provider = local_endpoint(engine)
        assert provider.stats.worker_deaths == max_attempts
        assert provider.stats.reused_prefix_tokens > 0  # prefix reuse goes on around the crash
    crashed = first[1]
    assert not crashed.ok and crashed.attempts == max_attempts
    # The first death is retryable (the built-in local endpoint makes one
    # attempt); the same call killing a second worker is final.
    assert crashed.error.kind == (CONNECTION if max_attempts == 1 else CRASHED)
    assert "SIGSEGV" in str(crashed.error)
    assert [o.ok for o in first] == [True, False, True, True, True]
    assert all(o.text.strip() for o in first if o.ok)
    assert stats.errors == {crashed.error.kind: 1} and stats.succeeded == 4
    assert stats.calls == 4 + max_attempts and stats.retries == max_attempts - 1

    monkeypatch.delenv(CRASH_HOOK_ENV)
    async with Engine(config(tmp_path, max_attempts), cache_path=cache) as engine:
        second = await engine.run(requests())
        assert engine.stats.calls == 1 and engine.stats.cache_hits == 4
        assert local_endpoint(engine).stats.calls == 1
    assert all(o.ok for o in second)
    assert [o.cached for o in second] == [True, False, True, True, True]
    assert [o.text for o in second if o.cached] == [o.text for o in first if o.ok]


REPO = Path(__file__).resolve().parents[1]


def tulving(cwd: Path, *args: str, crash_on: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TULVING_CONFIG", "TULVING_CACHE", CRASH_HOOK_ENV)}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if crash_on:
        env[CRASH_HOOK_ENV] = crash_on
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_tulving_run_survives_a_worker_crash_and_the_rerun_asks_only_the_failed_question(tmp_path,
                                                                                        short_questions):
    """SmolLM2 closed-book ("finetuned" mode: no embeddings needed) on four
    questions; the worker crashes on the third one's prompt, on both attempts
    the built-in local endpoint makes (the second on a fresh worker)."""
    picked = [short_questions[i] for i in (0, 100, 200, 300)]
    assert len({q.question for q in picked}) == 4
    write_questions(tmp_path / "q.jsonl", picked)
    # --max-tokens 8: the crash and the rerun are the subject, not SmolLM2's 140-token answers (10 s each here).
    args = ["--quiet", "--cache", "cache.sqlite", "run", "--book", "synaptic-echoes-short", "--questions", "q.jsonl",
            "--models", "local:smollm2", "--modes", "finetuned", "--max-tokens", "8", "--judge", "builtin:judge",
            "--out", "out"]

    first = tulving(tmp_path, *args, crash_on=picked[2].question)
    # The run ends normally, with the exit code of an incomplete run (not a signal's).
    assert first.returncode == EXIT_INCOMPLETE, first.stderr
    assert "1 answer error(s) left out" in first.stdout and "3/4" in first.stdout
    assert "died (SIGSEGV)" in first.stderr  # one warning line, not a dead run
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["engine"]["errors"] == {CRASHED: 1} and run["engine"]["retries"] == 1
    records = {r.question: r for r in load_results(tmp_path / "out" / "results.jsonl")}
    assert records[picked[2].question].answer_error.startswith("crashed: the local model worker died (SIGSEGV)")
    answered = {q.question: records[q.question].answer for q in picked if q is not picked[2]}
    assert all(answered.values())

    second = tulving(tmp_path, *args)
    assert second.returncode == 0, second.stderr
    assert "4/4" in second.stdout
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    # The failed answer, then the judge's call on it: everything else is cached.
    assert run["engine"]["calls"] == 2 and run["engine"]["errors"] == {}
    records = {r.question: r for r in load_results(tmp_path / "out" / "results.jsonl")}
    assert records[picked[2].question].answer_error is None and records[picked[2].question].answer
    assert {q: records[q].answer for q in answered} == answered
