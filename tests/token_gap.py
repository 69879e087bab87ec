"""A loopback server wait (engine/loopback/server.py's LatencyFn) that the
test changes while the server runs: slow while a stream is being cut mid-way,
none for the calls that follow (they need not pay the slow stream's seconds)."""
from __future__ import annotations


class Gap:
    """Returns `seconds`, read at each draw: set it and the next draw follows."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self) -> float:
        return self.seconds
