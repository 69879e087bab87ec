"""Per-endpoint dispatch: which waiting call an endpoint starts next, and when.

Waiting calls sit in a `Pool`, one per set of endpoints that can serve them (a
model alias's replicas). Each endpoint runs one dispatcher task that pulls from
every pool it serves: it starts the oldest waiting call as soon as it has a free
concurrency slot, is not paused after a 429, and its rate limits admit the call
(see engine/limiter.py). With replicas, every endpoint of the pool races for the
same head call and the one that can start it soonest takes it, so traffic
spreads by free capacity. Dispatchers sleep on an event plus a timer set to the
exact time capacity frees; nothing polls.

After a 429 the endpoint pauses, slows down and lowers its concurrency as
engine/pacing.py decides (`Pacing`, one per endpoint): the one place a 429 is
decided, whether the call is tried again included (`after_failure`).

Limits the provider reports in its reply headers (`learn_limits`) are paced
by as well (engine/limiter.py): where none is configured or where the
provider's is lower. What was learned is announced once per endpoint and kept
in `learned_limits`.

Endpoints whose provider `prefers_prefix_order` (llama.cpp keeps only the
previous prompt's KV cache) run one call at a time and pick, among the waiting
calls, the one sharing the longest prompt prefix with the previous call.

Calls a provider holds in a queue of its own (`Provider.holds_calls`: the
batching provider, engine/batching.py, puts them into a provider batch) start
at once (`_start_held`): the endpoint's limits, pause and concurrency do not
pace them, and the budget admits them at the alias's batch price, refusing
rather than holding them back (calls in flight settle only when the
provider's queue answers). The attempt's task carries the call's cache key in
CALL_KEY, for such a provider to keep its own record of the call.

The dispatcher runs each attempt itself, top-down: budget admission
(engine/budget.py), the endpoint's limits, the timeout, the provider call,
the reply's usage and cost, the release of the slot. It reports how the
attempt ended to its owner, the engine, through one typed callback
(`CallOwner.attempt_done`), which counts, caches and settles the call or
queues it again. Nothing here calls back up any other way.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.budget import Budget
from engine.limiter import EndpointLimits
from engine.pacing import Pacing, Retry, retry
from engine.requests import CALL_KEY, Outcome, Request
from engine.resolve import Resolved
from engine.warmup import marked
from providers.base import (
    BAD_REPLY,
    CONFIG,
    RATE_LIMITED,
    ChatResult,
    EndpointSpec,
    Provider,
    ProviderError,
    RateLimitInfo,
    Result,
)
from providers.http_errors import exception_error

log = logging.getLogger(__name__)

NOTICE_PAUSE = 5.0           # pauses this long are announced on stderr


@dataclass(eq=False, slots=True)
class Job:
    """One distinct uncached call, shared by every identical request waiting on it."""

    resolved: Resolved
    seq: int
    input_estimate: int
    output_estimate: int
    prompt: tuple[str, ...] | None = None       # roles and contents, for prefix ordering
    waiters: list[tuple[Request, asyncio.Queue[Outcome]]] = field(default_factory=list)  # (request, sink)
    pool: Pool | None = None
    attempts: int = 0
    rate_limited: int = 0                       # attempts answered 429
    deadline: float | None = None
    cost_reserved: float = 0.0
    cancelled: bool = False
    task: asyncio.Task[None] | None = None
    last_error: ProviderError | None = None
    taken_at: float | None = None               # time.monotonic() when the engine took the request
    first_sent: float | None = None             # ... when its first attempt was sent
    last_sent: float | None = None              # ... and its last one
    held: bool = False                          # its provider holds it in a queue of its own (holds_calls)
    limit_input: int | None = None              # input tokens charged to the rate limits, when not the
                                                # estimate (a warm prefix the provider does not count)

    def __lt__(self, other: Job) -> bool:  # heap order: oldest first
        return self.seq < other.seq


@dataclass(slots=True)
class AttemptOutcome:
    """How one attempt of a call ended, as the dispatcher reports it."""

    result: Result | None = None
    error: ProviderError | None = None
    usage: tuple[int, int] | None = None  # (input, output) tokens the reply reported
    cost: float = 0.0                     # USD, from the reported usage
    started: float = 0.0                  # time.monotonic() when it was sent
    sent: bool = True                     # False: settled unsent (over budget, could not start)
    final: bool = False                   # settle with this error: no retry (the engine itself failed)


class CallOwner(Protocol):
    """The engine, as its dispatchers see it (engine/scheduler.py)."""

    def attempt_done(self, endpoint: EndpointState, job: Job, outcome: AttemptOutcome) -> None:
        """Count, cache and settle the call, or queue it again: once per
        attempt, and once for a call settled without being sent."""

    def notice(self, message: str, *, key: Hashable = None, every: float = 10.0) -> None:
        """A line on stderr saying why the run waits."""


def check_usage(result: Result) -> tuple[int, int]:
    """(input, output) tokens of a result, checked: a provider that reports
    anything but non-negative integers broke its contract (a bad reply)."""
    used_in, used_out = result.input_tokens, getattr(result, "output_tokens", 0)
    if type(used_in) is not int or type(used_out) is not int or used_in < 0 or used_out < 0:
        raise ProviderError(BAD_REPLY, f"reply reports token counts {used_in!r} and {used_out!r}, not integers")
    return used_in, used_out


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


def _reported_limits(outcome: AttemptOutcome) -> RateLimitInfo | None:
    """What the reply's headers said of the rate limits (a result's or an error's)."""
    reply = outcome.result if outcome.result is not None else outcome.error
    return getattr(reply, "rate_limits", None)  # never raises: the slot is released after it


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
    """One endpoint's provider, limits, in-flight count and dispatcher task.

    `owner` (the engine) is told how every attempt ended; `budget` (shared by
    the engine's endpoints) admits and prices the calls.
    """

    def __init__(self, spec: EndpointSpec, provider: Provider, owner: CallOwner, budget: Budget | None = None):
        self.spec = spec
        self.name = spec.name
        self.provider = provider
        self.owner = owner
        self.budget = budget if budget is not None else Budget()
        self.prefix_order = provider.prefers_prefix_order
        self.enforces_timeout = provider.enforces_timeout
        self.holds_calls = provider.holds_calls
        self.max_concurrency = 1 if self.prefix_order else max(1, int(spec.max_concurrency))
        now = time.monotonic()
        self.limits = EndpointLimits(spec, now=now)
        self.pools: list[Pool] = []
        self.in_flight = 0
        self.last_prompt: tuple[str, ...] | None = None
        self.calls = 0
        self.pacing = Pacing(self.max_concurrency, self.limits, now)  # pause, slow-downs, AIMD after 429s
        # per-minute limits the provider reported: model -> RateLimitInfo group -> rate
        self.learned_limits: dict[str, dict[str, float]] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- signals -------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"dispatch:{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def wake(self) -> None:
        self._wake.set()

    def record_reply(self, rate_limited: bool, now: float, sent_at: float = -math.inf) -> None:
        """Every finished attempt, answered 429 or not, and when it was sent
        (the pacing judges its slow-down trials on them)."""
        share = self.pacing.on_reply(rate_limited, now, sent_at)
        if share is not None:  # a slow-down did not lower the 429 share: undone
            if self.owner is not None:
                self.owner.notice(f"{self.name}: {share:.0%} of replies are 429 whatever our rate "
                                  f"(not caused by our speed): keeping full speed and retrying them",
                                  key=("revert", self.name), every=60.0)
            self.wake()

    def learn_limits(self, info: RateLimitInfo | None, now: float, model: str = "") -> None:
        """The rate limits a reply from `model` reported in its headers (every
        reply, 429s included): its calls are paced by them from now on where
        lower than configured or where none is configured; announced once per
        endpoint and model."""
        if info is None:
            return
        changed = self.limits.learn(info, now, model)
        if not changed:
            return
        if "requests" in changed:  # told the rate: no need to guess it
            self.pacing.told_request_limit(now)
        first = model not in self.learned_limits
        self.learned_limits.setdefault(model, {}).update(changed)
        if first and self.owner is not None:
            self.owner.notice(f"{self.name}: the provider reports for {model} {self.describe_learned(model)}",
                              key=("learned", self.name, model), every=math.inf)
        self.wake()

    def describe_learned(self, model: str) -> str:
        """The limits learned for `model` and the configured ones, on one line."""
        parts = []
        for name, rate in self.learned_limits.get(model, {}).items():
            unit = {"requests": "requests/min", "tokens": "tokens/min", "input_tokens": "input tokens/min",
                    "output_tokens": "output tokens/min"}[name]
            configured = self.limits.configured_rate(name)
            if configured is None:
                parts.append(f"{rate:,.0f} {unit} (none configured: using it)")
            elif rate < configured:
                parts.append(f"{rate:,.0f} {unit} (lower than the configured {configured:,.0f}: using it)")
            else:
                parts.append(f"{rate:,.0f} {unit} (configured {configured:,.0f} kept)")
        return ", ".join(parts)

    def on_rate_limited(self, retry_after: float | None, now: float, sent_at: float | None = None,
                        limits: RateLimitInfo | None = None) -> None:
        """A 429 (its wait already capped): the pacing pauses and slows down
        (engine/pacing.py); a long pause is announced."""
        paused = self.pacing.on_rate_limited(retry_after, now, sent_at, said_limits=limits is not None)
        if paused is not None and paused >= NOTICE_PAUSE and self.owner is not None:
            until = time.strftime("%H:%M:%S", time.localtime(time.time() + paused))
            self.owner.notice(f"waiting for {self.name}: rate-limited (HTTP 429), paused until {until} "
                              f"({paused:.0f} s)", key=("pause", self.name))

    def after_failure(self, job: Job, error: ProviderError, now: float, sent_at: float,
                      backoff: Callable[[int, float | None], float]) -> Retry:
        """A failed attempt of `job` (its 429s already counted in
        job.rate_limited): whether and when the call is tried again, and a
        429 paces the endpoint."""
        limited = error.kind == RATE_LIMITED
        decision = retry(rate_limited=limited, retryable=error.retryable, retry_after=error.retry_after,
                         attempts=job.attempts, limited_attempts=job.rate_limited,
                         max_attempts=job.resolved.endpoints[0].max_attempts,
                         max_retry_after=self.spec.max_retry_after, backoff=backoff)
        if limited:
            self.on_rate_limited(decision.wait, now, sent_at=sent_at, limits=error.rate_limits)
        return decision

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
        loop = asyncio.get_running_loop()
        wake = self._wake
        while True:
            wake.clear()
            try:
                delay = self._dispatch_ready()
            except Exception as exc:  # a bug here must not hang every stream
                log.exception("dispatcher of endpoint %s failed", self.name)
                self._fail_waiting(ProviderError(CONFIG, f"engine dispatcher failed: {type(exc).__name__}: {exc}"))
                delay = None
            if delay is None:
                await wake.wait()
            else:
                timer = loop.call_later(delay, wake.set)
                await wake.wait()
                timer.cancel()

    def _dispatch_ready(self) -> float | None:
        """Start every call that may start now. Returns None to wait for a
        signal (a new call, a free slot), or the seconds until capacity frees."""
        if self.holds_calls:
            self._start_held()
        while True:
            now = time.monotonic()
            pacing = self.pacing
            if now < pacing.paused_until:
                return pacing.paused_until - now
            factor = pacing.factor(now)
            if self.in_flight >= pacing.concurrency_cap(factor):
                return None
            picked = self._pick()
            if picked is None:
                return None
            job, pool = picked
            if job.cancelled:
                pool.remove(job)
                continue
            refusal = self.budget.admit(job.resolved.alias, job.input_estimate, job.output_estimate)
            if refusal is not None and self.budget.fits_after_inflight(job.resolved.alias, job.input_estimate,
                                                                       job.output_estimate):
                self.budget.wait_for_room(self)  # the calls in flight hold the room: woken when one settles
                return None
            if refusal is not None:  # over budget: settled without a call
                pool.remove(job)
                self._report(job, AttemptOutcome(error=refusal, sent=False, final=True))
                continue
            if self.limits.limited:
                self.limits.set_scale(factor, now)
                model = job.resolved.alias.model  # learned limits are the model's own
                if job.limit_input is None:  # the estimate as the server's counts have run so far
                    job.limit_input = self.limits.calibrated(job.input_estimate)
                charged = job.limit_input
                delay = self.limits.delay(charged, job.output_estimate, now, model)
                if delay > 0.0:
                    return delay
                self.limits.reserve(charged, job.output_estimate, now, model)
            pool.remove(job)
            if self.prefix_order:
                self.last_prompt = job.prompt
            self.in_flight += 1
            self.calls += 1
            try:
                self._launch(job)
            except Exception as exc:  # noqa: BLE001 -- a call that cannot start is settled, never lost
                self.in_flight -= 1
                log.exception("endpoint %s: starting a call failed", self.name)
                self._report(job, AttemptOutcome(error=ProviderError(
                    CONFIG, f"engine could not start the call: {type(exc).__name__}: {exc}"), sent=False, final=True))

    def _start_held(self) -> None:
        """Start every waiting call the provider holds (see the module
        docstring); the others stay for the paced loop."""
        for pool in self.pools:
            heap = pool.heap
            if not any(job.held for job in heap):
                continue
            held = sorted(job for job in heap if job.held and not job.cancelled)
            pool.heap = [job for job in heap if not job.held and not job.cancelled]
            heapq.heapify(pool.heap)
            for job in held:
                alias = job.resolved.alias
                refusal = self.budget.admit(alias, job.input_estimate, job.output_estimate, batch=True)
                if refusal is not None:  # over budget: settled without a call
                    self._report(job, AttemptOutcome(error=refusal, sent=False, final=True))
                    continue
                try:
                    self._launch(job, held=True)
                except Exception as exc:  # noqa: BLE001 -- a call that cannot start is settled, never lost
                    log.exception("endpoint %s: starting a call failed", self.name)
                    self._report(job, AttemptOutcome(error=ProviderError(
                        CONFIG, f"engine could not start the call: {type(exc).__name__}: {exc}"), sent=False,
                        final=True))

    def _fail_waiting(self, error: ProviderError) -> None:
        for pool in self.pools:
            jobs, pool.heap = pool.heap, []
            for job in jobs:
                if not job.cancelled:
                    self._report(job, AttemptOutcome(error=error, sent=False, final=True))

    # -- one attempt, top-down ------------------------------------------------------
    def _launch(self, job: Job, held: bool = False) -> None:
        task = asyncio.get_running_loop().create_task(self._attempt(job, held))
        job.task = task
        budget = self.budget
        if budget.max_cost is not None:  # without a cap nothing reads the reservations: not priced twice a call
            job.cost_reserved = budget.reserve(job.resolved.alias, job.input_estimate, job.output_estimate,
                                               batch=held)
        task.add_done_callback(lambda t: self._after_attempt(t, job))

    def _call(self, r: Resolved, timeout: float) -> Awaitable[Result]:
        if r.messages is not None:
            messages: Sequence[Mapping[str, Any]] = r.messages
            if r.prefix_end is not None and self.provider.caches_prompt_prefix:
                messages = marked(messages, r.prefix_end)  # where the provider's prompt cache ends
            if r.request.stream and self.provider.can_stream:  # asked only then: other providers need not know the flag
                return self.provider.chat(r.alias.model, messages, params=r.params, timeout=timeout, stream=True)
            return self.provider.chat(r.alias.model, messages, params=r.params, timeout=timeout)
        return self.provider.embed(r.alias.model, r.request.texts, timeout=timeout)  # type: ignore[union-attr]

    async def _attempt(self, job: Job, held: bool = False) -> None:
        """One attempt: the provider call under its timeout, the reply's usage
        and cost, the slot released exactly once whatever raises, then one
        report to the owner. A held call has no slot and no timer: the
        provider's queue bounds it (a batch's 24 h window)."""
        r = job.resolved
        policy = r.endpoints[0]  # retry settings of the alias's first endpoint
        start = time.monotonic()
        job.attempts += 1
        if held:
            CALL_KEY.set(r.key)
        elif job.deadline is None and policy.total_timeout:
            job.deadline = start + policy.total_timeout
        spec_timeout = self.spec.timeout
        timeout = spec_timeout if job.deadline is None else max(0.001, min(spec_timeout, job.deadline - start))
        outcome = AttemptOutcome(started=start)
        try:
            try:
                if self.enforces_timeout or held:  # the provider's own timer bounds the call: no second one
                    outcome.result = await self._call(r, timeout)
                else:
                    async with asyncio.timeout(timeout):
                        outcome.result = await self._call(r, timeout)
                outcome.usage = check_usage(outcome.result)
            except ProviderError as exc:
                outcome.error = exc
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- a provider bug must not end the run
                outcome.error = exception_error(exc, endpoint=self.name, timeout=timeout, secret=None)
        finally:
            try:
                # spent before release(), which may start the next call under max_cost
                reserved, job.cost_reserved = job.cost_reserved, 0.0
                # A call that failed may still have been billed (a batch line whose answer could not be
                # matched: ProviderError.billed); what was billed is spent, answer or not.
                paid = outcome.result if outcome.usage else outcome.error.billed if outcome.error else None
                outcome.cost = self.budget.settle(reserved, r.alias, paid)
            except Exception as exc:  # noqa: BLE001 -- reported as an error below, never a hang
                outcome = AttemptOutcome(error=exception_error(exc, endpoint=self.name, timeout=timeout, secret=None),
                                         started=start)
            finally:
                if not held:
                    if outcome.usage is not None and self.limits.limited:  # the whole prompt, as counted
                        self.limits.observe_input(job.input_estimate, outcome.usage[0])
                    self.release(job, self._limit_usage(outcome), _reported_limits(outcome))
        if outcome.result is not None and outcome.error is not None:
            outcome.result = None
        self._report(job, outcome)

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

    def _limit_usage(self, outcome: AttemptOutcome) -> tuple[int, int] | None:
        """The reply's usage as the provider's rate limits count it: without
        prompt-cache reads where the provider does not count them."""
        usage, result = outcome.usage, outcome.result
        if usage is None or self.provider.cache_reads_count_toward_limits or not isinstance(result, ChatResult):
            return usage
        return max(0, usage[0] - result.cache_read_tokens), usage[1]

    def release(self, job: Job, usage: tuple[int, int] | None, limits: RateLimitInfo | None = None) -> None:
        """A call ended: free its slot, correct (or refund) its tokens, then
        take the limits its reply reported (`remaining` counts this call as
        the server settled it) before the next call may start."""
        self.in_flight -= 1
        if usage is not None:
            self.pacing.on_success()
        if self.limits.limited:
            try:
                charged = job.input_estimate if job.limit_input is None else job.limit_input
                self.limits.settle((charged, job.output_estimate), usage, time.monotonic(),
                                   job.resolved.alias.model)
            except Exception:  # noqa: BLE001 -- a wrong correction must not keep the slot or the call
                log.exception("endpoint %s: correcting the token reservation failed", self.name)
        if limits is not None:
            try:
                self.learn_limits(limits, time.monotonic(), job.resolved.alias.model)
            except Exception:  # noqa: BLE001 -- learning is advice: the next call must still start
                log.exception("endpoint %s: learning the rate limits from a reply failed", self.name)
        # After a success, start the next waiting call(s) right here rather
        # than waking the dispatcher task for it (a task step per call at zero
        # latency). The dispatcher is woken when it has a timer to set (a rate
        # limit, a pause) or something went wrong; its loop handles both. After
        # a failure it is woken as before: the caller first records a 429's
        # pause (on_rate_limited), which must hold back the next call.
        if usage is None or self._wake.is_set():
            self._wake.set()
            return
        try:
            delay = self._dispatch_ready()
        except Exception:  # noqa: BLE001 -- the dispatcher logs it and fails the waiting calls
            delay = 0.0
        if delay is not None:
            self._wake.set()

