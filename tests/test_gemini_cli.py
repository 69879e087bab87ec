"""`tulving run --batch` on a Gemini endpoint, end to end: the CLI (in this
process, tests/cli.py) against the loopback server in another process, Batch
Mode over real HTTP, then a direct run on a fresh cache scoring the same."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import cli
from tests.test_batch_mode import env, records, scores, server_factory  # noqa: F401 (a fixture)

RUN = ["run", "--book", "synaptic-echoes-short", "--models", "gem-reader", "--modes", "in-context",
       "--judge", "builtin:judge"]


def tulving(tmp_path: Path, cache: str, *args: str) -> cli.Done:
    return cli.tulving(tmp_path, "--quiet", "--config", "tulving.toml", "--cache", cache, *args, env=env())


def write_config(tmp_path: Path, server) -> None:  # noqa: ANN001 -- tests.test_batch_mode.Server
    (tmp_path / "tulving.toml").write_text(
        f'[endpoints.gem]\nkind = "gemini"\nbase_url = "{server.anthropic}/gemini"\nfree = true\nmax_attempts = 3\n'
        'options = { batch_poll = 0.02, batch_poll_max = 0.05 }\n\n'
        '[models.gem-reader]\nendpoint = "gem"\nmodel = "gemini-2.5-flash"\nsystem_prompt = false\n'
        'params = { temperature = 0.0, max_tokens = 32 }\nprice_in = 0.30\nprice_out = 2.50\n')


def test_a_gemini_batch_run_scores_like_a_direct_run(tmp_path, server_factory):  # noqa: F811
    server = server_factory()
    write_config(tmp_path, server)
    batch = tulving(tmp_path, "cache.sqlite", *RUN, "--batch", "--out", "batch")
    assert batch.returncode == 0, batch.stderr
    stats = server.stats()
    assert stats["batch_requests"] == {"succeeded": 456}
    # Batch Mode on v1beta, the version Google documents it under (the direct calls keep v1).
    assert stats["by_path"]["/gemini/v1beta/models/gemini-2.5-flash:batchGenerateContent"] == 1
    assert not any(path.endswith(":generateContent") for path in stats["by_path"])
    direct = tulving(tmp_path, "fresh.sqlite", *RUN, "--out", "direct")
    assert direct.returncode == 0, direct.stderr
    assert server.stats()["by_path"]["/gemini/v1/models/gemini-2.5-flash:generateContent"] == 456
    assert records(tmp_path / "batch") == records(tmp_path / "direct")
    batch_scores, direct_scores = scores(tmp_path / "batch"), scores(tmp_path / "direct")
    batch_spent = batch_scores["runs"][0].pop("spent_usd")
    direct_spent = direct_scores["runs"][0].pop("spent_usd")
    assert batch_scores == direct_scores
    assert batch_spent == pytest.approx(direct_spent / 2, rel=1e-4)  # Batch Mode: half price


def test_batch_results_without_their_keys_are_paid_once_counted_and_not_sent_again(tmp_path, server_factory):  # noqa: F811
    # The real API is reported to leave metadata.key out of inlined responses (python-genai#2008) and to
    # return them out of order (#1909): the loopback does both. Nothing then tells the 456 answers apart.
    server = server_factory("--gemini-batch-drop-keys", "--gemini-batch-reorder")
    write_config(tmp_path, server)
    run = tulving(tmp_path, "cache.sqlite", *RUN, "--batch", "--out", "batch")
    stats = server.stats()
    # Each line paid once: one batch, no resubmission, no direct call.
    assert stats["batch_requests"] == {"succeeded": 456}
    assert stats["by_path"]["/gemini/v1beta/models/gemini-2.5-flash:batchGenerateContent"] == 1
    assert not any(path.endswith(":generateContent") for path in stats["by_path"])
    # ...and counted: what the server billed, at the batch price, in the run's spending.
    billed = (stats["input_tokens"] * 0.30 + stats["output_tokens"] * 2.50) / 1e6 * 0.5
    [row] = [r for r in json.loads((tmp_path / "batch" / "scores.json").read_text())["spending"]
             if r["model"] == "gem-reader"]
    assert row["paid_no_answer"] == 456 and row["spent_usd"] == pytest.approx(billed, rel=1e-6)
    assert run.returncode != 0  # the answers are missing: the run says so
    # One line says what happened and what to do (--quiet keeps only the final one).
    said = [line for line in run.stderr.splitlines() if "came back without their keys" in line]
    assert len(said) == 1 and "456 of them were paid" in said[0] and "without --batch" in said[0], run.stderr
