"""`tulving run --sample` and `tulving bench` (streamed; the commands run in
this process, tests/cli.py) against llama.cpp's own OpenAI-compatible server (tests/llama_server.py):
a server nobody here wrote, declared as an `openai`-kind endpoint with no
key. It ignores `stream_options.include_usage`, so every streamed reply comes
without usage: a normal reply, its tokens counted locally, and said so.

The server is in the test extra (llama-cpp-python[server]): when it cannot
start, these tests fail, never skip."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.benchmark.evaluation.results import load_results
from tests.llama_server import LlamaServer
from tests.test_run_cli import in_process

SAMPLE = 2
# Closed-book ("finetuned" mode: the question alone): the server, its wire and
# its missing usage are the subject, not RAG, whose prompts of a few thousand
# tokens (and the embedder they need) cost most of these tests' CPU.
MODE = ("--modes", "finetuned")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with LlamaServer(log) as server:
        yield server


def config(tmp_path: Path, server: LlamaServer, *, stream: bool) -> Path:
    """The docs' "llama.cpp server" preset (docs/providers.md), at the test's port."""
    path = tmp_path / "tulving.toml"
    options = "options = { stream = true }\n" if stream else ""
    path.write_text(f'[endpoints.llamacpp]\nkind = "openai"\nbase_url = "{server.base_url}"\nfree = true\nmax_concurrency = 1\n'
                    f'{options}\n[models.smollm2-server]\nendpoint = "llamacpp"\nmodel = "smollm2"\n'
                    'params = { temperature = 0.0, max_tokens = 16 }\n')
    return path


def test_run_sample_answers_rag_questions_through_the_server(tmp_path, llama):
    cfg = config(tmp_path, llama, stream=True)
    result = in_process(tmp_path, "--config", str(cfg), "--cache", "c.sqlite", "run", "--book",
                     "synaptic-echoes-short", "--models", "smollm2-server", *MODE, "--judge", "builtin:judge",
                     "--sample", str(SAMPLE),
                     "--out", "out")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "smollm2-server" in result.stdout and "Leaderboard" in result.stdout
    records = [r for r in load_results(tmp_path / "out" / "results.jsonl") if r.model == "smollm2-server"]
    assert len(records) == SAMPLE and all(r.mode == "finetuned" for r in records)
    assert all(r.answer and r.answer.strip() for r in records), [r.answer for r in records]
    assert all(r.input_tokens > 0 and 0 < r.output_tokens <= 32 for r in records)
    assert all(r.f1 is not None for r in records)
    # Streamed, and the server sent no usage: the answers' tokens were counted locally, and said so once.
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    [answers] = [row for row in run["spending"] if row["model"] == "smollm2-server" and row["role"] == "answer"]
    assert answers["calls"] == SAMPLE and answers["usage_counted_locally"] == SAMPLE
    assert result.stderr.count("replies had no usage from the server: tokens counted locally") == 1
    assert f"{SAMPLE} replies had no usage from the server" in result.stderr


def test_bench_streams_every_request_through_the_server(tmp_path, llama):
    cfg = config(tmp_path, llama, stream=False)  # bench streams whatever the endpoint says
    result = in_process(tmp_path, "--config", str(cfg), "bench", "--models", "smollm2-server", "-n", "3",
                     "--warmup", "0", "--input-tokens", "64", "--output-tokens", "8", "--json", "bench.json")
    assert result.returncode == 0, result.stderr[-2000:]
    [run] = json.loads((tmp_path / "bench.json").read_text())["runs"]
    summary = run["summary"]
    assert summary["requests"] == summary["completed"] == 3 and summary["failed"] == {}
    assert summary["retries"] == 0
    assert summary["ttft"]["count"] == 3 and 0 < summary["ttft"]["min"] <= summary["e2e"]["max"]
    assert summary["input_tokens"] > 3 * 32 and 0 < summary["output_tokens"] <= 3 * 16
    assert summary["usage_counted_locally"] == 3
    assert "3 replies had no usage from the server: tokens counted locally" in result.stdout


def test_batch_is_refused_at_start_and_auto_goes_direct(tmp_path, llama):
    """llama.cpp's server has no batch API (404 on /v1/batches): `--batch` stops
    before any call, in one line naming the option; `batch = "auto"` goes direct."""
    cfg = config(tmp_path, llama, stream=False)
    run = ["--config", str(cfg), "--cache", "c.sqlite", "run", "--book", "synaptic-echoes-short", "--models",
           "smollm2-server", *MODE, "--judge", "builtin:judge", "--sample", "1", "--batch"]
    refused = in_process(tmp_path, *run, "--out", "refused")
    assert refused.returncode != 0
    [line] = refused.stderr.strip().splitlines()
    assert "endpoint 'llamacpp'" in line and "has no batch API (its batch list answered 404)" in line
    assert "options.batch = false" in line and not (tmp_path / "refused" / "results.jsonl").exists()

    cfg.write_text(cfg.read_text().replace('max_concurrency = 1\n', 'max_concurrency = 1\noptions = { batch = "auto" }\n'))
    direct = in_process(tmp_path, *run, "--out", "auto")
    assert direct.returncode == 0, direct.stderr[-2000:]
    assert "its calls go direct" in direct.stderr and "rerun to retry" not in direct.stdout + direct.stderr
    [record] = [r for r in load_results(tmp_path / "auto" / "results.jsonl") if r.model == "smollm2-server"]
    assert record.answer and record.answer.strip() and record.f1 is not None
