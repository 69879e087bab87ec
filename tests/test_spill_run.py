"""The cache database going away in the middle of a real `tulving run`
(PostgreSQL stopped with `pg_ctl stop -m fast` while the loopback server is
answering): no finished result is lost, and no call is paid twice.

- The server comes back within the outage window: the results kept in the
  spill file are written back by the run itself, which ends with exit 0;
  a rerun makes 0 calls.
- It stays away: the run ends with exit 5 and one line naming the spill file
  and the one command that stores it; once the server is back, that command
  stores it, and the calls still missing (with those in flight when it
  stopped, paid but never answered) are the only ones a rerun makes.
"""
from __future__ import annotations

import asyncio
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from cache.location import split_password
from engine.benchmark.evaluation.questions import write_questions
from engine.loopback.server import LoopbackServer
from tests.pg_cluster import Cluster
from tests.test_run_cli import REPO, env
from tests.test_shared_cache import QUESTIONS, SERVED, _calls, questions, run, start  # noqa: F401 -- questions: a fixture

pytestmark = pytest.mark.usefixtures("questions")  # q.jsonl: 30 questions of the short book

FAST = 8  # answered at once; the replies after them are held until the database has stopped


def _config(tmp_path: Path, server: LoopbackServer) -> Path:
    path = tmp_path / "tulving.toml"
    path.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\nmax_concurrency = 2\n\n'
                    '[models.loop-reader]\nendpoint = "loop"\nmodel = "reader"\n')
    return path


class HeldLoopback(LoopbackServer):
    """The loopback server: the first FAST replies at once, every later one
    held until `release()` (then all at once). The test releases them once
    the database has stopped, so the calls in flight at the stop are paid
    and answered while it is away, however loaded the machine (a fixed
    latency had to outlast the stop)."""

    def __init__(self) -> None:
        super().__init__(models=SERVED)
        self.replies = 0
        self._released = asyncio.Event()

    def release(self) -> None:
        self._released.set()

    async def _plain_reply(self, *args: Any, **kwargs: Any) -> web.StreamResponse:
        self.replies += 1
        if self.replies > FAST:
            await self._released.wait()
        return await super()._plain_reply(*args, **kwargs)


async def _stop_mid_run(server: HeldLoopback, cluster: Cluster) -> None:
    """The fast replies are stored and a held call is in flight: the database
    stops (as an administrator stops it), then the held replies go out."""
    for _ in range(3000):
        if server.stats.requests > FAST:
            break
        await asyncio.sleep(0.05)
    assert server.stats.requests > FAST
    await asyncio.to_thread(cluster.stop, "fast")
    server.release()


async def _stderr_until(proc: asyncio.subprocess.Process, text: str) -> list[str]:
    """The process's stderr lines up to the first holding `text` (the rest stays to be read)."""
    assert proc.stderr is not None
    lines: list[str] = []
    while not lines or text not in lines[-1]:
        line = await asyncio.wait_for(proc.stderr.readline(), 300)  # a deadlock guard, not a bound
        assert line, "".join(lines)  # stderr closed without it
        lines.append(line.decode())
    return lines


async def test_the_database_back_within_the_window_gets_the_spill_written_back(own_pg_cluster, tmp_path):
    url = own_pg_cluster.url
    async with HeldLoopback() as server:
        config = _config(tmp_path, server)
        first = await start(tmp_path, url, config, "first", environ={"TULVING_CACHE_OUTAGE": "120"})
        await _stop_mid_run(server, own_pg_cluster)
        # The held replies arrive while it is away: they go to the spill file, then it comes back.
        kept = await _stderr_until(first, "results are kept in")
        await asyncio.to_thread(own_pg_cluster.start)
        _, rest = await asyncio.wait_for(first.communicate(), 300)
        code, err = first.returncode, "".join(kept) + rest.decode()
        assert code == 0, err
        assert "results are kept in" in err and "written back" in err  # the spill was used, then emptied
        assert not list((tmp_path / "first").glob("tulving-spill-*"))
        assert server.stats.requests == QUESTIONS
        code, _, err = await run(tmp_path, url, config, "rerun")
        assert code == 0, err
        assert _calls(tmp_path, "rerun") == 0 and server.stats.requests == QUESTIONS


async def test_the_database_that_stays_away_ends_the_run_with_exit_5_and_the_command(own_pg_cluster, tmp_path,
                                                                                      short_questions):
    # More questions than the engine usually pulls ahead (its window), so the
    # ones pulled after the database stopped need it (lookups and claims).
    many = 120
    write_questions(tmp_path / "q.jsonl", short_questions[:many])
    url = own_pg_cluster.url
    password = split_password(url)[1]
    assert password
    async with HeldLoopback() as server:
        config = _config(tmp_path, server)
        first = asyncio.ensure_future(run(tmp_path, url, config, "first", environ={"TULVING_CACHE_OUTAGE": "2"}))
        await _stop_mid_run(server, own_pg_cluster)
        # The held replies and the next ones are answered at once (kept in the spill file) until the
        # run needs the database again and its outage window ends it.
        code, _, err = await first
        paid, first_err = server.stats.requests, err
        gone = server.stats.by_status["client_gone"]  # in flight when the run stopped: paid, never answered
        assert code == 5, err
        [line] = [x for x in err.splitlines() if x.startswith("tulving: error:")]
        found = re.search(r"store them with `(tulving cache copy (\S+) (\S+))`", line)
        assert found, line
        spill = tmp_path / found.group(2)
        assert spill.parent == tmp_path / "first" and spill.exists()
        assert password not in err and found.group(3) == split_password(url)[0]
        await asyncio.to_thread(own_pg_cluster.start)
        command = shlex.split(found.group(1))[1:]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "engine.cli", *command, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO), "PGPASSWORD": password},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, copy_err = await proc.communicate()
        assert proc.returncode == 0, copy_err.decode()
        code, _, err = await run(tmp_path, url, config, "rerun")
        assert code == 0, err
        # every result the first run was paid for was kept: the rerun pays only for the others
        # Whether some questions were never sent depends on how many the engine
        # had pulled (and claimed) before the stop: its window grows with the
        # endpoints open, and the judge round needs the database only after the
        # answers. Either way, nothing paid is lost or paid again.
        assert FAST < paid <= many and server.stats.requests == many + gone, (first_err, out.decode())
        code, _, err = await run(tmp_path, url, config, "again")
        assert code == 0, err
        assert _calls(tmp_path, "again") == 0


async def test_rerunning_the_same_command_writes_the_spill_back_first_and_pays_nothing_twice(
        own_pg_cluster, tmp_path, short_questions):
    # As above, but the user simply reruns the same command (same --out, the spill file beside it).
    many = 120
    write_questions(tmp_path / "q.jsonl", short_questions[:many])
    url = own_pg_cluster.url
    async with HeldLoopback() as server:
        config = _config(tmp_path, server)
        first = asyncio.ensure_future(run(tmp_path, url, config, "first", environ={"TULVING_CACHE_OUTAGE": "2"}))
        await _stop_mid_run(server, own_pg_cluster)
        code, _, err = await first
        paid = server.stats.requests
        gone = server.stats.by_status["client_gone"]  # in flight when the run stopped: paid, never answered
        assert code == 5, err
        [line] = [x for x in err.splitlines() if x.startswith("tulving: error:")]
        # The time it really waited, from the first refusal to giving up (at least the outage window).
        waited = re.search(r"gave up after (\d+) s without an answer", line)
        assert waited and int(waited.group(1)) >= 2, line
        assert "rerun the same command once it is back" in line
        [spill] = (tmp_path / "first").glob("tulving-spill-*.sqlite")
        await asyncio.to_thread(own_pg_cluster.start)
        code, _, err = await run(tmp_path, url, config, "first")
        assert code == 0, err
        said = [x for x in err.splitlines() if "wrote back" in x and "an earlier run kept" in x]
        assert len(said) == 1 and spill.name in said[0], err
        assert not spill.exists()
        # Every result the first run was paid for counted: the rerun paid only for the others.
        assert FAST < paid <= many and server.stats.requests == many + gone, err


async def test_the_progress_line_never_counts_more_than_was_paid_while_the_database_is_away(
        own_pg_cluster, tmp_path, short_questions):
    # The run's progress line (plain, off a terminal) while the database is away: the replies that
    # come meanwhile are paid and kept in the spill file; what the line counts and names as kept
    # never exceeds what was paid.
    write_questions(tmp_path / "q.jsonl", short_questions[:120])
    async with HeldLoopback() as server:
        config = _config(tmp_path, server)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "engine.cli", "--config", str(config), "--cache", own_pg_cluster.url, "run",
            "--questions", "q.jsonl", "--models", "loop-reader", "--modes", "in-context", "--judge", "builtin:judge",
            "--out", "first", cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**env(), "TULVING_CACHE_OUTAGE": "2", "TULVING_PROGRESS_EVERY": "0.5"})
        await _stop_mid_run(server, own_pg_cluster)
        _, err_bytes = await asyncio.wait_for(proc.communicate(), 300)
        paid = server.stats.requests
    err = err_bytes.decode()
    assert proc.returncode == 5, err
    shown = [re.search(r"^run: (\d+)/\d+ calls .*?(?:, (\d+) more answered \(kept; not yet counted\))?"
                       r" \|", x) for x in err.splitlines() if x.startswith("run: ")]
    figures = [(int(m.group(1)), int(m.group(2) or 0)) for m in shown if m]
    # Never more than was paid: each answer the loopback was paid for, and its judgment (the
    # built-in judge, in this process). Whether the run stands still long enough for the line
    # to name paid answers as kept depends on how the outage unfolds (the spill may take them
    # first, or the line stop while the lookups wait): that rule is tested on a clock of its
    # own (tests/test_progress.py).
    assert figures and all(counted + more <= 2 * paid for counted, more in figures), (paid, figures)
    assert re.search(r"\d+ results of this run are kept in", err), err
