"""A progress line on stderr: done/total, cache hits, errors, tokens sent,
rate, elapsed and ETA.

The engine calls `advance()` once per outcome (up to tens of thousands of
times a second on a cached rerun), so it only counts; the line is redrawn by
tqdm at most ~10 times a second.
"""
from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from engine.requests import Outcome

_REFRESH_SECONDS = 0.1


class Progress:
    def __init__(self, *, enabled: bool, total: int | None = None, label: str = "",
                 file: TextIO | None = None, stats: Any = None):
        self.enabled = enabled
        self.done = 0
        self.cached = 0
        self.errors = 0
        self._stats = stats  # the engine's totals (tokens), read when drawing
        self._next_draw = 0.0
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label or "calls", file=file or sys.stderr, unit="req",
                             mininterval=_REFRESH_SECONDS, dynamic_ncols=True, leave=True)

    def advance(self, outcome: Outcome) -> None:
        self.done += 1
        if outcome.cached:
            self.cached += 1
        elif outcome.error is not None:
            self.errors += 1
        if self._bar is not None:
            now = time.monotonic()
            if now >= self._next_draw:
                self._next_draw = now + _REFRESH_SECONDS
                self._draw()

    def _draw(self) -> None:
        bar = self._bar
        bar.n = self.done
        tokens = ""
        if self._stats is not None:
            tokens = f" tok_in={self._stats.tokens_in:,} tok_out={self._stats.tokens_out:,}"
        bar.set_postfix_str(f"cached={self.cached} errors={self.errors}{tokens}", refresh=False)
        bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._draw()
            self._bar.close()
            self._bar = None
