"""The batch ledger shared through PostgreSQL, by real `tulving run`
processes: a batch submitted by one (killed while it waits on the batch, as
a machine lost) is collected by another run in another folder, as on another
machine, not submitted again; every request is answered and paid once."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from engine.benchmark.evaluation.results import load_results
from tests.test_batch_mode import RUN, env, server_factory, write_config  # noqa: F401 -- server_factory: a fixture

POLL = "/v1/batches/{batch_id}"


def test_a_batch_submitted_by_one_process_is_collected_by_another(tmp_path, server_factory, pg_url):  # noqa: F811
    server = server_factory("--batch-polls", "100")  # the first run is killed after its 3rd poll
    write_config(tmp_path, server, batch_poll_max=0.02)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()

    def args(out: str) -> list[str]:
        return [sys.executable, "-m", "engine.cli", "--quiet", "--config", str(tmp_path / "tulving.toml"),
                "--cache", pg_url, *RUN, "--batch", "--out", out]

    # The killed run's claims lapse after their lease: 2 s here, not the default 30 s the second run waited.
    environ = {**env(), "TULVING_CACHE_LEASE": "2"}
    first = subprocess.Popen(args("out"), cwd=tmp_path / "a", env=environ, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the batch is recorded and being polled
        if server.batches("openai") and server.stats()["by_path"].get(POLL, 0) >= 3:
            break
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    assert len(server.batches("openai")) == 1
    second = subprocess.run(args("out"), cwd=tmp_path / "b", env=environ, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert len(server.batches("openai")) == 1  # collected, not submitted again
    assert server.stats()["batch_requests"] == {"succeeded": 456}  # each request answered (and paid) once
    assert len(load_results(tmp_path / "b" / "out" / "results.jsonl")) == 456
    engine = json.loads((tmp_path / "b" / "out" / "run.json").read_text())["engine"]
    assert engine["batches"] == 0 and engine["batches_resumed"] == 1 and engine["batched_calls"] == 0
