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

A call its provider holds in a queue of its own (a batch) has that queue as
its `holder`, told by `join`, `leave` and `take_waiters` of every request that
starts or stops waiting on it: the engine asks the batching module how many
requests its pull window may hold beyond its own (engine/batching_mode.py),
and knows nothing else of it.

A finished attempt is described by `AttemptOutcome`, which the dispatcher
fills and the gate (`Gate.observe`) and the engine read.
"""
from __future__ import annotations

import asyncio
import operator
from dataclasses import dataclass, field
from typing import Protocol

from engine.requests import ChatRequest, Outcome, Request
from engine.resolve import Resolved
from providers.base import RATE_LIMITED, ProviderError, Result

Waiter = tuple[Request, "asyncio.Queue[Outcome]"]  # a request waiting on the call, and its stream's sink
_content = operator.itemgetter("content")


def request_chars(request: Request) -> int:
    """The prompt characters a waiting request holds in memory (what the
    engine's pull window counts)."""
    if isinstance(request, ChatRequest):
        return sum(map(len, map(_content, request.messages)))
    return sum(map(len, request.texts))


class CallHolder(Protocol):
    """A provider's own queue of calls (a batch: engine/batching.py
    `Parking`), told of every request that starts (sign 1) or stops (-1)
    waiting on one of its calls: the engine's pull window does not count them."""

    def waiting(self, request: Request, sign: int) -> None: ...


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
    holder: CallHolder | None = None            # its provider holds it in a queue of its own (a batch)
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

    def __post_init__(self) -> None:
        if self.holder is not None:
            for request, _ in self.waiters:
                self.holder.waiting(request, 1)

    def __lt__(self, other: Job) -> bool:  # heap order: oldest first
        return self.seq < other.seq

    @property
    def held(self) -> bool:
        """Its provider holds it in a queue of its own: no slot, no pacing (engine/gate.py)."""
        return self.holder is not None

    # -- the engine ------------------------------------------------------------------
    def join(self, request: Request, sink: asyncio.Queue[Outcome]) -> None:
        self.waiters.append((request, sink))
        if self.holder is not None:
            self.holder.waiting(request, 1)

    def leave(self, sink: asyncio.Queue[Outcome]) -> int:
        """The stream of `sink` ended: its requests stop waiting. Returns how many left."""
        kept = [w for w in self.waiters if w[1] is not sink]
        left = len(self.waiters) - len(kept)
        if left:
            self._stop_waiting([w for w in self.waiters if w[1] is sink])
            self.waiters = kept
        return left

    def take_waiters(self) -> list[Waiter]:
        """The requests to hand the call's outcome to (once: none are left after)."""
        waiters, self.waiters = self.waiters, []
        self._stop_waiting(waiters)
        return waiters

    def _stop_waiting(self, waiters: list[Waiter]) -> None:
        if self.holder is not None:
            for request, _ in waiters:
                self.holder.waiting(request, -1)

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
