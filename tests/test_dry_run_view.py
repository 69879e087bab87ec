"""`tulving run --dry-run` through the CLI as a subprocess (nothing called):
beside its table by model and role (worst case: every reply at max_tokens),
a likely and a worst figure for each way the run can go, how long the run
takes under the endpoints' configured limits (and by batch), and the
assumptions as a short table rather than one long sentence."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from engine.progress import duration
from tests.test_cost_cli import SONNET
from tests.test_run_cli import env

MAX_TOKENS = 500


def _config(tmp_path: Path) -> Path:
    # One request a minute binds: every other limit is far away.
    path = tmp_path / "tulving.toml"
    path.write_text('[endpoints.slow]\nkind = "anthropic"\nbase_url = "http://127.0.0.1:9"\nrpm = 1\n'
                    'input_tpm = 100000000\nmax_concurrency = 4\n\n'
                    f'[models.sonnet-loop]\nendpoint = "slow"\nmodel = "claude-loop"\n'
                    f'params = {{ max_tokens = {MAX_TOKENS} }}\n{SONNET}')
    return path


def _dry_run(tmp_path: Path, *extra: str) -> str:
    args = [sys.executable, "-m", "engine.cli", "--config", str(_config(tmp_path)), "--cache", "c.sqlite", "run",
            "--book", "synaptic-echoes-short", "--models", "sonnet-loop", "--judge", "sonnet-loop", "--sample", "6",
            "--out", "run", "--dry-run", *extra]
    done = subprocess.run(args, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _usd(text: str) -> float:
    return float(text.replace("$", "").replace(",", ""))


def test_the_dry_run_gives_a_likely_and_a_worst_cost_a_duration_and_its_assumptions(tmp_path):
    out = _dry_run(tmp_path, "--batch")
    lines = out.splitlines()
    # The estimator's table (every reply at max_tokens) and its total: the worst figure.
    total = next(line.split() for line in lines if line.startswith("total "))
    answers = next(line.split() for line in lines if line.startswith("sonnet-loop") and " answer " in line)
    judge = next(line.split() for line in lines if line.startswith("sonnet-loop") and " judge " in line)
    n_answers, n_judge = int(answers[4]), int(judge[4])
    costs = {m[1].strip(): (_usd(m[2]), _usd(m[3])) for m in
             map(re.compile(r"^  (direct|direct, with prompt caching|by batch \(--batch\)|by batch, with prompt "
                            r"caching)\s+(\$[\d.,]+)\s+(\$[\d.,]+)$").match, lines) if m}
    assert set(costs) == {"direct", "direct, with prompt caching", "by batch (--batch)",
                          "by batch, with prompt caching"}
    assert costs["direct"][1] == float(total[-4])  # worst: the table's direct dollars (4th column from the end)
    # Likely: the same calls with each reply at the length it must have, as the assumptions say.
    answer_len = int(re.search(r"answers (\d+) tokens: the ground-truth items", out)[1])
    judge_len = int(re.search(r"judgments (\d+) tokens: the items found and scored", out)[1])
    assert 0 < answer_len < MAX_TOKENS and 0 < judge_len < MAX_TOKENS
    # answer_len and judge_len are rounded for print: the priced figures lie within a token of them
    saved = (n_answers * (MAX_TOKENS - answer_len) + n_judge * (MAX_TOKENS - judge_len)) * 15.0 / 1e6
    likely, worst = costs["direct"]
    assert abs((worst - likely) - saved) <= (n_answers + n_judge) * 1.0 * 15.0 / 1e6 + 0.0001
    assert costs["by batch (--batch)"][0] < likely and costs["direct, with prompt caching"][0] < likely
    # How long: one request a minute binds, so as many minutes as calls, likely and worst.
    [row] = [line for line in lines if line.startswith("  slow ")]
    calls = n_answers + n_judge
    assert f"{calls:,}" in row and "requests a minute (1)" in row
    assert row.split()[-2:] == [duration(60 * calls)] * 2
    # By batch: rounds of provider batches, with their turnaround.
    assert re.search(r"by batch \(slow\): 3 rounds .*\n    likely 3 h, worst 72 h \(1 h and 24 h a round\)", out)
    # The assumptions are rows of a table, not a sentence of 400 characters.
    head = next(line for line in lines if line.startswith("cost estimate"))
    assert len(head) < 130
    table = lines[lines.index("assumptions:") + 1:]
    table = table[:next(i for i, line in enumerate(table) if not line.startswith("  "))]
    assert table[0].split() == ["assumed", "how"] and len(table) >= 8
    assert all(len(line) < 120 for line in table)
    assert {line.split()[0] for line in table[1:] if line[2] != " "} >= {"tokens", "output,", "limits", "call",
                                                                          "batch"}


def test_without_batch_the_dry_run_gives_no_batch_turnaround(tmp_path):
    out = _dry_run(tmp_path)
    assert "likely and worst cost of the calls to make:" in out and "rounds (answers" not in out
