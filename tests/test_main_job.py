"""The README's first command, `tulving run` with no option, as a newcomer
runs it: the installed package (the wheel in a fresh virtual environment,
tests/wheel_install.py), a fresh home (no config, no cache, no data folder),
the CLI as a subprocess. It exits 0 with the built-in reader's two rows
ranked and the local LLM's answer set apart as a smoke check, never ranked;
every count of the summary says what it counts; every part of the main job
(the built-in reader in context and by RAG, MiniLM, SmolLM2's sample, the
built-in judge) ran from the installed package. (How long it takes is
measured, not asserted: docs/getting-started.md.) One run serves both the
newcomer's and the installed package's checks: the same command made twice
cost 20 s."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess

import pytest

from tests.wheel_install import _clean_env


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                    reason="llama-cpp-python is not installed (the [local] extra): the main job leaves SmolLM2 out")
def test_the_main_job_sets_the_local_model_apart_as_a_smoke_check(installed, tmp_path):
    tulving, _ = installed
    home = tmp_path / "home"
    env = {k: v for k, v in _clean_env().items() if not k.startswith(("TULVING", "XDG_"))}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"),
               XDG_CONFIG_HOME=str(home / ".config"), XDG_DATA_HOME=str(home / ".local" / "share"))
    done = subprocess.run([str(tulving), "run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert "Leaderboard (synaptic-echoes-short" in done.stdout
    table, _, rest = done.stdout.partition("\n\n")
    rows = [line.split() for line in table.splitlines()[3:] if not line.startswith("note:")]
    assert [(r[0], r[1], r[2]) for r in rows] == [("1", "builtin:reader", "in-context"),
                                                  ("2", "builtin:reader", "rag-paragraph"),
                                                  ("3", "builtin:reader", "no-memory")]
    assert "local:smollm2" not in table  # not ranked on one question: it ranked 3rd with "0.000"
    smoke = next(line for line in rest.splitlines() if line.startswith("Smoke check, not ranked: local:smollm2"))
    assert re.search(r"answered 1 of the 456 questions .* not a score\. To score it: tulving run --models "
                     r"local:smollm2 --modes rag-paragraph --embed-model local:minilm \(at this run's \d+ s an "
                     r"answer, all 456 take about \d+h\d\dm\)\.$", smoke), smoke
    run_dir = tmp_path / "runs" / "synaptic-echoes-short"
    for name in ("results.jsonl", "scores.json", "report.md", "run.json"):
        assert (run_dir / name).is_file(), name
    jobs = {(j["model"], j["mode"]): j for j in json.loads((run_dir / "run.json").read_text())["jobs"]}
    assert set(jobs) >= {("builtin:reader", "in-context"), ("builtin:reader", "rag-paragraph"),
                         ("local:smollm2", "rag-paragraph")}
    assert jobs[("local:smollm2", "rag-paragraph")]["smoke"] is True
    assert not any(j.get("smoke") for key, j in jobs.items() if key[0] != "local:smollm2")
    assert "## Smoke check (not ranked)" in (run_dir / "report.md").read_text()
    # The summary's counts: the run-wide total, why it is short of the plan, what "cached" means.
    err = done.stderr.splitlines()
    assert any(re.match(r"^total: [\d,]+ calls, [\d,]+ cached \|", line) for line in err)
    assert any(line.startswith("of the ") and " calls planned, " in line for line in err)
    assert any(line.startswith("cached: ") for line in err)
