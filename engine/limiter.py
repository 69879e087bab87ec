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

The burst (capacity) is half a second of rate, not a whole minute: OpenAI and
Anthropic enforce per-minute limits over shorter intervals ("60 RPM may be
enforced as 1 request per second"), so a client bursting a minute's worth is
answered with 429s. Half a second stays inside a server's one-second burst
with room for network jitter, and the long-run rate is the configured one.
"""
from __future__ import annotations

from providers.base import EndpointSpec

# Seconds of rate a bucket may hold as a burst.
BURST_SECONDS = 0.5


class LeakyBucket:
    """`rate_per_minute` units per minute, bursts of `burst_seconds` of rate.

    All methods take the current monotonic time `now` so that one endpoint
    check reads the clock once. A single reservation larger than the capacity
    (a whole book under a small TPM limit) is admitted when the bucket is
    empty and then holds the bucket over capacity until it drains.
    """

    __slots__ = ("rate", "capacity", "level", "scale", "_last")

    def __init__(self, rate_per_minute: float, *, burst_seconds: float = BURST_SECONDS, now: float = 0.0):
        if rate_per_minute <= 0:
            raise ValueError("rate_per_minute must be positive")
        self.rate = rate_per_minute / 60.0  # units per second
        self.capacity = max(self.rate * burst_seconds, 1.0)
        self.level = 0.0
        self.scale = 1.0  # share of the rate currently allowed (lowered after 429s)
        self._last = now

    def _leak(self, now: float) -> None:
        if self.level:
            self.level = max(0.0, self.level - (now - self._last) * self.rate * self.scale)
        self._last = now

    def delay(self, amount: float, now: float) -> float:
        """Seconds until `amount` fits (0.0: it fits now)."""
        self._leak(now)
        excess = self.level + min(amount, self.capacity) - self.capacity
        return excess / (self.rate * self.scale) if excess > 1e-9 else 0.0

    def reserve(self, amount: float, now: float) -> None:
        self._leak(now)
        self.level += amount

    def refund(self, amount: float, now: float) -> None:
        self._leak(now)
        self.level = max(0.0, self.level - amount)

    def correct(self, reserved: float, actual: float, now: float) -> None:
        """Replace a reservation by the usage the provider reported."""
        if actual < reserved:
            self.refund(reserved - actual, now)
        elif actual > reserved:
            self.reserve(actual - reserved, now)

    def set_scale(self, scale: float, now: float) -> None:
        if scale != self.scale:
            self._leak(now)
            self.scale = scale


class EndpointLimits:
    """The three per-minute limits of one endpoint; absent limits cost nothing."""

    __slots__ = ("requests", "input_tokens", "output_tokens", "_buckets")

    def __init__(self, spec: EndpointSpec, *, burst_seconds: float = BURST_SECONDS, now: float = 0.0):
        def bucket(rate: float | None) -> LeakyBucket | None:
            return LeakyBucket(rate, burst_seconds=burst_seconds, now=now) if rate else None

        self.requests = bucket(spec.rpm)
        self.input_tokens = bucket(spec.input_tpm)
        self.output_tokens = bucket(spec.output_tpm)
        self._buckets = [b for b in (self.requests, self.input_tokens, self.output_tokens) if b is not None]

    @property
    def limited(self) -> bool:
        return bool(self._buckets)

    def delay(self, input_tokens: int, output_tokens: int, now: float) -> float:
        """Seconds until one request of this size fits every limit."""
        wait = 0.0
        if self.requests is not None:
            wait = self.requests.delay(1, now)
        if self.input_tokens is not None:
            wait = max(wait, self.input_tokens.delay(input_tokens, now))
        if self.output_tokens is not None:
            wait = max(wait, self.output_tokens.delay(output_tokens, now))
        return wait

    def reserve(self, input_tokens: int, output_tokens: int, now: float) -> None:
        if self.requests is not None:
            self.requests.reserve(1, now)
        if self.input_tokens is not None:
            self.input_tokens.reserve(input_tokens, now)
        if self.output_tokens is not None:
            self.output_tokens.reserve(output_tokens, now)

    def settle(self, reserved: tuple[int, int], actual: tuple[int, int] | None, now: float) -> None:
        """After a call: correct token reservations from the reported usage, or
        refund them when the call failed (`actual` None). The request itself
        stays counted: the server saw it."""
        used_in, used_out = actual if actual is not None else (0, 0)
        if self.input_tokens is not None:
            self.input_tokens.correct(reserved[0], used_in, now)
        if self.output_tokens is not None:
            self.output_tokens.correct(reserved[1], used_out, now)

    def set_request_rate(self, rpm: float, now: float) -> None:
        """Replace the request limit (an inferred one, after a 429)."""
        old = self.requests
        self.requests = LeakyBucket(rpm, now=now)
        self.requests.level = self.requests.capacity  # just told we were too fast: no burst
        if old is not None:
            self.requests.scale = old.scale
        self._buckets = [b for b in (self.requests, self.input_tokens, self.output_tokens) if b is not None]

    def restore_request_limit(self, bucket: LeakyBucket | None, now: float) -> None:
        """Put back the request limit in force before a slow-down (None: no limit)."""
        if bucket is not None:
            bucket._leak(now)
            bucket.scale = 1.0
        self.requests = bucket
        self._buckets = [b for b in (self.requests, self.input_tokens, self.output_tokens) if b is not None]

    def set_scale(self, scale: float, now: float) -> None:
        for b in self._buckets:
            b.set_scale(scale, now)
