"""Per-endpoint dispatch: which waiting call an endpoint starts next, and when.

Waiting calls sit in a `Pool`, one per set of endpoints that can serve them (a
model alias's replicas). Each endpoint runs one dispatcher task that pulls from
every pool it serves: it starts the oldest waiting call as soon as it has a free
concurrency slot, is not paused after a 429, and its rate limits admit the call
(see engine/limiter.py). With replicas, every endpoint of the pool races for the
same head call and the one that can start it soonest takes it, so traffic
spreads by free capacity. Dispatchers sleep on an event plus a timer set to the
exact time capacity frees; nothing polls.

Whether the call it would start next may start now, whether a finished
attempt is tried again and when, and what each reply teaches (429s, token
counts, the limits reported in the reply's headers) are the endpoint's gate's
decisions (engine/gate.py: `admit`, `observe`); the dispatcher keeps the
queue, the slots, the attempts' tasks and the timers of calls waiting to be
tried again. A dead endpoint (the gate says `down`) starts nothing more: the
calls only it can serve are settled unsent, announced in one line.

Endpoints whose provider `prefers_prefix_order` (llama.cpp keeps only the
previous prompt's KV cache) run one call at a time and pick, among the waiting
calls, the one sharing the longest prompt prefix with the previous call.

Calls a provider holds in a queue of its own (`Provider.holds_calls`: the
batching provider, engine/batching.py) are admitted by the gate without a
slot or pacing (`Start(slot=False)`). Every attempt's task carries the call's
cache key in CALL_KEY, for such a provider to keep its own record of the call.

The dispatcher runs each attempt itself, top-down: the gate's admission, the
timeout, the provider call, the reply's usage and cost, the release of the
slot, the gate's verdict. A call the gate says is DONE goes to its owner, the
engine, through one typed callback (`CallOwner.attempt_done`), which counts,
caches and settles it. Nothing here calls back up any other way.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections.abc import Awaitable, Hashable, Mapping, Sequence
from typing import Any, Protocol

from engine.budget import Budget
from engine.call import AttemptOutcome, Job
from engine.gate import DONE, Gate, Refuse, RetryAt, Wait
from engine.requests import CALL_KEY
from engine.resolve import Resolved
from engine.retry import RetryPolicy
from engine.warmup import marked
from providers.base import BAD_REPLY, CONFIG, EndpointSpec, Provider, ProviderError, Result
from providers.http_errors import exception_error

log = logging.getLogger(__name__)


class CallOwner(Protocol):
    """The engine, as its dispatchers see it (engine/scheduler.py)."""

    rerun_command: str  # what to run to resume the run (said when an endpoint is down)

    def attempt_done(self, endpoint: EndpointState, job: Job, outcome: AttemptOutcome) -> None:
        """Count, cache and settle a call the gate is done with (a result, a
        final error, or refused unsent)."""

    def notice(self, message: str, *, key: Hashable = None, every: float = 10.0, error: bool = False) -> None:
        """A line on stderr saying why the run waits; an `error` is printed even with --quiet."""


def check_usage(result: Result) -> tuple[int, int]:
    """(input, output) tokens of a result, checked: a provider that reports
    anything but non-negative integers broke its contract (a bad reply)."""
    used_in, used_out = result.input_tokens, getattr(result, "output_tokens", 0)
    if type(used_in) is not int or type(used_out) is not int or used_in < 0 or used_out < 0:
        raise ProviderError(BAD_REPLY, f"reply reports token counts {used_in!r} and {used_out!r}, not integers")
    return used_in, used_out


def without_frames(error: ProviderError) -> ProviderError:
    """`error` without its traceback, nor those of the exceptions it came
    from: their frames hold the call's request body and prompt (a book in
    context), which an outcome kept for the results must not keep alive."""
    seen: set[int] = set()
    stack: list[BaseException] = [error]
    while stack:
        exc = stack.pop()
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        exc.__traceback__ = None
        stack.extend(e for e in (exc.__cause__, exc.__context__) if e is not None)
    return error


class Pool:
    """Calls waiting for any endpoint of one replica set, oldest first."""

    __slots__ = ("heap", "endpoints", "prefix_order")

    def __init__(self, endpoints: list[EndpointState]):
        self.heap: list[Job] = []
        self.endpoints = endpoints
        self.prefix_order = any(ep.prefix_order for ep in endpoints)  # calls need their prompt kept
        for ep in endpoints:
            ep.pools.append(self)

    def push(self, job: Job) -> None:
        heapq.heappush(self.heap, job)
        for ep in self.endpoints:
            ep.wake()

    def head(self) -> Job | None:
        heap = self.heap
        while heap and heap[0].cancelled:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def remove(self, job: Job) -> None:
        heap = self.heap
        if heap and heap[0] is job:
            heapq.heappop(heap)
        else:
            heap.remove(job)
            heapq.heapify(heap)


def shared_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    """Characters of prompt prefix two prompts share. Whole-string equality
    and slice comparisons run in C, so a 4 MB book costs microseconds."""
    total = 0
    for x, y in zip(a, b):
        if x is y or x == y:
            total += len(x)
            continue
        lo, hi = 0, min(len(x), len(y))
        while lo < hi:  # longest common prefix of x and y, by bisection
            mid = (lo + hi + 1) // 2
            if x[:mid] == y[:mid]:
                lo = mid
            else:
                hi = mid - 1
        return total + lo
    return total


class EndpointState:
    """One endpoint's provider, gate (engine/gate.py), slots, dispatcher task
    and the timers of its calls waiting to be tried again.

    `owner` (the engine) settles the calls the gate is done with; `budget`
    (shared by the engine's endpoints) admits and prices the calls.
    """

    def __init__(self, spec: EndpointSpec, provider: Provider, owner: CallOwner, budget: Budget | None = None,
                 retry_policy: RetryPolicy | None = None):
        self.spec = spec
        self.name = spec.name
        self.provider = provider
        self.owner = owner
        self.prefix_order = provider.prefers_prefix_order
        self.enforces_timeout = provider.enforces_timeout
        self.max_concurrency = 1 if self.prefix_order else max(1, int(spec.max_concurrency))
        self.gate = Gate(spec, budget if budget is not None else Budget(), owner, retry_policy,
                         max_concurrency=self.max_concurrency, now=time.monotonic(),
                         cache_reads_count=provider.cache_reads_count_toward_limits)
        self.pools: list[Pool] = []
        self.in_flight = 0
        self.last_prompt: tuple[str, ...] | None = None
        self.attempts = 0          # attempts sent
        self.retry_waiting = 0     # calls waiting for their next attempt
        self._retry_timers: set[asyncio.TimerHandle] = set()
        self._said_down = False
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None  # when capacity frees (a rate limit, a pause)
        self._task: asyncio.Task[None] | None = None

    @property
    def learned_limits(self) -> dict[str, dict[str, float]]:
        """Per-minute limits the provider reported: model -> group -> rate."""
        return self.gate.learned_limits

    # -- signals -------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"dispatch:{self.name}")

    async def stop(self) -> None:
        for timer in self._retry_timers:
            timer.cancel()
        self._retry_timers.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def wake(self) -> None:
        self._wake.set()

    # -- picking -----------------------------------------------------------------
    def _pick(self) -> tuple[Job, Pool] | None:
        if self.prefix_order and self.last_prompt is not None:
            return self._pick_by_prefix()
        best: tuple[Job, Pool] | None = None
        for pool in self.pools:
            job = pool.head()
            if job is not None and (best is None or job.seq < best[0].seq):
                best = (job, pool)
        return best

    def _pick_by_prefix(self) -> tuple[Job, Pool] | None:
        """The waiting call sharing the longest prefix with the previous one
        (ties: oldest). O(waiting calls), bounded by the engine's window."""
        best: tuple[int, int, Job, Pool] | None = None
        last = self.last_prompt
        for pool in self.pools:
            if any(job.cancelled for job in pool.heap):
                pool.heap = [job for job in pool.heap if not job.cancelled]
                heapq.heapify(pool.heap)
            for job in pool.heap:
                score = shared_prefix(job.prompt or (), last or ())
                if best is None or score > best[0] or (score == best[0] and job.seq < best[1]):
                    best = (score, job.seq, job, pool)
        return None if best is None else (best[2], best[3])

    # -- the dispatcher ----------------------------------------------------------
    async def _run(self) -> None:
        wake = self._wake
        while True:
            wake.clear()
            self._arm(self._step())
            await wake.wait()

    def _step(self) -> float | None:
        """`_dispatch_ready`, a bug in it failing the waiting calls rather than hanging every stream."""
        try:
            return self._dispatch_ready()
        except Exception as exc:  # noqa: BLE001 -- a bug here must not hang every stream
            log.exception("dispatcher of endpoint %s failed", self.name)
            self._fail_waiting(ProviderError(CONFIG, f"engine dispatcher failed: {type(exc).__name__}: {exc}"))
            return None

    def _arm(self, delay: float | None) -> None:
        """Dispatch again in `delay` seconds (None: on the next signal alone).
        The timer dispatches itself, not through the task: a wake-up a loop
        turn late is a send late, and under a sliding-window limit every late
        send delays the ones a window after it."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if delay is not None:
            self._timer = asyncio.get_running_loop().call_later(delay, self._timed)

    def _timed(self) -> None:
        self._timer = None
        self._arm(self._step())

    def _dispatch_ready(self) -> float | None:
        """Start every call the gate admits now. Returns None to wait for a
        signal (a new call, a free slot), or the seconds until it may admit one."""
        gate = self.gate
        if gate.down is not None:
            self._refuse_stranded(gate.down)
            return None
        while True:
            picked = self._pick()
            if picked is None:
                return None
            job, pool = picked
            if job.cancelled:
                pool.remove(job)
                continue
            now = time.monotonic()
            verdict = gate.admit(job, now, self.in_flight)
            if isinstance(verdict, Wait):
                if verdict.for_budget:  # the calls in flight hold the room: woken when one settles
                    gate.budget.wait_for_room(self)
                return verdict.seconds
            pool.remove(job)
            if isinstance(verdict, Refuse):  # over budget (or down): settled without a call
                self._report(job, AttemptOutcome(error=verdict.error, sent=False, final=True))
                continue
            self._start(job, verdict.slot, now)

    def _start(self, job: Job, slot: bool, now: float) -> None:
        if slot:
            if self.prefix_order:
                self.last_prompt = job.prompt
            self.in_flight += 1
        self.attempts += 1
        try:
            self._launch(job, slot, now)
        except Exception as exc:  # noqa: BLE001 -- a call that cannot start is settled, never lost
            if slot:
                self.in_flight -= 1
            log.exception("endpoint %s: starting a call failed", self.name)
            self._report(job, AttemptOutcome(error=ProviderError(
                CONFIG, f"engine could not start the call: {type(exc).__name__}: {exc}"), sent=False, final=True))

    def _refuse_stranded(self, error: ProviderError) -> None:
        """The endpoint is down: settle unsent the waiting calls no live
        endpoint can serve (a replica still up serves its pool's calls)."""
        for pool in self.pools:
            if pool.heap and all(ep.gate.down is not None for ep in pool.endpoints):
                jobs, pool.heap = pool.heap, []
                for job in jobs:
                    if not job.cancelled:
                        self._report(job, AttemptOutcome(error=error, sent=False, final=True))

    def _say_down(self) -> None:
        """Once, when the gate finds the endpoint down: one line, and the waiting calls refused."""
        self._said_down = True
        waiting = self.retry_waiting + sum(len(pool.heap) for pool in self.pools
                                           if all(ep.gate.down is not None for ep in pool.endpoints))
        self.owner.notice(self.gate.down_line(waiting, self.owner.rerun_command), key=("down", self.name),
                          every=math.inf, error=True)
        self._wake.set()

    def _fail_waiting(self, error: ProviderError) -> None:
        for pool in self.pools:
            jobs, pool.heap = pool.heap, []
            for job in jobs:
                if not job.cancelled:
                    self._report(job, AttemptOutcome(error=error, sent=False, final=True))

    # -- one attempt, top-down ------------------------------------------------------
    def _launch(self, job: Job, slot: bool, now: float) -> None:
        task = asyncio.get_running_loop().create_task(self._attempt(job, slot, now))
        budget = self.budget
        # without a cap nothing reads the reservations: not priced twice a call
        reserved = 0.0 if budget.max_cost is None else budget.reserve(
            job.resolved.alias, job.input_estimate, job.output_estimate, batch=not slot)
        job.launched(task, reserved)
        task.add_done_callback(lambda t: self._after_attempt(t, job))

    @property
    def budget(self) -> Budget:
        return self.gate.budget

    def _call(self, r: Resolved, timeout: float) -> Awaitable[Result]:
        if r.messages is not None:
            messages: Sequence[Mapping[str, Any]] = r.messages
            if r.prefix_end is not None and self.provider.caches_prompt_prefix:
                messages = marked(messages, r.prefix_end)  # where the provider's prompt cache ends
            if r.request.stream and self.provider.can_stream:  # asked only then: other providers need not know the flag
                return self.provider.chat(r.alias.model, messages, params=r.params, timeout=timeout, stream=True)
            return self.provider.chat(r.alias.model, messages, params=r.params, timeout=timeout)
        return self.provider.embed(r.alias.model, r.request.texts, timeout=timeout)  # type: ignore[union-attr]

    async def _attempt(self, job: Job, slot: bool, start: float) -> None:
        """One attempt: the provider call under its timeout, the reply's usage
        and cost, the slot released exactly once whatever raises, then the
        gate's verdict. A call without a slot (held by its provider) has no
        timer: the provider's queue bounds it (a batch's 24 h window)."""
        r = job.resolved
        CALL_KEY.set(r.key)
        spec_timeout = self.spec.timeout
        timeout = spec_timeout if job.deadline is None else max(0.001, min(spec_timeout, job.deadline - start))
        outcome = AttemptOutcome(started=start)
        ended = False
        try:
            try:
                if self.enforces_timeout or not slot:  # the provider's own timer bounds the call: no second one
                    outcome.result = await self._call(r, timeout)
                else:
                    async with asyncio.timeout(timeout):
                        outcome.result = await self._call(r, timeout)
                outcome.usage = check_usage(outcome.result)
            except ProviderError as exc:
                outcome.error = without_frames(exc)
            except Exception as exc:  # noqa: BLE001 -- a provider bug must not end the run
                outcome.error = exception_error(exc, endpoint=self.name, timeout=timeout, secret=None)
            ended = True
        finally:
            try:
                # spent before the slot is released, which may start the next call under max_cost.
                # A call that failed may still have been billed (a batch line whose answer could not be
                # matched: ProviderError.billed); what was billed is spent, answer or not.
                paid = outcome.result if outcome.usage else outcome.error.billed if outcome.error else None
                outcome.cost = self.budget.settle(job.take_reserved(), r.alias, paid)
            except Exception as exc:  # noqa: BLE001 -- reported as an error below, never a hang
                outcome = AttemptOutcome(error=exception_error(exc, endpoint=self.name, timeout=timeout, secret=None),
                                         started=start)
            finally:
                if slot:
                    self.in_flight -= 1
                if not ended:  # cancelled: its token reservations are refunded
                    self.gate.cancelled(job, time.monotonic())
        if outcome.result is not None and outcome.error is not None:
            outcome.result = None
        self._attempt_ended(job, outcome)

    def _attempt_ended(self, job: Job, outcome: AttemptOutcome) -> None:
        """The gate's verdict on a finished attempt: settle the call, or try it
        again later; then start what may start now."""
        try:
            verdict = self.gate.observe(job, outcome, time.monotonic())
        except Exception as exc:  # noqa: BLE001 -- a broken lesson still settles the call
            log.exception("endpoint %s: the gate failed on a reply", self.name)
            verdict = DONE
            if outcome.result is None:
                outcome = AttemptOutcome(error=ProviderError(BAD_REPLY, f"engine error after the reply: "
                                                                        f"{type(exc).__name__}: {exc}"), final=True)
        if isinstance(verdict, RetryAt):
            self._retry_later(job, verdict.at - time.monotonic())
        else:
            self._report(job, outcome)
        if self.gate.down is not None and not self._said_down:
            self._say_down()
        # After a success, start the next waiting call(s) right here rather
        # than waking the dispatcher task for it (a task step per call at zero
        # latency), and set the timer when capacity frees later (a rate limit,
        # a pause). After a failure the task is woken (a retry's pause first).
        if outcome.usage is None or self._wake.is_set():
            self._wake.set()
            return
        delay = self._step()
        if delay is not None:
            self._arm(delay)

    def _retry_later(self, job: Job, delay: float) -> None:
        """Queue the call again in `delay` seconds (its pool: any replica may take it)."""
        timer: asyncio.TimerHandle | None = None

        def again() -> None:
            self._retry_timers.discard(timer)  # set before it can run
            self.retry_waiting -= 1
            if job.cancelled:
                return
            try:
                assert job.pool is not None  # queued once, so it has its pool
                job.pool.push(job)
            except Exception as exc:  # noqa: BLE001 -- a call that cannot be queued is settled, never lost
                self._report(job, AttemptOutcome(error=ProviderError(
                    BAD_REPLY, f"engine error: could not queue a retry: {type(exc).__name__}: {exc}"), final=True))

        timer = asyncio.get_running_loop().call_later(max(0.0, delay), again)
        self._retry_timers.add(timer)
        self.retry_waiting += 1

    def _after_attempt(self, task: asyncio.Task[None], job: Job) -> None:
        """The last guard of a call's life: an attempt that ended by an
        exception nobody caught still settles its call, so no stream waits
        for it forever."""
        if task.cancelled() or job.cancelled or not job.waiters:
            return
        exc = task.exception()
        if exc is not None:
            self._report(job, AttemptOutcome(error=ProviderError(
                BAD_REPLY, f"engine error after the reply: {type(exc).__name__}: {exc}"), final=True))

    def _report(self, job: Job, outcome: AttemptOutcome) -> None:
        try:
            self.owner.attempt_done(self, job, outcome)
        except Exception:  # noqa: BLE001 -- the owner settles its own failures; this only logs a bug there
            log.exception("endpoint %s: the engine failed to take an attempt's outcome", self.name)
