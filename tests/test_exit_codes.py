"""Exit codes and error lines a script can trust, through the CLI as a
subprocess against tests/fault_server.py on loopback (engine/errors.py lists
the codes): 0 only when every planned answer and judgment exists."""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fault_server import FaultServer

ROOT = Path(__file__).resolve().parent.parent


def write_config(path: Path, base_url: str, endpoint: str = "", **model: object) -> Path:
    """A config of one endpoint "f" (more settings in `endpoint`, TOML lines) and one model "m"."""
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in model.items())
    path.write_text(f'[endpoints.f]\nkind = "openai"\nbase_url = "{base_url}"\nfree = true\nmax_attempts = 2\ntimeout = 5\n'
                    f'max_concurrency = 4\n{endpoint}[models.m]\nendpoint = "f"\nmodel = "fm"\n{extra}')
    return path


def cli(*args: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TULVING_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "engine.cli", "--quiet", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, **kwargs)


def test_a_run_whose_every_call_failed_exits_3_and_is_not_ranked(tmp_path):
    config = write_config(tmp_path / "c.toml", "http://127.0.0.1:9/v1")  # nothing listens on port 9
    done = cli("--config", str(config), "--cache", str(tmp_path / "c.sqlite"), "run", "--models", "m",
               "--sample", "3", "--out", str(tmp_path / "run"))
    assert done.returncode == 3, done.stderr
    assert "incomplete: 3 results missing, 3 calls failed (3 connection)" in done.stderr
    assert "rerun the same command" in done.stderr
    row = [line for line in done.stdout.splitlines() if line.startswith("-  m ")]
    assert row and "INCOMPLETE: 3/3 results missing" in row[0], done.stdout
    assert "INCOMPLETE" in (tmp_path / "run" / "report.md").read_text()


def test_a_run_that_completes_exits_0(tmp_path):
    with FaultServer() as server:
        config = write_config(tmp_path / "c.toml", server.openai_base_url)
        done = cli("--config", str(config), "--cache", str(tmp_path / "c.sqlite"), "run", "--models", "m",
                   "--sample", "3", "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert "INCOMPLETE" not in done.stdout


def test_a_run_stopped_by_max_cost_exits_4(tmp_path):
    with FaultServer() as server:
        config = write_config(tmp_path / "c.toml", server.openai_base_url, price_in=1000.0, price_out=1000.0)
        done = cli("--config", str(config), "--cache", str(tmp_path / "c.sqlite"), "run", "--models", "m",
                   "--sample", "3", "--out", str(tmp_path / "run"), "--max-cost", "0.01")
    assert done.returncode == 4, done.stderr
    assert "stopped by --max-cost 0.01" in done.stderr


def test_results_that_could_not_be_stored_exit_5(tmp_path):
    # A file-size limit (the disk-full stand-in that binds root too) stops the
    # cache's writes after its creation.
    cache = tmp_path / "c.sqlite"
    first = cli("--cache", str(cache), "run", "--models", "builtin:reader", "--sample", "1",
                "--out", str(tmp_path / "first"))
    assert first.returncode == 0, first.stderr
    limit = 40_960  # room for the -shm index (32 KB), not for the new rows in the WAL

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = cli("--cache", str(cache), "run", "--models", "builtin:reader", "--sample", "40",
               "--out", str(tmp_path / "second"), preexec_fn=small_files)
    assert done.returncode == 5, done.stderr
    assert "replies could not be stored in the cache" in done.stderr and "Traceback" not in done.stderr


def test_a_servers_terminal_controls_never_reach_the_terminal(tmp_path):
    with FaultServer({"401-ansi": 1.0}) as server:
        config = write_config(tmp_path / "c.toml", server.openai_base_url)
        done = cli("--config", str(config), "--cache", str(tmp_path / "c.sqlite"), "generate", "--events", "3",
                   "--model", "m", "--out", str(tmp_path / "book"))
    assert done.returncode == 2, done.stderr
    assert "\x1b" not in done.stderr and "\x07" not in done.stderr and "\r" not in done.stderr
    assert "\\x1b[2J" in done.stderr and "Invalid key." in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_generate_against_a_dead_server_says_the_model_could_not_be_reached(tmp_path):
    config = write_config(tmp_path / "c.toml", "http://127.0.0.1:9/v1")
    done = cli("--config", str(config), "--cache", str(tmp_path / "c.sqlite"), "generate", "--events", "3",
               "--model", "m", "--itermax", "1", "--out", str(tmp_path / "book"))
    assert done.returncode == 3, done.stderr
    assert "could not be reached" in done.stderr and "Chapter 1" not in done.stderr


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# A background job of a non-interactive shell (`tulving run ... &`, some CI
# runners) starts with SIGINT ignored: SIGTERM must still stop it (it used to
# go through SIGINT, and such a run went on to exit 0).
@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_sigterm_stops_like_ctrl_c_and_keeps_the_finished_calls(tmp_path, sigint):
    import sqlite3

    with FaultServer(latency=0.2) as server:
        config = write_config(tmp_path / "c.toml", server.openai_base_url)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "--quiet", "--config", str(config),
                                 "--cache", str(tmp_path / "c.sqlite"), "run", "--models", "m", "--sample", "200",
                                 "--out", str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env, preexec_fn=_ignore_sigint if sigint == "ignored" else None)
        deadline = time.monotonic() + 60
        while server.stats.by_kind["ok"] < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        answered = server.stats.by_kind["ok"]
    assert proc.returncode == 143, err
    assert "tulving: terminated" in err and "Traceback" not in err
    with sqlite3.connect(tmp_path / "c.sqlite") as conn:
        stored = conn.execute("SELECT count(*) FROM entries").fetchone()[0]
    # Every reply received was flushed to the cache (the server counts the
    # replies still in flight, at most max_concurrency = 4, which are lost).
    assert stored >= 4 and stored >= answered - 4


@pytest.mark.parametrize("key", ["e", "ab", "sk-test-1234567890"])
def test_a_short_key_is_masked_only_where_it_is_the_key(key):
    from providers.http_errors import redact

    message = f"unexpected token; your key {key} is invalid"
    masked = redact(message, key)
    assert key not in masked.split("your key ")[1].split()[0]
    assert masked.startswith("unexpected token")  # 'e' inside words is left alone


def test_a_run_through_a_429_storm_exits_0_with_the_fault_free_answers(tmp_path):
    def answers(folder: Path) -> list:
        return [(r["q_idx"], r["answer"], r["f1"]) for r in
                map(json.loads, (folder / "results.jsonl").read_text().splitlines())]

    # The storm's 429s ask for 1 s (retry-after: 1) or name no wait; max_retry_after caps the named wait at
    # 0.1 s, so the rounds of retries take tenths of a second (the cap itself: tests/test_gate.py).
    outcomes = {}
    for name, faults in (("clean", {}), ("storm", {"429": 0.3, "429-none": 0.1})):
        with FaultServer(faults, seed=6) as server:
            config = write_config(tmp_path / f"{name}.toml", server.openai_base_url, endpoint="max_retry_after = 0.1\n")
            done = cli("--config", str(config), "--cache", str(tmp_path / f"{name}.sqlite"), "run", "--models", "m",
                       "--sample", "12", "--out", str(tmp_path / name))
            assert done.returncode == 0, done.stderr
            if faults:
                assert server.stats.by_kind["429"] + server.stats.by_kind["429-none"] >= 3
                assert server.stats.paid_duplicates == 0
        outcomes[name] = answers(tmp_path / name)
    assert outcomes["storm"] == outcomes["clean"]
