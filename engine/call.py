"""The call record: one distinct uncached call, shared by every identical
request waiting on it, and how each of its attempts ended.

It lives below the engine (engine/scheduler.py), the dispatcher
(engine/dispatch.py) and the endpoint's gate (engine/gate.py), which all
read it. Its fields change only through its methods, here, each named for
the step of the call's life that changes them:

    job.join(request, sink)          the engine: a request waits on the call
    job.launched(task, reserved)     the dispatcher: an attempt's task started
    job.began(now, total_timeout)    the gate: an attempt was sent
    job.ended(error)                 the gate: it failed (a 429 counted apart)
    job.cancel() / job.take_waiters() the engine: nobody waits / the call settled

A finished attempt is described by `AttemptOutcome`, which the dispatcher
fills and the gate (`Gate.observe`) and the engine read.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from engine.requests import Outcome, Request
from engine.resolve import Resolved
from providers.base import RATE_LIMITED, ProviderError, Result

Waiter = tuple[Request, "asyncio.Queue[Outcome]"]  # a request waiting on the call, and its stream's sink


class CallQueue(Protocol):
    """Where a call waits for an endpoint (engine/dispatch.py's `Pool`)."""

    def push(self, job: Job) -> None:
        """Queue the call (again)."""


@dataclass(eq=False, slots=True)
class Job:
    """One distinct uncached call (see the module docstring for who changes what)."""

    resolved: Resolved
    seq: int
    input_estimate: int
    output_estimate: int
    prompt: tuple[str, ...] | None = None       # roles and contents, for prefix ordering
    waiters: list[Waiter] = field(default_factory=list)
    pool: CallQueue | None = None               # where it waits (and is queued again for a retry)
    taken_at: float | None = None               # time.monotonic() when the engine took the request
    held: bool = False                          # its provider holds it in a queue of its own (holds_calls)
    attempts: int = 0
    rate_limited: int = 0                       # attempts answered 429
    deadline: float | None = None               # the endpoint's total_timeout, from the first send
    first_sent: float | None = None             # time.monotonic() when its first attempt was sent
    last_sent: float | None = None              # ... and its last one
    limit_input: int | None = None              # input tokens charged to the rate limits, when not the
                                                # estimate (calibrated, or a warm prefix not counted)
    cost_reserved: float = 0.0                  # the budget's hold for the attempt in flight
    cancelled: bool = False
    task: asyncio.Task[None] | None = None      # the attempt in flight

    def __lt__(self, other: Job) -> bool:  # heap order: oldest first
        return self.seq < other.seq

    # -- the engine ------------------------------------------------------------------
    def join(self, request: Request, sink: asyncio.Queue[Outcome]) -> None:
        self.waiters.append((request, sink))

    def leave(self, sink: asyncio.Queue[Outcome]) -> int:
        """The stream of `sink` ended: its requests stop waiting. Returns how many left."""
        kept = [w for w in self.waiters if w[1] is not sink]
        left = len(self.waiters) - len(kept)
        if left:
            self.waiters = kept
        return left

    def take_waiters(self) -> list[Waiter]:
        """The requests to hand the call's outcome to (once: none are left after)."""
        waiters, self.waiters = self.waiters, []
        return waiters

    def cancel(self) -> None:
        """Nobody waits any more: the attempt in flight, if any, is cancelled."""
        self.cancelled = True
        if self.task is not None:
            self.task.cancel()

    # -- the dispatcher --------------------------------------------------------------
    def launched(self, task: asyncio.Task[None], reserved: float) -> None:
        self.task, self.cost_reserved = task, reserved

    def take_reserved(self) -> float:
        """The budget's hold for the attempt that just ended (0 after)."""
        reserved, self.cost_reserved = self.cost_reserved, 0.0
        return reserved

    # -- the gate --------------------------------------------------------------------
    def charge_input(self, tokens: int) -> None:
        """The input tokens the rate limits are charged for this call."""
        self.limit_input = max(1, tokens)

    def began(self, now: float, total_timeout: float | None) -> None:
        """An attempt is sent; the first starts the call's total_timeout."""
        self.attempts += 1
        if self.first_sent is None:
            self.first_sent = now
            if total_timeout:
                self.deadline = now + total_timeout
        self.last_sent = now

    def ended(self, error: ProviderError) -> None:
        """An attempt failed (429s are counted apart: they have their own allowance)."""
        if error.kind == RATE_LIMITED:
            self.rate_limited += 1


@dataclass(slots=True)
class AttemptOutcome:
    """How one attempt of a call ended, as the dispatcher reports it."""

    result: Result | None = None
    error: ProviderError | None = None
    usage: tuple[int, int] | None = None  # (input, output) tokens the reply reported
    cost: float = 0.0                     # USD, from the reported usage
    started: float = 0.0                  # time.monotonic() when it was sent
    sent: bool = True                     # False: settled unsent (refused, could not start)
    final: bool = False                   # settle with this error: no retry (the engine itself failed)
