"""A run with a memory system that makes model calls, stopped mid-ingest and
rerun: the rerun re-ingests from the cache, nothing finished is paid twice,
and it ends with every result. Through the CLI as a subprocess, the memory
system a subprocess speaking JSON lines (tests/memory_process.py), its calls
going through Tulving's endpoint to a server that counts what it answered
(tests/fault_server.py)."""
from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.fault_server import FaultServer
from tests.report_runs import env

PROCESS = Path(__file__).parent / "memory_process.py"
SAMPLE = 6


def _command(tmp_path: Path, server: FaultServer) -> list[str]:
    config = tmp_path / "tulving.toml"
    config.write_text(f'[endpoints.paid]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\n'
                      'key_env = "PAID_KEY"\nmax_concurrency = 2\n\n'
                      '[models.paid-reader]\nendpoint = "paid"\nmodel = "reader-1"\n'
                      'price_in = 1.0\nprice_out = 2.0\n')
    memory = shlex.join([sys.executable, str(PROCESS), "summarize-each"])
    return [sys.executable, "-m", "engine.cli", "--config", str(config), "--cache", str(tmp_path / "c.sqlite"),
            "run", "--book", "synaptic-echoes-short", "--models", "paid-reader", "--memory", "summaries",
            "--memory-command", f"summaries={memory}", "--judge", "builtin:judge", "--sample", str(SAMPLE),
            "--out", str(tmp_path / "out")]


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_stopped_run_resumes_without_paying_twice(tmp_path):
    environment = {**env(), "PAID_KEY": "sk-test-not-a-real-key"}
    with FaultServer(latency=0.15) as server:
        command = _command(tmp_path, server)
        first = subprocess.Popen(command, cwd=tmp_path, env=environment, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True,  # Ctrl-C's SIGINT, even when the suite is a
                                 preexec_fn=_sigint_default)         # background job (which ignores SIGINT)
        deadline = time.monotonic() + 240
        while server.stats.requests < 8 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first.poll() is None, first.communicate()[1]  # still ingesting: 19 chapters, one call each
        first.send_signal(signal.SIGINT)
        _, stopped = first.communicate(timeout=120)
        assert first.returncode == 130, stopped
        before = server.stats.requests
        assert 8 <= before < 19  # stopped mid-ingest
        server.latency = 0.0  # its 0.15 s kept the first run ingesting until the stop; the rerun needs none

        again = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr
        # Everything answered before the stop came back from the cache; at most the calls in
        # flight at the stop (one: the system summarizes one chapter at a time) were paid again.
        assert server.stats.paid_duplicates <= 1
        assert server.stats.requests <= 19 + SAMPLE + 1  # each chapter's summary and each answer, once
    results = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert len(results) == SAMPLE and all(r["f1"] is not None for r in results)
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    ingest = run["memory"]["summaries"]["phases"]["ingest"]
    assert ingest["calls"] == 19 and ingest["cached"] >= before - 1  # the rerun's ingest: mostly from the cache
    assert any(row["role"] == "memory summaries: ingest" for row in run["spending"])
    assert "sk-test-not-a-real-key" not in (tmp_path / "out" / "run.json").read_text()
