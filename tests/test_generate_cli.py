"""`tulving generate` end to end (in the test's process, tests/cli.py; the killed run as a process): a small book with
builtin:writer, rerun from the cache, --events-only, --dry-run, errors, and a
run killed mid-way then resumed against the loopback HTTP server."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import sys
from pathlib import Path

import pytest

from engine.benchmark.builtin import writer as builtin_writer
from engine.benchmark.datadir import published_book_dir
from engine.benchmark.generation import load_book
from engine.cli.main import main
from engine.loopback.server import LoopbackServer
from tests import cli
from tests.stalls import Stalls

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["writer-http"]

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def tulving(*args: str, cwd: Path) -> cli.Done:
    """The command in this process (tests/cli.py); the killed run below is a real process."""
    return cli.tulving(cwd, *args, env=ENV)


def published_events(n: int) -> list[dict]:
    return json.loads((published_book_dir() / "events.json").read_text())[:n]


def test_generate_small_book_then_rerun_from_cache(tmp_path):
    cache = str(tmp_path / "cache.sqlite")
    out = tmp_path / "book20"
    first = tulving("--quiet", "--cache", cache, "generate", "--events", "20", "--model", "builtin:writer",
                    "--out", str(out), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    for name in ("book.txt", "chapters.json", "events.json", "meta_events.json", "book.json",
                 "generation_log.jsonl", "stats.json"):
        assert (out / name).is_file(), name
    book = load_book(out)
    assert book.events == published_events(20)
    assert book.metadata["model"] == "builtin:writer" and book.metadata["n_events"] == 20
    assert book.metadata["n_chapters"] == book.n_chapters and book.metadata["n_tokens"] == book.n_tokens
    log = [json.loads(line) for line in (out / "generation_log.jsonl").read_text().splitlines()]
    assert any(r["outcome"] != "valid" for r in log), "no flawed candidate: retry path not exercised"
    assert sum(r["outcome"] == "valid" for r in log) == book.n_chapters
    calls = int(first.stdout.split(" calls (0 cached)")[0].rsplit(" ", 1)[1])
    assert calls == len(log) + sum(r["outcome"] != "failed_exact" for r in log)
    text = (out / "book.txt").read_bytes()
    second = tulving("--quiet", "--cache", cache, "generate", "--events", "20", "--model", "builtin:writer",
                     "--out", str(out), cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert f"; {calls} calls ({calls} cached)" in second.stdout
    assert (out / "book.txt").read_bytes() == text


def test_book_stats_and_chrono_commands(tmp_path, capsys):
    out = tmp_path / "short"
    assert main(["book", "stats", "synaptic-echoes-short", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "date             8     4     1     0" in printed  # tab:geometric_actual, 20 events
    assert json.loads((out / "stats.json").read_text())["n_chapters"] == 19
    assert main(["book", "chrono", "synaptic-echoes-short", "--out", str(tmp_path / "chrono")]) == 0
    chrono = load_book(tmp_path / "chrono")
    assert chrono.n_chapters == 19 and chrono.chapters[0]["date"] == "March 23, 2024"


def test_events_only_and_dry_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "events"
    assert main(["--quiet", "--cache", str(tmp_path / "c.sqlite"), "generate", "--events", "200",
                 "--events-only", "--out", str(out)]) == 0
    assert json.loads((out / "events.json").read_text()) == published_events(200)
    assert (out / "meta_events.json").read_bytes() == (published_book_dir() / "meta_events.json").read_bytes()
    assert not (tmp_path / "c.sqlite").exists()  # no engine, no call
    capsys.readouterr()
    assert main(["--cache", str(tmp_path / "d.sqlite"), "generate", "--events", "5", "--model",
                 "builtin:writer", "--dry-run"]) == 0
    assert "about Ezra Edwards attending a parkour workshop." in capsys.readouterr().out
    assert not (tmp_path / "d.sqlite").exists()


@pytest.mark.parametrize("args, message", [
    (["--universe", "nowhere.json", "--events-only", "--out", "x"], "universe 'nowhere.json': no such file"),
    (["--events", "20", "--out", "x"], "generate needs --model"),
    (["--events", "20", "--model", "no-such-model", "--out", "x"], "unknown model 'no-such-model'"),
])
def test_bad_input_gives_one_line_errors(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)  # in-process: the same entry point as the console script
    code = main(["--quiet", "--cache", str(tmp_path / "c.sqlite"), "generate", *args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("tulving: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def _cache_entries(path: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            return conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
    except sqlite3.OperationalError:  # the file or its table not made yet
        return 0


async def test_killed_run_resumes_without_repeating_a_completed_call(tmp_path):
    def reply(api, body):
        return builtin_writer.respond(body["messages"], body)

    latency = Stalls()  # every reply at once, but for the run to be killed
    async with LoopbackServer(models=SERVED, reply=reply, latency=latency) as server:
        config = tmp_path / "loop.toml"
        config.write_text(f"""
[endpoints.loop]
kind = "openai"
base_url = "{server.openai_base_url}"
free = true
max_concurrency = 4

[models.loop-writer]
endpoint = "loop"
model = "writer-http"
params = {{ temperature = 1.0, max_tokens = 4096 }}
""")

        def command(cache: Path, out: Path) -> list[str]:
            return ["--quiet", "--config", str(config), "--cache", str(cache), "generate", "--events", "20",
                    "--model", "loop-writer", "--out", str(out)]

        async def start(cache: Path, out: Path):  # a process, to be killed
            return await asyncio.create_subprocess_exec(
                sys.executable, "-m", "engine.cli", *command(cache, out),
                cwd=tmp_path, env=ENV, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

        # reference: an uninterrupted run (in this process, tests/cli.py)
        done = await cli.atulving(tmp_path, *command(tmp_path / "ref.sqlite", tmp_path / "ref"), env=ENV)
        assert done.returncode == 0, done.stderr
        total = server.stats.by_path["/v1/chat/completions"]
        assert total > 20

        # killed once a dozen replies are in its cache and the calls after them wait (in flight)
        cache = tmp_path / "cache.sqlite"
        before = server.stats.by_path["/v1/chat/completions"]
        latency.stall_after(12)
        proc = await start(cache, tmp_path / "book")
        for _ in range(3000):  # a deadlock guard, not a bound
            if server.stats.by_path["/v1/chat/completions"] - before > 12 and _cache_entries(cache) >= 12:
                break
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        latency.answer_all()
        assert not (tmp_path / "book" / "book.txt").exists()
        kept = _cache_entries(cache)
        assert 0 < kept < total

        before = server.stats.by_path["/v1/chat/completions"]
        done = await cli.atulving(tmp_path, *command(cache, tmp_path / "book"), env=ENV)
        assert done.returncode == 0, done.stderr
        resumed = server.stats.by_path["/v1/chat/completions"] - before
        # every call completed (cached) before the kill is replayed, none is sent again
        assert resumed == total - kept
        assert f"; {resumed + kept} calls ({kept} cached)" in done.stdout
        assert (tmp_path / "book" / "book.txt").read_bytes() == (tmp_path / "ref" / "book.txt").read_bytes()


def test_dry_run_counts_what_the_cache_holds(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cache = str(tmp_path / "c.sqlite")
    assert main(["--quiet", "--cache", cache, "generate", "--events", "6", "--model", "builtin:writer",
                 "--out", str(tmp_path / "b6")]) == 0
    capsys.readouterr()
    assert main(["--cache", cache, "generate", "--events", "9", "--model", "builtin:writer", "--dry-run"]) == 0
    assert "9 first-candidate chapter calls (6 already cached)" in capsys.readouterr().out
