"""Per-endpoint rate limits: requests, input tokens and output tokens per minute.

Each limit is a leaky bucket (the model of aiolimiter's one class): a level
that drains continuously at the configured rate and may hold at most
`capacity` units. Unlike aiolimiter the bucket has no waiters of its own: it is
*passive*. It answers "how long until this reservation fits?" without
blocking, takes a reservation, and takes refunds/corrections once the reply
reports the real usage. The engine's one dispatcher per endpoint is the only
waiter; it sleeps on a timer set to the exact time capacity frees (no polling),
and with replicas it compares those delays to send each call to the endpoint
that can start it soonest -- which a blocking `acquire()` cannot tell.

The burst (capacity) is a tenth of a second of rate, not a whole minute:
OpenAI and Anthropic enforce per-minute limits over shorter intervals ("60
RPM may be enforced as 1 request per second"), so a client bursting a
minute's worth is answered with 429s. The long-run rate is the configured
one. A bigger burst only echoes: the calls of a burst arrive spread out
(new connections), and a second later the log below releases as many at
once, which then land inside the server's window (seen at 0.5 s: 7 429s a
second after the start).

A bucket alone still lets its burst *plus* a second of rate -- 1.5x a
second's share -- into one trailing second, which a server counting over
any sliding second refuses (benchmarks/limits_bench.py: every 429 followed such a burst). So
each bucket also keeps a log of what it admitted: no trailing SEND_WINDOW
holds more than a second's share of the rate. The window is a little longer
than a second because the server counts arrivals, which trail our sends by
a few jittery milliseconds. What is sent within the log also conforms to a
token bucket of a second's burst (n in any second means at most
n * ceil(T) in any T seconds <= n + n * T), so one pacing serves both.

Limits learned from the provider (`EndpointLimits.learn`, from the reply
headers parsed by providers/ratelimit_headers.py) get buckets of their own,
per model (the providers limit each model apart), enforced beside the
configured ones: so the lower of the two always binds and a provider
reporting a higher limit never raises a configured one. A learned bucket
follows the provider's `remaining`: when the provider says fewer remain than
the bucket has room for, the bucket takes the provider's word.
"""
from __future__ import annotations

import math
from collections import deque

from providers.base import EndpointSpec, RateLimitInfo

# Seconds of rate a bucket may hold as a burst.
BURST_SECONDS = 0.1
# No trailing window this long holds more than a second's share of the rate
# (a second plus a margin for the jitter between our send and the server's count).
SEND_WINDOW = 1.02
# The first second's share of sends stays in the log this much longer: they
# open new connections, and arrive up to tens of ms late on a loaded machine.
COLD_MARGIN = 0.1

# A provider's limit is per minute unless its reset says it is per hour or per
# day (OpenAI's RPD/TPD): a window is read from a reset only when that is long
# enough for whole-second rounding (Anthropic's resets) to matter little.
WINDOWS = (60.0, 3600.0, 86400.0)
MIN_RESET_FOR_WINDOW = 10.0
WINDOW_FIT = 3.0  # an inferred window within this factor of a minute, an hour or a day is that one
LEARNED = ("requests", "tokens", "input_tokens", "output_tokens")  # RateLimitInfo's groups


class LeakyBucket:
    """`rate_per_minute` units per minute, bursts of `burst_seconds` of rate.

    All methods take the current monotonic time `now` so that one endpoint
    check reads the clock once. A single reservation larger than the capacity
    (a whole book under a small TPM limit) is admitted when the bucket is
    empty and then holds the bucket over capacity until it drains.
    """

    __slots__ = ("rate", "capacity", "level", "scale", "burst", "opened_at", "warm_at", "_last", "_sent", "_sent_sum", "_sends")

    def __init__(self, rate_per_minute: float, *, burst_seconds: float = BURST_SECONDS, now: float = 0.0):
        if rate_per_minute <= 0:
            raise ValueError("rate_per_minute must be positive")
        self.rate = rate_per_minute / 60.0  # units per second
        self.burst = burst_seconds
        self.capacity = max(self.rate * burst_seconds, 1.0)
        self.level = 0.0
        self.scale = 1.0  # share of the rate currently allowed (lowered after 429s)
        self._last = now
        self._sent: deque[tuple[float, float]] = deque()  # (leaves the log at, amount) of recent reservations
        self._sent_sum = 0.0
        self._sends = 0.0  # reserved so far (the first second's share is cold)
        self.opened_at = math.inf  # when the first reservation was taken
        self.warm_at = math.inf    # ... and when the first second's share had been

    def _leak(self, now: float) -> None:
        if self.level:
            self.level = max(0.0, self.level - (now - self._last) * self.rate * self.scale)
        self._last = now

    def delay(self, amount: float, now: float) -> float:
        """Seconds until `amount` fits the bucket and the send log (0.0: it fits now)."""
        self._leak(now)
        excess = self.level + min(amount, self.capacity) - self.capacity
        wait = excess / (self.rate * self.scale) if excess > 1e-9 else 0.0
        return max(wait, self._log_delay(amount, now))

    def _log_delay(self, amount: float, now: float) -> float:
        """Seconds until `amount` more keeps every trailing SEND_WINDOW within a
        second's share (an amount bigger than that share waits for an empty window)."""
        sent = self._sent
        while sent and sent[0][0] <= now:
            self._sent_sum -= sent.popleft()[1]
        if not sent:
            self._sent_sum = 0.0
            return 0.0
        share = max(1.0, self.rate * self.scale)
        excess = self._sent_sum + min(amount, share) - share
        if excess <= 1e-9:
            return 0.0
        for at, reserved in sent:  # oldest first: until enough has left the window
            excess -= reserved
            if excess <= 1e-9:
                return at - now
        return sent[-1][0] - now

    def reserve(self, amount: float, now: float) -> None:
        self._leak(now)
        self.level += amount
        # the server counts it on arrival: refunds do not take it back
        cold = self._sends < self.rate
        self._sent.append((now + SEND_WINDOW + (COLD_MARGIN if cold else 0.0), amount))
        self._sends += amount
        self._sent_sum += amount
        if self.warm_at == math.inf:
            self.opened_at = min(self.opened_at, now)
            if self._sends >= self.rate:
                self.warm_at = now

    def refund(self, amount: float, now: float) -> None:
        self._leak(now)
        self.level = max(0.0, self.level - amount)

    def correct(self, reserved: float, actual: float, now: float) -> None:
        """Replace a reservation by the usage the provider reported (in the
        send log too, while the reservation is still in its window)."""
        if actual < reserved:
            self.refund(reserved - actual, now)
        elif actual > reserved:
            self._leak(now)
            self.level += actual - reserved
        sent = self._sent
        for i, (at, amount) in enumerate(sent):  # the oldest reservation of that size: this call's, or alike
            if amount == reserved:
                sent[i] = (at, actual)
                self._sent_sum += actual - reserved
                break

    def set_scale(self, scale: float, now: float) -> None:
        if scale != self.scale:
            self._leak(now)
            self.scale = scale

    def set_rate(self, rate_per_minute: float, now: float) -> None:
        """Change the rate in place (what is reserved stays reserved)."""
        if rate_per_minute <= 0:
            raise ValueError("rate_per_minute must be positive")
        self._leak(now)
        self.rate = rate_per_minute / 60.0
        self.capacity = max(self.rate * self.burst, 1.0)

    def sync_remaining(self, remaining: float, now: float) -> None:
        """The provider says `remaining` units are left: when that is less
        room than the bucket has, take the provider's word (another client of
        the account, or our own drift)."""
        self._leak(now)
        self.level = max(self.level, self.capacity - remaining)


def learned_window(limit: float, remaining: float | None, reset: float | None, known: float = 60.0) -> float:
    """The window (seconds) of a limit the provider reports: a minute, unless
    the time it takes to restore what was used says an hour or a day. With a
    continuous refill, `reset` = used / rate, so window = reset * limit / used.
    A reply whose figures fit no window (OpenAI's documented example: 16 of
    150,000 tokens used, reset in 6m0s, "a window" of 39 days) says nothing
    and keeps `known`; one that fits a window replaces it, shorter or longer,
    so one odd reply cannot pin a limit at a day's pace for the rest of a run."""
    if remaining is None or reset is None or reset < MIN_RESET_FOR_WINDOW:
        return known
    used = limit - remaining
    if used < 1:
        return known
    estimate = reset * limit / used
    nearest = min(WINDOWS, key=lambda w: abs(math.log(estimate / w)))
    return nearest if abs(math.log(estimate / nearest)) <= math.log(WINDOW_FIT) else known


Charge = tuple[LeakyBucket, int, int, int]  # a bucket and what a call costs it: per request, input token, output token
_WEIGHTS = {"requests": (1, 0, 0), "tokens": (0, 1, 1), "input_tokens": (0, 1, 0), "output_tokens": (0, 0, 1)}


def _cost(charge: Charge, input_tokens: int, output_tokens: int) -> int:
    return charge[1] + charge[2] * input_tokens + charge[3] * output_tokens


class EndpointLimits:
    """The three per-minute limits of one endpoint (absent limits cost
    nothing), and the limits its provider reported for each model (OpenAI and
    Anthropic limit each model, or model class, apart)."""

    __slots__ = ("requests", "input_tokens", "output_tokens", "tokens", "learned", "learned_rates", "_windows",
                 "_burst", "_buckets", "_charges", "_learned_charges", "input_ratio", "limited")

    def __init__(self, spec: EndpointSpec, *, burst_seconds: float | None = None, now: float = 0.0):
        if burst_seconds is None:
            burst_seconds = BURST_SECONDS  # read at the call: a test may set a module-wide burst
        def bucket(rate: float | None) -> LeakyBucket | None:
            return LeakyBucket(rate, burst_seconds=burst_seconds, now=now) if rate else None

        self.requests = bucket(spec.rpm)
        self.input_tokens = bucket(spec.input_tpm)
        self.output_tokens = bucket(spec.output_tpm)
        # prompt + max_tokens, counted when the call starts and never corrected (OpenAI's TPM)
        self.tokens = bucket(spec.tpm)
        # Limits the provider reported: model -> RateLimitInfo group ("tokens":
        # prompt and completion together, OpenAI's only token limit) -> bucket.
        self.learned: dict[str, dict[str, LeakyBucket]] = {}
        self.learned_rates: dict[str, dict[str, float]] = {}  # the same, per minute
        self._windows: dict[tuple[str, str], float] = {}
        self._learned_charges: dict[str, list[Charge]] = {}
        self._burst = burst_seconds
        self.input_ratio = 1.0  # the server's input-token count / our estimate, as replies report it
        self._refresh()

    def calibrated(self, input_estimate: int) -> int:
        """An input-token estimate scaled by what the server's counts have been
        (a 5% underestimate against a token-bound limit is 5% too fast)."""
        return max(1, round(input_estimate * self.input_ratio))

    def observe_input(self, input_estimate: int, counted: int) -> None:
        """A reply's input-token count for a call estimated at `input_estimate`:
        the ratio follows it (a moving average over ~20 replies)."""
        if input_estimate > 0 and counted > 0:
            ratio = min(4.0, max(0.25, counted / input_estimate))
            self.input_ratio += (ratio - self.input_ratio) * 0.05

    def _refresh(self) -> None:
        """The configured buckets in force, each with what one call charges it."""
        self._charges: list[Charge] = [(b, *_WEIGHTS[name]) for name, b in (
            ("requests", self.requests), ("input_tokens", self.input_tokens), ("output_tokens", self.output_tokens),
            ("tokens", self.tokens)) if b is not None]
        self._buckets = [c[0] for c in self._charges]
        # any limit configured or learned (read before every call: an attribute, not a property)
        self.limited = bool(self._buckets) or bool(self.learned)


    def delay(self, input_tokens: int, output_tokens: int, now: float, model: str | None = None) -> float:
        """Seconds until one request of this size (to `model`) fits every limit."""
        wait = 0.0
        for charge in self._charges:
            wait = max(wait, charge[0].delay(_cost(charge, input_tokens, output_tokens), now))
        for charge in self._learned_charges.get(model, ()) if model is not None else ():
            wait = max(wait, charge[0].delay(_cost(charge, input_tokens, output_tokens), now))
        return wait

    def reserve(self, input_tokens: int, output_tokens: int, now: float, model: str | None = None) -> None:
        for charge in self._charges:
            charge[0].reserve(_cost(charge, input_tokens, output_tokens), now)
        for charge in self._learned_charges.get(model, ()) if model is not None else ():
            charge[0].reserve(_cost(charge, input_tokens, output_tokens), now)

    def settle(self, reserved: tuple[int, int], actual: tuple[int, int] | None, now: float,
               model: str | None = None) -> None:
        """After a call: correct token reservations from the reported usage, or
        refund them when the call failed (`actual` None). The request itself
        stays counted: the server saw it."""
        used_in, used_out = actual if actual is not None else (0, 0)
        learned = self._learned_charges.get(model, []) if model is not None else []
        for bucket, _, per_in, per_out in (*self._charges, *learned):
            if bucket is self.tokens:  # prompt + max_tokens: the prompt as the server counted it
                if actual is not None:
                    bucket.correct(reserved[0] + reserved[1], used_in + reserved[1], now)
            elif per_in or per_out:
                bucket.correct(per_in * reserved[0] + per_out * reserved[1], per_in * used_in + per_out * used_out, now)

    def learn(self, info: RateLimitInfo, now: float, model: str = "") -> dict[str, float]:
        """Take the limits a reply (from `model`) reported: a bucket per limit
        (per-minute rate from the limit and its window), kept in step with
        `remaining`. Returns the limits newly learned or changed (group ->
        per-minute rate). Anthropic's "tokens" (the tightest of its token
        limits) is used only when no input/output limit is reported."""
        changed: dict[str, float] = {}
        separate = info.input_tokens_limit is not None or info.output_tokens_limit is not None
        buckets = self.learned.get(model, {})
        for name in LEARNED:
            if name == "tokens" and separate:
                continue
            limit: float | None = getattr(info, f"{name}_limit")
            remaining: float | None = getattr(info, f"{name}_remaining")
            bucket = buckets.get(name)
            if limit is not None and limit >= 1:
                window = self._windows[model, name] = learned_window(
                    limit, remaining, getattr(info, f"{name}_reset"), self._windows.get((model, name), WINDOWS[0]))
                rate = limit * 60.0 / window
                if bucket is None:
                    bucket = buckets[name] = LeakyBucket(rate, burst_seconds=self._burst, now=now)
                    changed[name] = rate
                elif abs(bucket.rate * 60.0 - rate) > 1e-6 * rate:
                    bucket.set_rate(rate, now)
                    changed[name] = rate
            if bucket is not None and remaining is not None:
                bucket.sync_remaining(remaining, now)
        if changed:
            self.learned[model] = buckets
            self.limited = True
            self.learned_rates.setdefault(model, {}).update(changed)
            self._learned_charges[model] = [(b, *_WEIGHTS[name]) for name, b in buckets.items()]
        return changed

    def opening(self, sent_at: float) -> bool:
        """Whether a call sent at `sent_at` was among the first second's share
        of sends under the configured request limit: what the server's window
        held before them is not in the send log (engine/pacing.py)."""
        return self.requests is not None and self.requests.opened_at <= sent_at < self.requests.warm_at

    def knows_request_limit(self) -> bool:
        """Whether a request limit is configured or was reported for some model."""
        return self.requests is not None or any("requests" in b for b in self.learned.values())

    def configured_rate(self, name: str) -> float | None:
        """The configured per-minute limit matching a learned group (None: not
        configured; "tokens" has the `tpm` key as its twin)."""
        bucket = {"requests": self.requests, "input_tokens": self.input_tokens,
                  "output_tokens": self.output_tokens, "tokens": self.tokens}.get(name)
        return None if bucket is None else bucket.rate * 60.0

    def set_request_rate(self, rpm: float, now: float) -> None:
        """Replace the request limit (an inferred one, after a 429)."""
        old = self.requests
        self.requests = LeakyBucket(rpm, burst_seconds=self._burst, now=now)
        self.requests.level = self.requests.capacity  # just told we were too fast: no burst
        if old is not None:
            self.requests.scale = old.scale
        self._refresh()

    def restore_request_limit(self, bucket: LeakyBucket | None, now: float) -> None:
        """Put back the request limit in force before a slow-down (None: no limit)."""
        if bucket is not None:
            bucket._leak(now)
            bucket.scale = 1.0
        self.requests = bucket
        self._refresh()

    def set_scale(self, scale: float, now: float) -> None:
        """Slow every limit to `scale` of its rate. Above 1 (an inferred
        request rate probing upward) only the request limit follows: a
        configured or learned limit is never exceeded."""
        capped = min(1.0, scale)
        for b in self._buckets:
            b.set_scale(scale if b is self.requests else capped, now)
        for buckets in self.learned.values():
            for b in buckets.values():
                b.set_scale(capped, now)
