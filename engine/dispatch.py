"""Per-endpoint dispatch: which waiting call an endpoint starts next, and when.

Waiting calls sit in a `Pool`, one per set of endpoints that can serve them (a
model alias's replicas). Each endpoint runs one dispatcher task that pulls from
every pool it serves: it starts the oldest waiting call as soon as it has a free
concurrency slot, is not paused after a 429, and its rate limits admit the call
(see engine/limiter.py). With replicas, every endpoint of the pool races for the
same head call and the one that can start it soonest takes it, so traffic
spreads by free capacity. Dispatchers sleep on an event plus a timer set to the
exact time capacity frees; nothing polls.

After a 429 (see `EndpointState.on_rate_limited`): the call itself waits the
server's retry-after (the engine caps it); the whole endpoint pauses only when
429s dominate its recent replies; and it slows down once per episode -- half
the rate and concurrency, recovered linearly over RECOVERY_SECONDS, or for an
endpoint without a set (or learned) RPM an inferred request rate. A 429 that
says nothing (no retry-after, no rate-limit header) also halves the
concurrency cap, which then regrows by one per cap's worth of successful
replies (additive increase). Each slow-down is a trial judged on the replies
that follow it: kept only if it lowered the 429 share beyond chance, undone
otherwise (429s not caused by our speed -- another process on the account, a
provider's bad minute -- must not starve the run).

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
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.budget import Budget
from engine.limiter import EndpointLimits
from engine.resolve import Resolved
from engine.warmup import marked
from providers.base import BAD_REPLY, CONFIG, ChatResult, EndpointSpec, Provider, ProviderError, RateLimitInfo, Result
from providers.http_errors import exception_error

log = logging.getLogger(__name__)

DEFAULT_PAUSE = 1.0          # seconds to pause after a 429 that names no wait
RECOVERY_SECONDS = 30.0      # from half rate back to full rate after a 429
MIN_FACTOR = 1 / 16
INFERRED_DOUBLING = 20.0     # seconds for an inferred request rate to double
MAX_INFERRED_FACTOR = 1e6
SHARE_WINDOW = 40            # replies over which the 429 share before a slow-down is measured
TRIAL_REPLIES = 12           # replies to calls sent after a slow-down before judging it
TRIAL_SECONDS = 30.0         # a trial not judged by then (too few replies) is kept
MIN_TRIAL_EVIDENCE = 6       # replies before a slow-down needed to judge it at all
KEPT_FLOOR = 0.1             # or if it fell below this
KEPT_Z = 1.65                # a slow-down is kept if the 429 share fell by this many standard errors
ALWAYS_KEPT_SHARE = 0.6      # past this share of 429s we are far too fast: a slow-down is never undone
IGNORE_SECONDS = 60.0        # after an undone slow-down, 429s at that share slow nothing down
IGNORE_MARGIN = 0.25         # ... unless the share rises this much above it
PAUSE_WINDOW = 10            # the endpoint pauses on a 429 when, over its last replies,
PAUSE_SHARE = 0.8            # at least this share were 429s (30% random 429s reach it once in ~600)
TOO_FAST_SHARE = 0.5         # a 429 share this high is our speed: a running trial does not hold slow-downs back
MIN_PAUSE_EVIDENCE = 4       # replies needed to judge (with none known at all, a 429 pauses)
NOTICE_PAUSE = 5.0           # pauses this long are announced on stderr

# The cache key of the call an attempt's task is making (set only for a call
# the provider holds, which records it under that key: a batch line's custom_id).
CALL_KEY: ContextVar[str | None] = ContextVar("tulving_call_key", default=None)


@dataclass(eq=False, slots=True)
class Job:
    """One distinct uncached call, shared by every identical request waiting on it."""

    resolved: Resolved
    seq: int
    input_estimate: int
    output_estimate: int
    prompt: tuple[str, ...] | None = None       # roles and contents, for prefix ordering
    waiters: list[tuple[Any, Any]] = field(default_factory=list)  # (request, sink)
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

    def notice(self, message: str, *, key: Any = None, every: float = 10.0) -> None:
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


def _clearly_lower(after: float, n_after: int, before: float, n_before: int) -> bool:
    """Whether the 429 share `after` a slow-down is lower than `before` beyond
    chance (a one-sided two-proportion z-test at KEPT_Z)."""
    pooled = (after * n_after + before * n_before) / (n_after + n_before)
    spread = math.sqrt(pooled * (1.0 - pooled) * (1.0 / n_after + 1.0 / n_before))
    return before - after > KEPT_Z * spread if spread > 0 else after < before


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
        self.paused_until = 0.0
        self.last_prompt: tuple[str, ...] | None = None
        self.calls = 0
        self.rate_limited = 0
        self._factor = 1.0
        self._factor_since = now
        self._inferred = False      # the request rate was inferred after a 429
        self.succeeded = 0
        self._mark_time, self._mark_done = now, 0
        self._last_slowdown = -math.inf
        self._replies: deque[tuple[float, bool]] = deque(maxlen=4 * SHARE_WINDOW)  # (sent at, answered 429)
        self._trial: tuple[Any, ...] | None = None
        self._ignore_until = -math.inf
        self._ignored_share = 0.0
        self.reverted = 0           # slow-downs undone because they did not lower the 429 share
        self._concurrency = self.max_concurrency  # cap lowered by 429s that say nothing (AIMD)
        self._grow_count = 0                      # successes towards the cap's next +1
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
        """Every finished attempt, answered 429 or not, and when it was sent:
        the recent 429 share decides whether a slow-down helped (`_judge_trial`)."""
        self._replies.append((sent_at, rate_limited))
        if self._trial is not None:
            self._judge_trial(now)

    def recent_429_share(self, last: int = SHARE_WINDOW) -> tuple[float, int]:
        """(share of 429s, replies counted) over the last `last` replies."""
        replies = [limited for _, limited in list(self._replies)[-last:]]
        return (sum(replies) / len(replies) if replies else 0.0), len(replies)

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
        if "requests" in changed and self._inferred:  # told the rate: no need to guess it
            self.limits.restore_request_limit(None, now)  # an inferred rate means none was configured
            self._inferred = False
            self._factor, self._factor_since = min(1.0, self._factor), now
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
        """A 429: slow down once per episode -- a 429 to a call sent before
        the last slow-down belongs to that episode (it was sent too fast
        already) -- and pause dispatch until the server's wait while 429s
        dominate the recent replies (a lone 429 delays only its own call).

        With a configured RPM the effective rate and concurrency halve. An
        endpoint configured without one gets a request rate inferred from what
        it achieved since the previous episode (concurrency alone cannot slow
        fast calls down), which then grows exponentially until the next 429.

        A slow-down is a trial: once TRIAL_REPLIES replies to calls sent after
        it are in, it is kept only if it lowered the 429 share; otherwise the
        429s are not caused by our speed (another process on the account, a
        provider's bad minute), the rate before the trial is restored, and
        429s at that share cause no slow-down for IGNORE_SECONDS.

        A 429 that says nothing of the limits (no `retry_after`, no rate-limit
        headers in `limits`) also halves the concurrency cap, part of the same
        trial; it regrows additively with the successful replies (`release`)."""
        self.rate_limited += 1
        wait = retry_after if retry_after is not None else DEFAULT_PAUSE
        share, counted = self.recent_429_share(PAUSE_WINDOW)
        ignoring = now < self._ignore_until and share < self._ignored_share + IGNORE_MARGIN
        if not ignoring and (counted == 0 or counted >= MIN_PAUSE_EVIDENCE and share >= PAUSE_SHARE):
            if now + wait > self.paused_until:
                self.paused_until = now + wait
                if wait >= NOTICE_PAUSE and self.owner is not None:
                    until = time.strftime("%H:%M:%S", time.localtime(time.time() + wait))
                    self.owner.notice(f"waiting for {self.name}: rate-limited (HTTP 429), paused until {until} "
                                      f"({wait:.0f} s)", key=("pause", self.name))
        trial = self._trial
        if trial is not None and now - trial[0] > TRIAL_SECONDS:  # never judged: kept
            trial = self._trial = None
        if ignoring or trial is not None and self._trial_blocks(trial[0]) and (
                sent_at is None or sent_at >= self._last_slowdown):
            return  # known not to be ours, or a judgeable trial is running: one slow-down per trial
        if sent_at is None or sent_at >= self._last_slowdown:
            if trial is None:  # the state to go back to if the slow-down(s) of this trial do not help
                self._trial = (now, self.factor(now), self._inferred, self.limits.requests, self._concurrency)
            if not self.limits.knows_request_limit() or self._inferred:
                self._infer_rate(now)
                self._factor = 0.9
            else:
                self._factor = max(MIN_FACTOR, self.factor(now) * 0.5)
            if retry_after is None and limits is None:  # nothing said: fewer calls at once too
                self._concurrency, self._grow_count = max(1, self._concurrency // 2), 0
            self._last_slowdown = now
        self._factor_since = max(self.paused_until, now)  # no recovery while paused

    def _trial_blocks(self, started: float) -> bool:
        """Whether the running trial holds further slow-downs back: it can be
        judged (enough replies from before it) and 429s since it are not so
        many that we are plainly still far too fast."""
        before = [limited for sent, limited in self._replies if sent < started][-SHARE_WINDOW:]
        after = [limited for sent, limited in self._replies if sent >= started]
        plainly_too_fast = any(len(part) >= 4 and sum(part) / len(part) >= TOO_FAST_SHARE for part in (before, after))
        return len(before) >= MIN_TRIAL_EVIDENCE and not plainly_too_fast

    def _judge_trial(self, now: float) -> None:
        assert self._trial is not None  # judged only while a trial runs
        started, factor, inferred, requests, concurrency = self._trial
        after = [limited for sent, limited in self._replies if sent >= started]
        if len(after) < TRIAL_REPLIES:
            return
        self._trial = None
        before = [limited for sent, limited in self._replies if sent < started][-SHARE_WINDOW:]
        share_before = sum(before) / len(before) if before else 0.0
        share_after = sum(after) / len(after)
        if (len(before) >= MIN_TRIAL_EVIDENCE and share_after >= KEPT_FLOOR
                and max(share_before, share_after) < ALWAYS_KEPT_SHARE
                and not _clearly_lower(share_after, len(after), share_before, len(before))):
            # The slow-down did not lower the 429 share: undo it.
            self._factor, self._factor_since = factor, now
            self._inferred = inferred
            self._concurrency = max(self._concurrency, concurrency)
            self.limits.restore_request_limit(requests, now)
            self.paused_until = min(self.paused_until, now)
            self._ignore_until = now + IGNORE_SECONDS
            self._ignored_share = max(share_before, share_after)
            self.reverted += 1
            if self.owner is not None:
                self.owner.notice(f"{self.name}: {share_after:.0%} of replies are 429 whatever our rate "
                                  f"(not caused by our speed): keeping full speed and retrying them",
                                  key=("revert", self.name), every=60.0)
            self.wake()

    def _infer_rate(self, now: float) -> None:
        elapsed = now - self._mark_time
        done = self.succeeded - self._mark_done
        per_second = done / elapsed if elapsed > 0 and done > 0 else 1.0
        rpm = max(1.0, per_second * 60.0)
        if self._inferred and self.limits.requests is not None:
            # An episode that follows a pause measures few successes: never
            # fall below half the rate in use (AIMD), or the rate collapses and
            # takes minutes to double back (seen: 54 s instead of 4 s).
            in_use = self.limits.requests.rate * 60.0 * self.factor(now)
            rpm = max(rpm, in_use * 0.5)
        self.limits.set_request_rate(rpm, now)
        self._inferred = True
        self._mark_time, self._mark_done = now, self.succeeded

    def factor(self, now: float) -> float:
        """Share of the configured (or inferred) rate currently used: back to
        1.0 linearly over RECOVERY_SECONDS after a halving; an inferred rate
        doubles every INFERRED_DOUBLING seconds, probing for the real limit."""
        if now > self._factor_since:
            if self._inferred:
                if self._factor < MAX_INFERRED_FACTOR:
                    self._factor = min(MAX_INFERRED_FACTOR, self._factor * 2.0 ** min(
                        64.0, (now - self._factor_since) / INFERRED_DOUBLING))
            elif self._factor < 1.0:
                self._factor = min(1.0, self._factor + (now - self._factor_since) / RECOVERY_SECONDS)
            self._factor_since = now
        return self._factor

    def concurrency_cap(self, factor: float) -> int:
        """Calls this endpoint may have in flight now: max_concurrency, scaled
        down with the rate after a 429 (`factor`) and by the cap that 429s
        saying nothing halve (it regrows additively in `release`)."""
        return max(1, min(math.floor(self.max_concurrency * min(1.0, factor)), self._concurrency))

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
            if now < self.paused_until:
                return self.paused_until - now
            factor = self.factor(now)
            if self.in_flight >= self.concurrency_cap(factor):
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
                charged = job.input_estimate if job.limit_input is None else job.limit_input
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
        job.cost_reserved = self.budget.reserve(job.resolved.alias, job.input_estimate, job.output_estimate,
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
                outcome.cost = self.budget.settle(reserved, r.alias, outcome.result if outcome.usage else None)
            except Exception as exc:  # noqa: BLE001 -- reported as an error below, never a hang
                outcome = AttemptOutcome(error=exception_error(exc, endpoint=self.name, timeout=timeout, secret=None),
                                         started=start)
            finally:
                if not held:
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
            self.succeeded += 1
            if self._concurrency < self.max_concurrency:  # additive increase: +1 per cap's worth of replies
                self._grow_count += 1
                if self._grow_count >= self._concurrency:
                    self._concurrency, self._grow_count = self._concurrency + 1, 0
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

