"""Waits for the loopback server (engine/loopback/server.py) that the test
changes while the server runs.

`Stalls`, a latency that stalls calls on cue, for the tests that stop a run
while calls are in flight: a fixed latency has to outlast how long a loaded
machine takes to send the signal; a stall holds the calls however long that
takes. `Gap`, a wait before each token that the test sets: slow while a
stream is being cut mid-way, none for the calls that follow.

    latency = Stalls()                   # every reply at once
    async with LoopbackServer(latency=latency) as server:
        latency.stall_after(4)           # 4 more replies at once, then every call waits
        ...                              # (until its client leaves: the server cancels it)
        latency.answer_all()             # the calls from now on are answered at once again
"""
from __future__ import annotations

STALL = 3600.0  # an hour: the call ends with its client (the loopback cancels a handler whose client left)


class Stalls:
    """The loopback's `latency`: 0 s, or STALL once `stall_after(n)` has let n replies through."""

    def __init__(self) -> None:
        self.left: int | None = None  # replies still answered at once; None: all of them

    def stall_after(self, replies: int) -> None:
        self.left = replies

    def answer_all(self) -> None:
        self.left = None

    def __call__(self) -> float:
        if self.left is None:
            return 0.0
        if self.left > 0:
            self.left -= 1
            return 0.0
        return STALL


class Gap:
    """Returns `seconds`, read at each draw: set it and the next draw follows."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self) -> float:
        return self.seconds
