"""One run-wide progress line on stderr for everything an engine does.

Every stream of an engine (each model x mode, its judge rounds, the
embeddings, the repeats, the batches of `tulving generate`) feeds the
engine's one `RunProgress`, so the counts run across rounds and phases and
never restart; only the label in front (the open streams) changes in place.

- The total is the work declared up front (`expect`: the answer calls of
  every model x mode and their judge calls; two calls per event for
  `generate`) plus the requests of streams that know their length (the
  embeddings). Re-draws and retries come on top: the total grows with them.
- The counts use the run's one vocabulary (docs/reports.md, "What the
  counts mean"): a *call* is one thing asked of a model (an answer, a
  judgment, a batch of embeddings), whoever answers it; *cached* are the
  calls answered without sending anything (by Tulving's cache, or by an
  identical call of this run in flight); *failed* and *not sent* (kept back
  by --max-cost) are calls too. The line is the whole run's: it starts with
  `run:` and names the streams open now at its end (`now: ...`), never in
  front of the count.
- The ETA comes from the rate of the last ~30 s; when no reply has come for
  longer than that ETA (the last calls are slow ones: a local model after
  the built-in reader), it says so instead of counting down a wrong figure.
  The spend is what this invocation's calls cost, with what is left under
  --max-cost when there is a cap, counted at each reply (the budget's).
- Replies the budget has settled that no outcome has counted yet (the run
  held up: the cache database away, its results kept in the spill file while
  the next lookups wait for it) are named after 2 s: "4 more answered".
- On a terminal the line is redrawn in place (`\\r`, then the rest of the
  line cleared; padded with spaces instead on TERM=dumb), cut to the
  terminal's width so it never wraps, at most 10 times a second. A line
  anything else writes to stderr meanwhile (a notice, a warning, a log
  record) clears it first and redraws it after. `close` leaves the final
  line and one newline; `abandon` (the run ends with an error) takes the
  line off and prints none, so the error is the one line left.
- Off a terminal (CI, a log file): a plain line every 10 s at most
  ($TULVING_PROGRESS_EVERY seconds), and the final line; never a `\\r`.
- While nothing arrives (a long call, a batch waiting for its provider) the
  clock keeps going: `heartbeat` redraws the line every second, or writes
  the plain line when its time comes.

The engine calls `advance()` once per outcome (tens of thousands of times a
second on a cached rerun), so it counts and draws only when it is time.
No colour is used (NO_COLOR has nothing to turn off).
"""
from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import deque
from typing import Protocol, TextIO

from engine.errors import printable
from engine.requests import Outcome
from providers.base import BUDGET, TulvingError

EVERY_ENV = "TULVING_PROGRESS_EVERY"
PLAIN_EVERY = 10.0       # seconds between plain lines off a terminal
_REDRAW_EVERY = 0.1      # seconds between redraws on a terminal
_HEARTBEAT = 1.0         # seconds between redraws while no outcome arrives
_RATE_WINDOW = 30.0      # the ETA's rate: completions over the last 30 s
_SAMPLE_EVERY = 0.5
_FAST_SKIP = 100
_HELD_SHOWN = 2.0        # seconds paid replies wait uncounted before the line names them
CLEAR_TO_EOL = "\x1b[K"


class Cap(Protocol):
    """What the line reads of the run's budget (engine/budget.py)."""

    max_cost: float | None
    spent: float

    def paid(self) -> tuple[float, int]: ...  # this invocation's (USD, calls answered), counted at the reply


def plain_every() -> float:
    """Seconds between plain lines off a terminal: $TULVING_PROGRESS_EVERY, else 10.
    Raises TulvingError (one line) for a value that is not a number of seconds."""
    raw = os.environ.get(EVERY_ENV, "").strip()
    if not raw:
        return PLAIN_EVERY
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise TulvingError(f"${EVERY_ENV} must be a number of seconds (0 or more), not {printable(raw)!r}")
    return value


def duration(seconds: float) -> str:
    """`45s`, `3m05s`, `2h07m`."""
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def usd(amount: float) -> str:
    return f"${amount:,.4f}" if amount < 1 else f"${amount:,.2f}"


class RunProgress:
    """The progress of everything one engine runs (see the module docstring)."""

    def __init__(self, *, enabled: bool, budget: Cap | None = None, file: TextIO | None = None) -> None:
        self.enabled = enabled
        self.file = file or sys.stderr
        self.live = enabled and _isatty(self.file)
        self.dumb = os.environ.get("TERM", "") == "dumb"
        self.every = plain_every() if enabled else PLAIN_EVERY
        self.budget = budget
        self.expected = 0
        self.done = self.cached = self.failed = self.not_sent = 0
        self.answered = 0        # counted outcomes that were paid replies (the budget counts them at the reply)
        self._held_since: float | None = None  # when paid replies began to wait for their count
        self.spent = 0.0
        self.labels: list[str] = []
        self.started: float | None = None
        self._samples: deque[tuple[float, int]] = deque()
        self._next_draw = self._next_plain = self._next_sample = 0.0
        self._shown = 0          # characters of the live line on screen (0: none)
        self._held = False       # someone else's partial line is on screen: no redraw until its newline
        self._guard: _StderrGuard | None = None
        self._skip = 0           # outcomes to count before the clock is read again
        self._last_tick = 0.0
        self._seen_done = 0      # the count when the clock last saw it change, and when
        self._changed_at = 0.0

    # -- what the engine and its callers tell ---------------------------------------------
    def expect(self, calls: int) -> None:
        """`calls` more are planned (declared up front, before their streams open)."""
        self._start()
        self.expected += max(0, calls)

    def stream_opened(self, label: str, total: int | None) -> None:
        self._start()
        self.labels.append(label)
        self.expected += total or 0
        self._tick(force=True)

    def stream_closed(self, label: str) -> None:
        if label in self.labels:
            self.labels.remove(label)

    def advance(self, outcome: Outcome) -> None:
        self.done += 1
        if outcome.cached or outcome.joined:  # no call of its own (as engine/spending.py counts it)
            self.cached += 1
        elif outcome.error is None:
            self.spent += outcome.cost
            self.answered += 1
        elif outcome.error.kind == BUDGET:
            self.not_sent += 1
        else:
            self.spent += outcome.cost
            self.failed += 1
            self.answered += outcome.cost > 0  # billed without an answer (a batch line): paid all the same
        self._skip -= 1
        if self._skip < 0 and self.enabled:
            self._tick()

    def advance_cached(self, count: int) -> None:
        """`advance` for `count` cache hits at once (a cached rerun's lookup)."""
        self.done += count
        self.cached += count
        self._skip -= count
        if self._skip < 0 and self.enabled:
            self._tick()

    async def heartbeat(self) -> None:
        """Until cancelled: the line's clock kept going while nothing arrives
        (a long call, a batch waiting for its provider), redrawn every second
        on a terminal, a plain line every `every` seconds elsewhere; the engine
        runs it while it is open."""
        pause = _HEARTBEAT if self.live else max(min(self.every, _HEARTBEAT), _REDRAW_EVERY)
        while True:
            await asyncio.sleep(pause)
            if self.started is not None:
                self._tick()

    def notice(self, message: str, *, always: bool = False) -> None:
        """`tulving: MESSAGE` on its own line, above the live line (control
        characters escaped); `always`: even with the line off (--quiet), for
        what the user must read (an error)."""
        if self.enabled or always:
            self.write_line(f"tulving: {printable(message)}")

    def write_line(self, text: str) -> None:
        """A line of text on the progress line's file; the live line is cleared and redrawn around it."""
        try:
            self.clear()
            self.file.write(text + "\n")
            self.file.flush()
            self.redraw()
        except (OSError, ValueError):  # stderr closed or gone: not worth a crash
            pass

    def close(self) -> None:
        """The final line (and, on a terminal, its newline); stderr given back."""
        if not self.enabled or self.started is None:
            return
        self.labels.clear()
        try:
            if self.live:
                self._draw(final=True)
                self.file.write("\n")
                self._shown = 0
            else:
                self.file.write(self.line(final=True) + "\n")
            self.file.flush()
        except (OSError, ValueError):
            pass
        finally:
            self._stop()

    def abandon(self) -> None:
        """The run ends with an error: the live line is taken off, no final
        line is printed, so the error is the one line the user reads."""
        try:
            self.clear()
            self.file.flush()
        except (OSError, ValueError):
            pass
        finally:
            self._stop()

    def _stop(self) -> None:
        self.started = None
        if self._guard is not None and sys.stderr is self._guard:
            sys.stderr = self._guard.real
        self._guard = None

    # -- the line -------------------------------------------------------------------------
    def line(self, *, final: bool = False, width: int = 0) -> str:
        """The line; within `width` columns when given (0: any length): the
        streams open now go first, then the elapsed time, then the `run:`
        head, then the end is cut."""
        now = time.monotonic()
        parts = [self._counts(final), self._money()]
        rate = None if final else self._rate(now)
        if rate is not None:
            parts.append(self._eta(rate, now))
        body = " | ".join(parts)
        head = "total" if final else "run"
        elapsed = duration(now - (self.started or now))
        now_open = "" if final else self._label()
        candidates = [f"{head}: {body} | {elapsed}", f"{head}: {body}", body]
        if now_open:
            candidates.insert(0, f"{head}: {body} | {elapsed} | {now_open}")
        for candidate in candidates:
            if not width or len(candidate) < width:
                return candidate
        return body[:width - 1]

    def _counts(self, final: bool) -> str:
        """"1,880/1,889 calls (99%), 629 cached": every call of the run, the
        cached ones among them. The final count stands alone: the total was
        an upper bound (a chronological judgment is asked only of answers that
        name items), and the run says itself what was not needed."""
        if final:
            text = f"{self.done:,} calls"
        else:
            total = max(self.expected, self.done)
            text = f"{self.done:,}/{total:,} calls" + (f" ({100 * self.done // total}%)" if total else "")
        text += f", {self.cached:,} cached"
        if self.failed:
            text += f", {self.failed:,} failed"
        if self.not_sent:
            text += f", {self.not_sent:,} not sent (--max-cost)"
        held = 0 if final else self._paid_uncounted(time.monotonic())
        if held:
            text += f", {held:,} more answered (kept; not yet counted)"
        return text

    def _paid_uncounted(self, now: float) -> int:
        """Replies paid for that no outcome has counted yet, once they have waited `_HELD_SHOWN` s: the
        run is held up elsewhere (the cache database away, its results kept in the spill file, and
        the lookups of the next requests waiting for it); a moment's gap in a busy run is not shown."""
        held = max(0, self.budget.paid()[1] - self.answered) if self.budget is not None else 0
        if not held:
            self._held_since = None
            return 0
        if self._held_since is None:
            self._held_since = now
        # Shown once replies have been paid ahead of their outcomes, and no outcome has been
        # counted, for _HELD_SHOWN s: in a busy run a few replies are always a moment ahead.
        since = max(self._held_since, self._changed_at)
        return held if now - since >= _HELD_SHOWN else 0

    def _eta(self, rate: float, now: float) -> str:
        """"12.5/s ETA 40s"; "ETA unknown, no reply for 25s" when the replies
        stopped for longer than the rate promised (slow calls at the end)."""
        remaining = max(self.expected, self.done) - self.done
        if not remaining:
            return f"{rate:,.1f}/s"
        quiet = now - self._changed_at if self._changed_at else 0.0
        eta = remaining / rate if rate > 0 else 0.0
        if quiet >= max(2 * eta, 5.0):  # the rate is of calls that are over: it says nothing of these
            return f"ETA unknown, no reply for {duration(quiet)}"
        return f"{rate:,.1f}/s ETA {duration(eta)}" if rate > 0 else f"{rate:,.1f}/s"

    def _label(self) -> str:
        """The streams open now ("now: local:smollm2 / rag-paragraph +1"), "" when none."""
        labels = [label for label in self.labels if label]
        if not labels:
            return ""
        return "now: " + printable(labels[0]) + (f" +{len(labels) - 1}" if len(labels) > 1 else "")

    def _money(self) -> str:
        # what the replies cost as they came, counted or not yet (the budget settles each at its reply)
        spent = max(self.spent, self.budget.paid()[0]) if self.budget is not None else self.spent
        text = f"{usd(spent)} spent"
        cap = self.budget.max_cost if self.budget is not None else None
        if cap is not None and self.budget is not None:
            text += f", cap {usd(cap)} ({usd(max(0.0, cap - self.budget.spent))} left)"
        return text

    def _rate(self, now: float) -> float | None:
        """Completions per second over the last ~30 s; None before there is a second to measure."""
        if not self._samples:
            return None
        then, done_then = self._samples[0]
        return (self.done - done_then) / (now - then) if now - then >= 1.0 else None

    # -- drawing --------------------------------------------------------------------------
    def _start(self) -> None:
        if self.started is None:
            self.started = now = time.monotonic()
            self._changed_at = now
            self._next_plain = now + self.every
            self._samples.clear()
            self._samples.append((now, self.done))
            if self.live and self._guard is None and sys.stderr is self.file:
                self._guard = _StderrGuard(self.file, self)
                sys.stderr = self._guard

    def _tick(self, force: bool = False) -> None:
        now = time.monotonic()
        # Outcomes less than 1 ms apart (a cached rerun): the clock is read once per 100 of them.
        self._skip = _FAST_SKIP if now - self._last_tick < 0.001 else 0
        self._last_tick = now
        if self.done != self._seen_done:
            self._seen_done, self._changed_at = self.done, now
        if now >= self._next_sample:
            self._next_sample = now + _SAMPLE_EVERY
            self._samples.append((now, self.done))
            while len(self._samples) > 2 and now - self._samples[1][0] >= _RATE_WINDOW:
                self._samples.popleft()
        if not self.enabled or self.started is None:
            return
        if self.live:
            if (force or now >= self._next_draw) and not self._held:
                self._next_draw = now + _REDRAW_EVERY
                self._write_live()
        elif now >= self._next_plain:
            self._next_plain = now + self.every
            self._write_plain(self.line())

    def redraw(self) -> None:
        if self.live and self.started is not None and not self._held:
            self._write_live()

    def clear(self) -> None:
        """Take the live line off the screen (the cursor back at column 0)."""
        if self._shown:
            self.file.write("\r" + (" " * self._shown + "\r" if self.dumb else CLEAR_TO_EOL))
            self._shown = 0

    def _draw(self, final: bool = False) -> None:
        # Within the terminal's width: a wrapped line could not be redrawn in place.
        line = self.line(final=final, width=_columns(self.file))
        pad = " " * max(0, self._shown - len(line)) if self.dumb else CLEAR_TO_EOL
        self.file.write("\r" + line + pad)
        self._shown = len(line)

    def _write_live(self) -> None:
        try:
            self._draw()
            self.file.flush()
        except (OSError, ValueError):
            pass

    def _write_plain(self, line: str) -> None:
        try:
            self.file.write(line + "\n")
            self.file.flush()
        except (OSError, ValueError):
            pass


class _StderrGuard:
    """sys.stderr while a live line is drawn: whatever else writes there
    (print, warnings, logging) clears the line first; it is redrawn after the
    newline that ends what was written."""

    def __init__(self, real: TextIO, progress: RunProgress) -> None:
        self.real = real
        self._progress = progress

    def write(self, text: str) -> int:
        if not text:
            return 0
        progress = self._progress
        progress.clear()
        written = self.real.write(text)
        progress._held = not text.endswith("\n")
        if not progress._held:
            self.real.flush()
            progress.redraw()
        return written

    def flush(self) -> None:
        self.real.flush()

    def __getattr__(self, name: str) -> object:  # fileno, isatty, encoding, ...
        return getattr(self.real, name)


def _isatty(file: TextIO) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def _columns(file: TextIO) -> int:
    """The terminal's width (0: unknown)."""
    try:
        return os.get_terminal_size(file.fileno()).columns
    except (AttributeError, ValueError, OSError):
        return 0
