"""Messages that say what to do next, and commands that did nothing leave
nothing behind, through the CLI as a subprocess: the closest name to a
mistyped model alias, book, memory mode or command; a published book that is
not installed names `tulving data fetch`; a fetch that cannot download names
the way by hand and leaves no folder; a missing API key leaves no --out
folder and no entry in the spending ledger; Ctrl-C says how many replies
were kept and the rerun resumes from them, paying none twice."""
from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from engine.benchmark.release.layout import DOI_URL
from engine.loopback.server import LoopbackServer
from tests.report_runs import tulving
from tests.stalls import Stalls
from tests.test_cost_cli import write_config
from tests.test_trust import SERVED, env, run_cli


def _one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines[-1].startswith("tulving"), result.stderr
    assert "Traceback" not in result.stderr
    return lines[-1]


@pytest.mark.parametrize(("args", "guess"), [
    (["run", "--models", "gpt-6.1-sool", "--dry-run"], "did you mean 'gpt-6.1-sol'?"),
    (["run", "--book", "synaptic-echos", "--dry-run"], "did you mean 'synaptic-echoes'?"),
    (["run", "--modes", "rag-paragrph", "--dry-run"], "did you mean 'rag-paragraph'?"),
    (["rnu"], "did you mean 'run'?"),
    (["data", "fecth"], "did you mean 'fetch'?"),
    (["compare", "a", "b", "--get", "lattest"], "did you mean 'latest'?"),
])
def test_a_mistyped_name_is_answered_with_the_closest_known_one(tmp_path, args, guess):
    line = _one_error_line(tulving(tmp_path, *args))
    assert guess in line


def test_an_unknown_model_points_at_the_list_instead_of_printing_it(tmp_path):
    line = _one_error_line(tulving(tmp_path, "run", "--models", "gpt-6.1-sool", "--dry-run"))
    assert "`tulving models` lists the" in line and "claude-haiku-4-5" not in line and len(line) < 300


def test_a_published_book_that_is_not_installed_names_the_fetch(tmp_path):
    line = _one_error_line(tulving(tmp_path, "run", "--book", "synaptic-echoes-news", "--dry-run"))
    assert "is published but not installed" in line and "`tulving data fetch`" in line
    assert "`tulving data import FILE`" in line


def test_a_fetch_that_cannot_download_names_the_way_by_hand_and_leaves_no_folder(tmp_path):
    data = tmp_path / "xdg-data"
    result = subprocess_in(tmp_path, "data", "fetch", "--url", "http://127.0.0.1:9/release.zip",
                           XDG_DATA_HOME=str(data))
    line = _one_error_line(result)
    assert "cannot download" in line and DOI_URL in line and "`tulving data import FILE`" in line
    assert not (data / "tulving").exists()  # no empty release/ folder (nor its parent) left behind


def subprocess_in(cwd: Path, *args: str, **extra: str):
    import subprocess

    e = {k: v for k, v in env(cwd, **extra).items() if k != "TULVING_DATA"}
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, env=e, capture_output=True,
                          text=True, timeout=300)


def test_a_missing_key_leaves_no_out_folder_and_no_spending_entry(tmp_path):
    config = tmp_path / "tulving.toml"
    config.write_text('[endpoints.far]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
                      'key_env = "TULVING_TEST_UNSET_KEY"\n\n'
                      '[models.far-model]\nendpoint = "far"\nmodel = "m"\nprice_in = 1\nprice_out = 1\n')
    result = subprocess_in(tmp_path, "--config", str(config), "--cache", "c.sqlite", "run", "--models", "far-model",
                           "--modes", "in-context", "--out", "runs/far")
    line = _one_error_line(result)
    assert "needs an API key" in line and "TULVING_TEST_UNSET_KEY" in line
    assert not (tmp_path / "runs").exists()  # neither the --out folder nor the runs/ it was to go in
    spending = subprocess_in(tmp_path, "--cache", "c.sqlite", "cache", "spending")
    assert spending.returncode == 0 and "no spending recorded" in spending.stdout + spending.stderr


async def test_ctrl_c_says_how_many_replies_were_kept_and_the_rerun_pays_none_twice(tmp_path):
    latency = Stalls()
    latency.stall_after(4)  # then calls wait: Ctrl-C comes while some are in flight, however loaded the host
    async with LoopbackServer(models=SERVED, reply=lambda api, body: "an answer of a few words",
                              latency=latency) as server:
        config = write_config(tmp_path, server, concurrency=2)
        args = ["--config", str(config), "--cache", "c.sqlite", "run", "--book", "synaptic-echoes-short",
                "--models", "sonnet-loop", "--sample", "40", "--out", "runs/ctrl-c"]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "engine.cli", *args, cwd=tmp_path, env=env(tmp_path),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a background job ignores SIGINT
        for _ in range(3000):  # until 4 replies are out and 2 calls wait (concurrency 2); a deadlock guard
            if server.stats.requests >= 6:
                break
            await asyncio.sleep(0.05)
        assert server.stats.requests >= 6
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        sent_before = server.stats.requests
        latency.answer_all()  # the rerun is answered at once
        assert proc.returncode == 130, err
        last = err.decode().strip().splitlines()[-1]
        assert last.startswith("tulving: interrupted: the ") and "replies received are kept in the cache" in last
        kept = int(last.split("the ", 1)[1].split(" ", 1)[0].replace(",", ""))  # answers and their judgments
        # At least every answer but the 2 in flight (concurrency 2), plus the built-in judge's replies.
        assert kept >= sent_before - 2 and "rerun the same command to resume" in last
        assert not (tmp_path / "runs").exists()  # the run folder it made, empty, is gone
        code, _, err = await run_cli(tmp_path, *args, environ=env(tmp_path))
        assert code == 0, err
        # The answers received came from the cache: the rerun sent the rest of the 40, and again at
        # most the 2 that were in flight (concurrency 2) when Ctrl-C came.
        resent = sent_before + (server.stats.requests - sent_before) - 40
        assert server.stats.requests - sent_before < 40 and 0 <= resent <= 2
