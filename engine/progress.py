"""Progress on stderr: done/total, cache hits, errors, tokens, rate, elapsed
and ETA.

An evaluation runs several streams of one engine at once (one per model and
memory mode), so every stream of an engine feeds one shared display rather
than drawing bars over each other:

- on a terminal, one live line (tqdm) summing the engine's open streams,
  redrawn at most ~10 times a second;
- elsewhere (a log file, CI), no live line: one summary line per stream when
  it ends.

The engine calls `advance()` once per outcome (tens of thousands of times a
second on a cached rerun), so it only counts.
"""
from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from engine.requests import Outcome

_REFRESH_SECONDS = 0.1


class _Display:
    """What all open streams of one engine share."""

    def __init__(self, file: TextIO, stats: Any):
        self.file = file
        self.stats = stats
        self.live = bool(getattr(file, "isatty", lambda: False)())
        self.streams: list[Progress] = []
        self.bar = None
        self.next_draw = 0.0

    def attach(self, stream: Progress) -> None:
        self.streams.append(stream)
        if self.live and self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=None, desc="calls", file=self.file, unit="req",
                            mininterval=_REFRESH_SECONDS, dynamic_ncols=True, leave=True)
        self.draw(force=True)

    def detach(self, stream: Progress) -> None:
        self.draw(force=True)
        self.streams.remove(stream)
        if not self.live:
            self.file.write(stream.summary() + "\n")
            self.file.flush()
        elif not self.streams and self.bar is not None:
            self.bar.close()
            self.bar = None

    def draw(self, force: bool = False) -> None:
        if self.bar is None:
            return
        now = time.monotonic()
        if not force and now < self.next_draw:
            return
        self.next_draw = now + _REFRESH_SECONDS
        streams = self.streams
        done = sum(s.done for s in streams)
        totals = [s.total for s in streams]
        bar = self.bar
        bar.total = sum(totals) if streams and None not in totals else None
        bar.n = done
        labels = [s.label for s in streams if s.label]
        bar.set_description_str(labels[0] if len(labels) == 1 else f"{len(streams)} streams", refresh=False)
        tokens = ""
        if self.stats is not None:
            tokens = f" tok_in={self.stats.tokens_in:,} tok_out={self.stats.tokens_out:,}"
        cached = sum(s.cached for s in streams)
        errors = sum(s.errors for s in streams)
        bar.set_postfix_str(f"cached={cached} errors={errors}{tokens}", refresh=False)
        bar.refresh()


# One display per engine, found through the engine's stats object (which every
# stream of that engine is given).
_DISPLAYS: dict[int, _Display] = {}


class Progress:
    """The progress of one `Engine.stream` call."""

    def __init__(self, *, enabled: bool, total: int | None = None, label: str = "",
                 file: TextIO | None = None, stats: Any = None):
        self.enabled = enabled
        self.total = total
        self.label = label
        self.done = 0
        self.cached = 0
        self.errors = 0
        self._started = time.monotonic()
        self._display: _Display | None = None
        if enabled:
            key = id(stats)
            display = _DISPLAYS.get(key)
            if display is None:
                display = _DISPLAYS[key] = _Display(file or sys.stderr, stats)
            display.attach(self)
            self._display = display

    def advance(self, outcome: Outcome) -> None:
        self.done += 1
        if outcome.cached:
            self.cached += 1
        elif outcome.error is not None:
            self.errors += 1
        if self._display is not None and self._display.bar is not None:
            self._display.draw()

    def summary(self) -> str:
        elapsed = time.monotonic() - self._started
        return (f"{self.label or 'calls'}: {self.done} done ({self.cached} cached, {self.errors} errors) "
                f"in {elapsed:.1f} s")

    def close(self) -> None:
        display, self._display = self._display, None
        if display is None:
            return
        display.detach(self)
        if not display.streams:
            _DISPLAYS.pop(id(display.stats), None)


def notice(message: str, file: TextIO | None = None) -> None:
    """One line on stderr (`tulving: MESSAGE`), printed above a live progress
    line rather than through it. Control characters in the message are escaped."""
    from engine.errors import printable

    file = file or sys.stderr
    line = f"tulving: {printable(message)}"
    bars = [d.bar for d in _DISPLAYS.values() if d.bar is not None and d.file is file]
    try:
        if bars:
            from tqdm import tqdm

            tqdm.write(line, file=file)
        else:
            file.write(line + "\n")
            file.flush()
    except (OSError, ValueError):  # stderr closed or gone: the notice is not worth a crash
        pass
