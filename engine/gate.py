"""One endpoint's gate: every decision about its calls, behind two calls.

    gate = Gate(spec, budget, notices, retry_policy, max_concurrency=16, now=monotonic())
    gate.admit(job, now, in_flight)   -> START | Start(slot=False) | Wait(seconds) | Refuse(error)
    gate.observe(job, outcome, now)   -> RetryAt(at) | DONE

`admit` is asked by the dispatcher (engine/dispatch.py) for the call it
would start next: the endpoint's pause after 429s, its concurrency cap, the
run's budget (engine/budget.py) and its rate limits (engine/limiter.py, a
reservation taken when it says START). `observe` is told how every attempt
ended: what the reply teaches (the 429 share and slow-downs of
engine/pacing.py, the token counts, the limits the reply's headers
reported) and whether and when the call is tried again (a retry: the same
call sent again after a backoff, engine/retry.py). The dispatcher keeps
the queue, the slots and the tasks; the engine (engine/scheduler.py) only
settles the calls observe says are DONE. A change to how a 429 is handled
is a change to this file (and to engine/pacing.py's slow-down rules).

The gate has no clock, task or I/O of its own: the time is passed in, so
every rule is a unit test on a clock the test advances (tests/test_gate.py).

429s are the provider's pacing, not a fault of the call: they have their own,
larger allowance of attempts (RATE_LIMITED_ATTEMPTS) apart from the
endpoint's max_attempts, and a server's wait longer than max_retry_after is
capped (and reported).

A dead endpoint: when DOWN_AFTER calls in a row failed for good with a fault
of the endpoint (ENDPOINT_FAULTS: 5xx, timeouts, refused connections, auth,
crashed workers) and no reply in between said the endpoint works (a
success, or a refusal of one call such as prompt_too_long; 429s and bad
replies neither count nor clear), the endpoint is down: its waiting calls and any later
ones are refused unsent (`admit` says Refuse, `observe` allows no retry),
announced once, while the other endpoints go on. Each of those calls used
its whole allowance of attempts first (max_attempts, with backoff), so a
server's bad minute is ridden out by the retries, and a 429 storm is never
taken for death.
"""
from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

from engine.budget import Budget
from engine.call import AttemptOutcome, Job
from engine.limiter import EndpointLimits
from engine.pacing import Pacing
from engine.retry import RetryPolicy
from providers.base import (
    AUTH,
    CONNECTION,
    CRASHED,
    OVERLOADED,
    RATE_LIMITED,
    TIMEOUT,
    ChatResult,
    EndpointSpec,
    ErrorKind,
    ProviderError,
    RateLimitInfo,
)

# Attempts a call may spend on 429s, counted apart from max_attempts for other errors.
RATE_LIMITED_ATTEMPTS = 12
# Longest back-off of a call after a 429 that names no wait.
UNNAMED_429_RETRY_CAP = 2.0
# A retry or a pause waiting this long (or longer) is announced on stderr.
NOTICE_WAIT = 5.0
# Calls in a row failed for good with a fault of the endpoint, none answered in between: it is down.
DOWN_AFTER = 5
ENDPOINT_FAULTS = frozenset({OVERLOADED, TIMEOUT, CONNECTION, AUTH, CRASHED})
_UNITS = {"requests": "requests/min", "tokens": "tokens/min", "input_tokens": "input tokens/min",
          "output_tokens": "output tokens/min"}


class Notices(Protocol):
    """Where the gate's lines go (the engine's `notice`: stderr, at most once per `every` s per key)."""

    def notice(self, message: str, *, key: Hashable = None, every: float = 10.0) -> None: ...


@dataclass(frozen=True, slots=True)
class Start:
    """Send the call now; `slot`: it holds one of the endpoint's concurrency slots."""

    slot: bool = True


@dataclass(frozen=True, slots=True)
class Wait:
    """Not yet: ask again in `seconds`, or (None) when a slot or the budget frees."""

    seconds: float | None = None
    for_budget: bool = False  # the calls in flight hold the budget's room: ask again when one settles


@dataclass(frozen=True, slots=True)
class Refuse:
    """Settle the call unsent with `error`."""

    error: ProviderError


@dataclass(frozen=True, slots=True)
class RetryAt:
    """Queue the call again at `at` (the clock `observe` was given)."""

    at: float


@dataclass(frozen=True, slots=True)
class Done:
    """Settle the call with the outcome observed."""


START = Start()
DONE = Done()
_WAIT_FOR_SLOT = Wait()
_WAIT_FOR_BUDGET = Wait(for_budget=True)
Admission = Start | Wait | Refuse
Verdict = RetryAt | Done


class Health:
    """Whether the endpoint still answers (see the module docstring)."""

    __slots__ = ("failed_in_row", "last", "down", "failed_when_down")

    def __init__(self) -> None:
        self.failed_in_row = 0
        self.last: ProviderError | None = None
        self.down: ProviderError | None = None  # what a call not sent to a dead endpoint settles with
        self.failed_when_down = 0

    def answered(self) -> None:
        """A reply showed the endpoint works (a result, or a refusal of that one call)."""
        self.failed_in_row = 0

    def failed_for_good(self, error: ProviderError, name: str) -> bool:
        """A call failed for good with a fault of the endpoint; True when this makes it down."""
        self.failed_in_row += 1
        self.last = error
        if self.down is not None or self.failed_in_row < DOWN_AFTER:
            return False
        self.failed_when_down = self.failed_in_row
        self.down = ProviderError(error.kind, f"not sent: endpoint {name} is down ({self.failed_in_row} calls in "
                                              f"a row failed, none succeeded; last: {error.message})",
                                  status=error.status)
        return True


class Gate:
    """One endpoint's admission, lessons and retries (see the module docstring)."""

    def __init__(self, spec: EndpointSpec, budget: Budget, notices: Notices, retry_policy: RetryPolicy | None = None,
                 *, max_concurrency: int, now: float, cache_reads_count: bool = True):
        self.name = spec.name
        self.spec = spec
        self.budget = budget
        self.notices = notices
        self.backoff = retry_policy or RetryPolicy()
        self.cache_reads_count = cache_reads_count  # the provider counts prompt-cache reads toward its limits
        self.limits = EndpointLimits(spec, now=now)
        self.pacing = Pacing(max_concurrency, self.limits, now)  # pause, slow-downs, AIMD after 429s
        self.health = Health()
        self.down: ProviderError | None = None  # once it is down: what the calls not sent to it settle with
        # per-minute limits the provider reported: model -> RateLimitInfo group -> rate
        self.learned_limits: dict[str, dict[str, float]] = {}
        self.rate_limited = 0          # 429 replies
        self.retries = 0               # calls queued again after a failed attempt
        self.retry_after_capped = 0    # 429s whose retry-after exceeded max_retry_after

    # -- admission -------------------------------------------------------------------
    def admit(self, job: Job, now: float, in_flight: int) -> Admission:
        """Whether `job` may be sent now (START takes its rate-limit reservation)."""
        if self.down is not None:
            return Refuse(self.down)
        if job.held:  # its provider queues it (a batch): no slot, no pacing; the budget at the batch price
            refusal = self.budget.admit(job.resolved.alias, job.input_estimate, job.output_estimate, batch=True)
            if refusal is not None:
                return Refuse(refusal)
            job.began(now, None)
            return Start(slot=False)
        pacing = self.pacing
        if now < pacing.paused_until:
            return Wait(pacing.paused_until - now)
        factor = pacing.factor(now)
        if in_flight >= pacing.concurrency_cap(factor):
            return _WAIT_FOR_SLOT
        budget, alias = self.budget, job.resolved.alias
        refusal = budget.admit(alias, job.input_estimate, job.output_estimate)
        if refusal is not None:
            if budget.fits_after_inflight(alias, job.input_estimate, job.output_estimate):
                return _WAIT_FOR_BUDGET
            return Refuse(refusal)
        limits = self.limits
        if limits.limited:
            limits.set_scale(factor, now)
            if job.limit_input is None:  # the estimate as the server's counts have run so far
                job.charge_input(limits.calibrated(job.input_estimate))
            charged = job.limit_input or job.input_estimate
            model = alias.model  # learned limits are the model's own
            delay = limits.delay(charged, job.output_estimate, now, model)
            if delay > 0.0:
                return Wait(delay)
            limits.reserve(charged, job.output_estimate, now, model)
        job.began(now, job.resolved.endpoints[0].total_timeout)
        return START

    # -- what an attempt teaches, and whether the call is tried again -------------------
    def observe(self, job: Job, outcome: AttemptOutcome, now: float) -> Verdict:
        """An attempt of `job` ended (sent at outcome.started): learn from its
        reply, then RetryAt(when) to try the call again, or DONE to settle it."""
        if not outcome.sent or outcome.final:
            return DONE
        error = outcome.error
        limited = error is not None and error.kind == RATE_LIMITED
        if not job.held:
            self._settle_tokens(job, outcome, now)
            self._on_reply(limited, now, outcome.started)
        if error is None:
            self.health.answered()
            return DONE
        job.ended(error)
        if limited:
            self.rate_limited += 1
        elif error.kind not in ENDPOINT_FAULTS and error.kind != ErrorKind.BAD_REPLY:
            self.health.answered()  # the server read the call and refused it: it works
        if job.cancelled:  # nobody waits for it any more
            return DONE
        verdict = self._retry(job, error, now, sent_at=None if job.held else outcome.started)
        if verdict is DONE and error.kind in ENDPOINT_FAULTS and self.health.failed_for_good(error, self.name):
            self.down = self.health.down
        return verdict

    def cancelled(self, job: Job, now: float) -> None:
        """An attempt was cancelled before its reply: its token reservations are refunded."""
        if not job.held:
            self._settle_tokens(job, AttemptOutcome(), now)

    def _settle_tokens(self, job: Job, outcome: AttemptOutcome, now: float) -> None:
        """Correct (or refund) the call's token reservations from its usage, and
        take the limits its reply reported (`remaining` counts this call)."""
        usage = outcome.usage
        limits = self.limits
        if usage is not None:
            self.pacing.on_success()
        if limits.limited:
            model = job.resolved.alias.model
            if usage is not None:  # the whole prompt, as counted
                limits.observe_input(job.input_estimate, usage[0])
            charged = job.input_estimate if job.limit_input is None else job.limit_input
            limits.settle((charged, job.output_estimate), self._limit_usage(outcome), now, model)
        reply = outcome.result if outcome.result is not None else outcome.error
        self.learn_limits(getattr(reply, "rate_limits", None), now, job.resolved.alias.model)

    def _limit_usage(self, outcome: AttemptOutcome) -> tuple[int, int] | None:
        """The reply's usage as the provider's rate limits count it: without
        prompt-cache reads where the provider does not count them."""
        usage, result = outcome.usage, outcome.result
        if usage is None or self.cache_reads_count or not isinstance(result, ChatResult):
            return usage
        return max(0, usage[0] - result.cache_read_tokens), usage[1]

    def _on_reply(self, rate_limited: bool, now: float, sent_at: float) -> None:
        """Every finished attempt, answered 429 or not (the pacing judges its
        slow-down trials on them)."""
        share = self.pacing.on_reply(rate_limited, now, sent_at)
        if share is not None:  # a slow-down did not lower the 429 share: undone
            self.notices.notice(f"{self.name}: {share:.0%} of replies are 429 whatever our rate (not caused "
                                f"by our speed): keeping full speed and retrying them",
                                key=("revert", self.name), every=60.0)

    def _retry(self, job: Job, error: ProviderError, now: float, sent_at: float | None = None) -> Verdict:
        """Whether and when a failed call is tried again; a 429 also paces the endpoint."""
        limited = error.kind == RATE_LIMITED
        wait = error.retry_after
        max_wait = self.spec.max_retry_after
        if wait is not None and wait > max_wait:
            if limited:
                self.retry_after_capped += 1
                self.notices.notice(f"{self.name} asked to wait {wait:,.0f} s before retrying (HTTP 429); "
                                    f"waiting {max_wait:g} s instead (max_retry_after)", key=("cap", self.name))
            wait = max_wait
        if limited and sent_at is not None:
            self._on_rate_limited(wait, now, sent_at, said_limits=error.rate_limits is not None,
                                  opening=self.limits.opening(sent_at))
        delay = self.retry_delay(job, error, wait)
        if delay is None or self.down is not None or job.deadline is not None and now + delay >= job.deadline:
            return DONE
        self.retries += 1
        if delay >= NOTICE_WAIT:
            self.notices.notice(f"waiting for {self.name}: {error.kind}, retrying in {delay:.0f} s",
                                key=("wait", self.name))
        return RetryAt(now + delay)

    def retry_delay(self, job: Job, error: ProviderError, wait: float | None) -> float | None:
        """Seconds before the call is tried again after `error` (the server's
        `wait` already capped), or None when it is not: not a retryable kind,
        or its attempts are spent (429s have an allowance of their own)."""
        if error.kind == RATE_LIMITED:  # not retryable: the server said not to (x-should-retry: false)
            nth = job.rate_limited
            allowed = error.retryable and nth < max(job.resolved.endpoints[0].max_attempts, RATE_LIMITED_ATTEMPTS)
        else:
            nth = job.attempts - job.rate_limited
            allowed = error.retryable and nth < job.resolved.endpoints[0].max_attempts
        if not allowed:
            return None
        delay = self.backoff.delay(max(1, nth), wait)
        if error.kind == RATE_LIMITED and wait is None:
            # No wait named: the endpoint's pause and slow-down handle a real
            # overload; the call itself backs off a bounded time.
            delay = min(delay, UNNAMED_429_RETRY_CAP)
        return delay

    def _on_rate_limited(self, wait: float | None, now: float, sent_at: float, said_limits: bool,
                         opening: bool) -> None:
        """A 429 (its wait already capped): the pacing pauses and slows down; a long pause is announced."""
        paused = self.pacing.on_rate_limited(wait, now, sent_at, said_limits=said_limits, opening=opening)
        if paused is not None and paused >= NOTICE_WAIT:
            self.notices.notice(f"waiting for {self.name}: rate-limited (HTTP 429), paused for {paused:.0f} s",
                                key=("pause", self.name))

    # -- limits the provider reported ---------------------------------------------------
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
        if first:
            self.notices.notice(f"{self.name}: the provider reports for {model} {self.describe_learned(model)}",
                                key=("learned", self.name, model), every=math.inf)

    def describe_learned(self, model: str) -> str:
        """The limits learned for `model` and the configured ones, on one line."""
        parts = []
        for name, rate in self.learned_limits.get(model, {}).items():
            unit = _UNITS[name]
            configured = self.limits.configured_rate(name)
            if configured is None:
                parts.append(f"{rate:,.0f} {unit} (none configured: using it)")
            elif rate < configured:
                parts.append(f"{rate:,.0f} {unit} (lower than the configured {configured:,.0f}: using it)")
            else:
                parts.append(f"{rate:,.0f} {unit} (configured {configured:,.0f} kept)")
        return ", ".join(parts)

    def down_line(self, waiting: int, rerun: str) -> str:
        """The one line saying the endpoint is down: what failed, how many
        calls are left unsent, and the rerun that resumes."""
        health = self.health
        last = health.last
        return (f"{self.name} is down: {health.failed_when_down} calls in a row failed ({last}) and none succeeded; "
                f"not sending its {waiting} waiting call{'' if waiting == 1 else 's'} nor any later one (the other "
                f"endpoints go on); "
                f"when it is back, rerun {rerun} to resume (finished calls are cached)")
