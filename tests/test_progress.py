"""Progress display: every stream of one engine counts on one run-wide line;
off a terminal the engine ends with one plain final line (no carriage
returns). The terminal drawing is tested through the CLI under a
pseudo-terminal in tests/test_progress_cli.py."""
import asyncio

from engine.config import Config
from engine.progress import RunProgress, duration
from engine.requests import ChatRequest
from engine.scheduler import Engine


def _requests(n: int, prefix: str):
    return [ChatRequest("builtin:reader", [{"role": "user", "content": f"{prefix} question {i}?"}], tag=i)
            for i in range(n)]


async def test_concurrent_streams_and_rounds_count_on_one_line_that_never_restarts(tmp_path, capsys):
    path = str(tmp_path / "c.sqlite")
    async with Engine(Config.load(), cache_path=path, progress=True) as engine:
        async def drain(n, label):
            return [o async for o in engine.stream(_requests(n, label), label=label)]

        first, second = await asyncio.gather(drain(7, "alpha"), drain(5, "beta"))
        again = await drain(7, "alpha")  # a second round: the same requests, from the cache
        assert engine._progress.expected == 19 and engine._progress.done == 19
    assert len(first) == 7 and len(second) == 5 and all(o.cached for o in again)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert [line for line in err.splitlines() if " done | " in line] == [
        "total: 19 done | 12 calls, 7 cached | $0.0000 spent | 0s"]


async def test_a_run_counts_its_cache_hits_with_its_calls(tmp_path, capsys):
    """Engine.run counts a batch's hits together (scheduler._counted_batches):
    the stats and the line say the same as outcome by outcome would."""
    path = str(tmp_path / "c.sqlite")
    async with Engine(Config.load(), cache_path=path, progress=True) as engine:
        first = await engine.run(_requests(7, "alpha"), label="first")
        mixed = await engine.run(_requests(9, "alpha"), label="mixed")  # 7 hits, 2 calls
        assert engine._progress.done == 16 and engine._progress.cached == 7
        assert engine.stats.requests == 16 and engine.stats.cache_hits == 7 and engine.stats.calls == 9
    assert [o.cached for o in first] == [False] * 7 and [o.cached for o in mixed] == [True] * 7 + [False] * 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if " done | " in line] == [
        "total: 16 done | 9 calls, 7 cached | $0.0000 spent | 0s"]


def test_a_narrow_line_drops_the_elapsed_time_then_the_label_then_is_cut():
    progress = RunProgress(enabled=False)
    progress.stream_opened("a rather long label", 10)
    full = progress.line()
    assert full.startswith("a rather long label: 0/10 done (0%) | 0 calls, 0 cached | $0.0000 spent | ")
    assert progress.line(width=len(full)) == full.rsplit(" | ", 1)[0]
    assert progress.line(width=51) == "0/10 done (0%) | 0 calls, 0 cached | $0.0000 spent"
    assert progress.line(width=20) == "0/10 done (0%) | 0 "
    assert progress.line(width=len(full) + 1) == full


def test_durations_read_as_a_clock():
    assert [duration(s) for s in (0, 59.9, 61, 3599, 3600, 7322)] == ["0s", "59s", "1m01s", "59m59s", "1h00m",
                                                                       "2h02m"]


async def test_the_line_keeps_its_clock_while_a_long_call_is_out(tmp_path, capsys, monkeypatch):
    """RunProgress.heartbeat, run by the engine while it is open: off a
    terminal the plain line comes every $TULVING_PROGRESS_EVERY seconds even
    while no outcome arrives (a long call, a batch waiting), with the elapsed
    time going on; before, nothing was written until the call ended."""
    from engine.loopback.server import LoopbackServer, constant
    from tests.test_scheduler import SERVED, chat, make_config

    monkeypatch.setenv("TULVING_PROGRESS_EVERY", "0.3")
    async with LoopbackServer(in_process=True, models=SERVED, latency=constant(1.6)) as server:
        async with Engine(make_config(server), cache_path=str(tmp_path / "c.sqlite"), progress=True) as engine:
            [outcome] = await engine.run([chat(1)], label="slow")
    assert outcome.ok
    lines = [line for line in capsys.readouterr().err.splitlines() if " done" in line]
    waiting = [line for line in lines if line.startswith("slow: 0/1 done")]
    assert len(waiting) >= 3, lines  # 1.6 s of waiting, a line every 0.3 s
    assert waiting[-1].endswith(" | 1s")  # the clock went on while nothing arrived
    assert lines[-1].startswith("total: 1 done | 1 calls, 0 cached")
