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
    assert [line for line in err.splitlines() if line.startswith("total: ")] == [
        "total: 19 calls, 7 cached | $0.0000 spent | 0s"]


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
    assert [line for line in err.splitlines() if line.startswith("total: ")] == [
        "total: 16 calls, 7 cached | $0.0000 spent | 0s"]


def test_the_line_counts_the_whole_run_and_names_the_open_streams_last():
    """The count in front is the run's ("run:"), never one stream's: the
    streams open now come at the end ("now: ..."), and go first when the line
    is too narrow, then the elapsed time, then the head; then the end is cut."""
    progress = RunProgress(enabled=False)
    progress.stream_opened("a rather long label", 10)
    progress.stream_opened("another", 5)
    full = progress.line()
    assert full.startswith("run: 0/15 calls (0%), 0 cached | $0.0000 spent | ")
    assert full.endswith(" | now: a rather long label +1")
    without_label = full.rsplit(" | ", 1)[0]
    assert progress.line(width=len(full)) == without_label
    assert progress.line(width=len(without_label)) == without_label.rsplit(" | ", 1)[0]
    assert progress.line(width=46) == "0/15 calls (0%), 0 cached | $0.0000 spent"
    assert progress.line(width=20) == "0/15 calls (0%), 0 "
    assert progress.line(width=len(full) + 1) == full


def test_when_replies_stop_for_longer_than_the_rate_promised_the_eta_says_so(monkeypatch):
    """Fast calls, then slow ones (the built-in reader, then a local model):
    the rate of the fast ones promised "ETA 0s"; once no reply came for longer
    than that, the line says the ETA is unknown and for how long nothing came."""
    from engine import progress as P
    from engine.requests import Outcome

    clock = [100.0]
    monkeypatch.setattr(P.time, "monotonic", lambda: clock[0])
    line = RunProgress(enabled=False)
    line.expect(110)
    request = ChatRequest("builtin:reader", [{"role": "user", "content": "q"}])
    for _ in range(100):  # 100 replies over 2 s: 50/s
        clock[0] += 0.02
        line.advance(Outcome(request=request, result=None, cached=False))
        line._tick()
    assert "ETA 0s" in line.line()
    clock[0] += 30  # then nothing for 30 s
    line._tick()
    text = line.line()
    assert "ETA unknown, no reply for 30s" in text and "ETA 0s" not in text
    clock[0] += 60  # the last reply has left the rate's 30 s window: the rate is 0, and still no ETA
    line._tick()
    assert "ETA unknown, no reply for 1m30s" in line.line()


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
    lines = [line for line in capsys.readouterr().err.splitlines() if " calls" in line]
    waiting = [line for line in lines if line.startswith("run: 0/1 calls")]
    assert len(waiting) >= 3, lines  # 1.6 s of waiting, a line every 0.3 s
    assert waiting[-1].endswith(" | 1s | now: slow")  # the clock went on while nothing arrived
    assert lines[-1].startswith("total: 1 calls, 0 cached")


def test_replies_paid_but_not_yet_counted_are_named_once_they_wait(monkeypatch):
    """The budget counts a reply when it comes; the line counts its outcome when the
    run takes it. When the run is held up (the cache database away: the replies go to
    the spill file while the next lookups wait for the database), the paid replies
    not yet counted are named on the line, with what they cost, after 2 s of waiting,
    and no longer once counted."""
    from engine import progress as P
    from engine.budget import Budget
    from engine.requests import Outcome
    from providers.base import ChatResult

    clock = [100.0]
    monkeypatch.setattr(P.time, "monotonic", lambda: clock[0])
    alias = Config.load().alias("gpt-4o-mini")
    budget = Budget()
    line = RunProgress(enabled=False, budget=budget)
    line.expect(10)
    request = ChatRequest("gpt-4o-mini", [{"role": "user", "content": "q"}])
    replies = [ChatResult(text="a", input_tokens=1_000_000, output_tokens=0) for _ in range(5)]
    costs = [budget.settle(0.0, alias, reply) for reply in replies]  # five replies paid
    for reply, cost in zip(replies[:2], costs[:2], strict=True):     # two of them counted
        line.advance(Outcome(request=request, result=reply, cost=cost))
    assert "more answered" not in line.line()  # a moment's gap is not shown
    clock[0] += 2.5
    text = line.line()
    assert "2/10 calls (20%), 0 cached, 3 more answered (kept; not yet counted)" in text
    assert f"{P.usd(sum(costs))} spent" in text and sum(costs) > 0
    for reply, cost in zip(replies[2:], costs[2:], strict=True):
        line.advance(Outcome(request=request, result=reply, cost=cost))
    assert "more answered" not in line.line() and line.line().startswith("run: 5/10 calls (50%), 0 cached |")
