"""Progress display: concurrent streams of one engine share one display; off a
terminal, each stream ends with one plain summary line (no carriage returns)."""
import asyncio
import io

from engine.config import Config
from engine.progress import Progress
from engine.requests import ChatRequest, Outcome
from engine.scheduler import Engine


def _requests(n: int, prefix: str):
    return [ChatRequest("builtin:reader", [{"role": "user", "content": f"{prefix} question {i}?"}], tag=i)
            for i in range(n)]


async def test_concurrent_streams_print_one_summary_line_each_off_a_terminal(tmp_path, capsys):
    async with Engine(Config.load(), cache_path=str(tmp_path / "c.sqlite"), progress=True) as engine:
        async def drain(n, label):
            return [o async for o in engine.stream(_requests(n, label), label=label)]

        first, second = await asyncio.gather(drain(7, "alpha"), drain(5, "beta"))
    assert len(first) == 7 and len(second) == 5
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line]
    assert any(line.startswith("alpha: 7 done (0 cached, 0 errors)") for line in lines), err
    assert any(line.startswith("beta: 5 done (0 cached, 0 errors)") for line in lines), err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_streams_of_one_engine_share_one_live_line():
    class Stats:
        tokens_in, tokens_out = 1200, 34

    stats, term = Stats(), _Terminal()
    a = Progress(enabled=True, total=3, label="a", file=term, stats=stats)
    b = Progress(enabled=True, total=2, label="b", file=term, stats=stats)
    assert a._display is b._display  # one display for the engine's streams
    request = ChatRequest("m", [])
    for _ in range(3):
        a.advance(Outcome(request=request, cached=True))
    b.advance(Outcome(request=request))
    a._display.draw(force=True)
    shown = term.getvalue()
    assert "4/5" in shown and "cached=3" in shown and "tok_in=1,200" in shown
    a.close()
    b.close()
    other = Progress(enabled=True, total=1, label="c", file=term, stats=stats)
    assert other._display is not a._display  # closed displays are not reused
    other.close()
