"""The run-wide progress line (engine/progress.py), through the CLI as a
subprocess on the loopback: under a pseudo-terminal it is one line redrawn in
place (no blank lines, counts that never go back across rounds and phases, a
notice printed whole above it, a final line with the calls and the spend);
without a terminal, plain lines and no carriage return; --quiet, none."""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import struct
import sys
import termios
from pathlib import Path

from engine.loopback.server import Faults, LoopbackServer, constant
from engine.progress import EVERY_ENV, usd
from tests.test_cost_cli import write_config
from tests.test_trust import SERVED, env

RUN = ["run", "--book", "synaptic-echoes-short", "--models", "sonnet-loop,gpt4o-loop", "--sample", "12",
       "--out", "run"]
# "run: 12/40 calls (30%), 2 cached | $0.0100 spent, cap ... | 3.1/s ETA 4s | 3s | now: <label>"; the final
# "total: 40 calls, 2 cached | $0.0100 spent | 5s". A call is counted whoever answers it, cached ones among them.
LINE = re.compile(r"^((?P<head>run|total): )?(?P<done>[\d,]+)(/(?P<total>[\d,]+))? calls( \(\d+%\))?, "
                  r"(?P<cached>[\d,]+) cached(, [\d,]+ failed)?(, [\d,]+ not sent \(--max-cost\))? \| "
                  r"(?P<spent>\$[\d,.]+) spent.*?( \| now: (?P<label>.+))?$")
CLEAR = "\x1b[K"


def _n(text: str) -> int:
    return int(text.replace(",", ""))


async def run_in_pty(cwd: Path, *args: str, environ: dict[str, str], columns: int = 200) -> tuple[int, str, str]:
    """(exit code, stdout, what was drawn on the terminal that stderr is)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "engine.cli", *args, cwd=cwd, env=environ,
                                                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=slave)
    os.close(slave)
    drawn = bytearray()
    loop = asyncio.get_running_loop()

    def read_all() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child's side is closed
                return
            if not chunk:
                return
            drawn.extend(chunk)

    reader = loop.run_in_executor(None, read_all)
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    await asyncio.wait_for(reader, 60)
    os.close(master)
    # The terminal turns each "\n" into "\r\n" (onlcr): back to what the program wrote.
    return proc.returncode or 0, out.decode(), drawn.decode().replace("\r\n", "\n")


async def run_piped(cwd: Path, *args: str, environ: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "engine.cli", *args, cwd=cwd, env=environ,
                                                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    return proc.returncode or 0, out.decode(), err.decode()


def screen_lines(drawn: str) -> list[str]:
    """What each line of the terminal shows at the end: the last thing drawn after its last \\r."""
    lines = drawn.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the text ended with a newline
    return [line.split("\r")[-1].replace(CLEAR, "") for line in lines]


def drawings(drawn: str) -> list[re.Match[str]]:
    """Every progress line drawn, in order (a redraw starts with \\r)."""
    found = []
    for piece in re.split(r"[\r\n]", drawn):
        m = LINE.match(piece.replace(CLEAR, ""))
        if m:
            found.append(m)
    return found


def assert_never_back(lines: list[re.Match[str]]) -> None:
    """Counts only grow, across rounds and phases; every line but the final one shows done/total."""
    for key in ("done", "cached"):
        values = [_n(m[key]) for m in lines]
        assert values == sorted(values), (key, values)
    running = [m for m in lines if m["head"] != "total"]
    assert all(m["total"] is not None and _n(m["done"]) <= _n(m["total"]) for m in running)
    totals = [_n(m["total"]) for m in running]
    assert totals == sorted(totals), totals
    assert lines[-1]["head"] == "total" and lines[-1]["total"] is None and lines[-1]["label"] is None


def run_totals(folder: Path) -> tuple[int, int, float]:
    """(calls, of which cached, USD spent) of this invocation, from run.json: the summary's figures."""
    run = json.loads((folder / "run.json").read_text())
    rows = run["spending_this_invocation"]
    return sum(r["calls"] for r in rows), sum(r["cached"] for r in rows), sum(r["spent_usd"] for r in rows)


async def test_on_a_terminal_one_line_is_redrawn_in_place_across_phases_then_closed_with_the_totals(tmp_path):
    # The 12th call is rate-limited and asked to wait an hour: the engine waits max_retry_after (0.1 s) instead
    # and says so, while the line is drawn. (The wait announced by itself, NOTICE_WAIT or longer: tests/test_gate.py.)
    faults = Faults(schedule=[None] * 11 + ["429"], try_again=3600.0)
    async with LoopbackServer(models=SERVED, reply=lambda api, body: "an answer of a few words",
                              latency=constant(0.05), faults=faults) as server:
        config = write_config(tmp_path, server, concurrency=4, endpoint="max_retry_after = 0.1\n")
        args = ["--config", str(config), "--cache", "c.sqlite", "--max-cost", "50", *RUN]
        code, out, drawn = await run_in_pty(tmp_path, *args, environ=env(tmp_path))
        assert code == 0, drawn
        calls, cached, spent = run_totals(tmp_path / "run")
        # The same run again: every answer from the cache, counted apart from calls; TERM=dumb: no escapes.
        code, _, again = await run_in_pty(tmp_path, *args, environ=env(tmp_path, TERM="dumb"))
        assert code == 0, again

    shown = screen_lines(drawn)
    assert all(line.strip() for line in shown), shown  # no blank line, nothing left behind
    lines = drawings(drawn)
    assert len(lines) >= 3 and "\r" in drawn
    assert_never_back(lines)
    # One line for the whole run: the first drawing already knows both models' answers and judgments.
    assert _n(lines[0]["total"]) >= 2 * 2 * 12
    # The streams open now are named at the end, after the run-wide count, and change in place.
    assert all(m["head"] == "run" for m in lines[:-1]) and len({m["label"] for m in lines[:-1]}) >= 2
    # The notice is a line of its own, not glued to a half-drawn progress line.
    [notice] = [line for line in shown if "HTTP 429" in line]
    assert re.fullmatch(r"tulving: (ant|oai) asked to wait 3,600 s before retrying \(HTTP 429\); "
                        r"waiting 0\.1 s instead \(max_retry_after\)", notice), notice
    # The final line: every call and the spend, with the cap.
    progress_lines = [line for line in shown if LINE.match(line)]
    final = LINE.match(progress_lines[-1])
    assert final is not None and final["head"] == "total"
    assert (_n(final["done"]), _n(final["cached"])) == (calls, cached) and calls > cached
    assert final["spent"] == usd(spent) and spent > 0 and "cap $50.00 (" in progress_lines[-1]
    assert drawn.endswith("\n") and not drawn.endswith("\n\n")
    assert len(progress_lines) == 1  # only the final one stays on the screen

    assert CLEAR not in again and "\x1b" not in again
    assert all(line.strip() for line in screen_lines(again))
    final = LINE.match([line for line in screen_lines(again) if LINE.match(line)][-1])
    assert final is not None and final["head"] == "total"
    assert _n(final["done"]) == _n(final["cached"]) == calls and final["spent"] == usd(0.0)


async def test_a_shorter_line_leaves_nothing_of_the_longer_one_on_a_dumb_terminal(tmp_path):
    e = env(tmp_path, TERM="dumb")
    code, _, drawn = await run_in_pty(tmp_path, "--cache", "c.sqlite", "generate", "--events", "30", "--model",
                                      "builtin:writer", "--out", "book", environ=e, columns=80)
    assert code == 0, drawn
    # Every redraw pads over what the line before it showed: no character of it survives.
    previous = ""
    for piece in drawn.split("\r")[1:]:
        text = piece.split("\n")[0]
        assert len(text) >= len(previous.rstrip()), (previous, text)
        assert len(text) <= 79  # cut to the terminal's width: never wrapped
        previous = "" if "\n" in piece or not text.strip() else text  # a new line, or one cleared
    lines = drawings(drawn)
    assert_never_back(lines)
    # A chapter call and its check per event, known before the first is sent (retries come on top).
    assert _n(lines[0]["total"]) >= 60 and _n(lines[-1]["done"]) >= 60
    # Too narrow for the whole line: the open streams, then the elapsed time, go before the counts and the spend.
    assert any(m["head"] == "run" and m["label"] is None for m in lines)


async def test_without_a_terminal_plain_lines_and_no_carriage_return(tmp_path):
    # 24 answers two at a time, 0.02 s each: a line every 0.05 s draws several while they run.
    async with LoopbackServer(models=SERVED, reply=lambda api, body: "an answer of a few words",
                              latency=constant(0.02)) as server:
        config = write_config(tmp_path, server, concurrency=2)
        base = ["--config", str(config), "--cache", "c.sqlite"]
        code, _, err = await run_piped(tmp_path, *base, *RUN, environ=env(tmp_path, **{EVERY_ENV: "0.05"}))
        assert code == 0, err
        calls, cached, spent = run_totals(tmp_path / "run")
        code, _, quiet = await run_piped(tmp_path, "--quiet", *base, *RUN[:-1], "quiet",
                                         environ=env(tmp_path, **{EVERY_ENV: "0.05"}))
        assert code == 0, quiet
    assert "\r" not in err and "\x1b" not in err
    lines = [LINE.match(line) for line in err.splitlines() if LINE.match(line)]
    assert len(lines) >= 2  # lines while it runs, then the final one
    assert_never_back(lines)  # type: ignore[arg-type]
    final = lines[-1]
    assert final is not None and final["head"] == "total"
    assert (_n(final["done"]), _n(final["cached"]), final["spent"]) == (calls, cached, usd(spent))
    assert not any(LINE.match(line) for line in quiet.splitlines()) and "\r" not in quiet
    # A cadence that is not a number of seconds: one line, before any call.
    code, _, err = await run_piped(tmp_path, "--cache", "c.sqlite", "run", "--book", "synaptic-echoes-short",
                                   "--models", "builtin:reader", "--sample", "3", "--out", "bad",
                                   environ=env(tmp_path, **{EVERY_ENV: "soon"}))
    assert code == 2 and err.count("\n") == 1 and EVERY_ENV in err and "'soon'" in err, err
    assert not (tmp_path / "bad" / "results.jsonl").exists()
