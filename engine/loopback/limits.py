"""Rate limits of the loopback server, enforced and reported like the real APIs.

Contract:
- `TokenBucket`: refills continuously at `per_minute / 60` per second up to
  `burst_seconds` worth of its rate (at least one request): both providers
  enforce per-minute limits over shorter intervals.
- `RateLimits.admit(input_tokens, now)`: (0, "") and the request and input
  buckets charged if a call may run now, else (seconds to wait, which limit).
  A call whose input exceeds the bucket is admitted when the bucket is full
  and leaves it in debt. The output bucket must be positive to admit a call
  and is charged afterwards with what was generated (`charge_output`).
- The headers report the per-minute *budget*, as the providers do (OpenAI:
  limit 60, remaining 59, reset "1s" after one request): `remaining` is what
  is left of the limit, `reset` the time until the whole budget is restored.
  Each limit keeps a budget bucket of a minute's capacity beside the burst
  bucket that enforces it, charged alike; with `burst_seconds` >= 60 they are
  one bucket. So, as with the real APIs, a 429 from the short-interval
  enforcement can come with `remaining` > 0.
- `SlidingWindow` (`window="sliding"`): at most `per_minute / 60` units in
  any 1-second window and `per_minute` in any 60-second window, as a
  provider enforcing "per minute over shorter periods" with a log of what it
  admitted (no burst beyond a second's share). A call bigger than a
  second's share is admitted into an empty second.
- `tpm`: one token limit counting the prompt plus the request's
  `max_tokens` at admission, as OpenAI counts (its "tokens" limit; checked
  2026-11-26: the reservation is prompt + max_tokens, not the tokens
  generated), beside or instead of `input_tpm` / `output_tpm`.
- `openai_headers`: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`,
  resets as relative Go durations (`go_duration`: "0s", "12ms", "1.5s",
  "6m0s", "1h0m0s"). "tokens" is the `tpm` limit, else the input-token limit.
  With `headers=False` no rate-limit header is sent (a 429 still names its
  wait in `retry-after`).
- `anthropic_headers`: `anthropic-ratelimit-{requests,tokens,input-tokens,
  output-tokens}-{limit,remaining,reset}`, resets as RFC 3339 UTC instants
  rounded up to the second; "tokens" is the tighter of input and output.
"""
from __future__ import annotations

import math
import time
from collections import deque
from datetime import UTC, datetime

BUDGET_SECONDS = 60.0  # the window of every limit the headers report


class TokenBucket:
    """Refills continuously at `per_minute / 60` per second up to `capacity`."""

    def __init__(self, per_minute: float, burst_seconds: float, minimum: float = 1.0):
        self.limit = per_minute
        self.rate = per_minute / 60.0
        self.capacity = max(minimum, self.rate * burst_seconds)
        self.level = self.capacity
        self._updated = time.monotonic()

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self._updated) * self.rate)
        self._updated = now

    def wait(self, needed: float) -> float:
        """Seconds until `needed` (capped at capacity) is available; 0 if now."""
        needed = min(needed, self.capacity)
        return 0.0 if self.level >= needed else (needed - self.level) / self.rate

    def until_full(self) -> float:
        return max(0.0, (self.capacity - self.level) / self.rate)

    def remaining(self) -> int:
        return max(0, int(self.level))

    def take(self, amount: float) -> None:
        self.level -= amount

    def in_debt_for(self) -> float:
        """Seconds until the level is positive again (0.0: it is)."""
        return -self.level / self.rate + 1e-3 if self.level <= 0 else 0.0


class SlidingWindow:
    """At most `per_minute / 60` units in any 1 s and `per_minute` in any 60 s.

    A log of (time, amount) admitted; `refill(now)` forgets what left the
    minute. The same surface as `TokenBucket` (refill, wait, take,
    in_debt_for) so `RateLimits` enforces either."""

    WINDOWS = (1.0, 60.0)

    def __init__(self, per_minute: float, minimum: float = 1.0):
        self.limit = per_minute
        self.rate = per_minute / 60.0
        self.caps = (max(minimum, self.rate), max(minimum, per_minute))
        self._logs: tuple[deque[tuple[float, float]], ...] = (deque(), deque())
        self._sums = [0.0, 0.0]
        self._now = time.monotonic()

    def refill(self, now: float) -> None:
        self._now = now
        for i, span in enumerate(self.WINDOWS):
            log = self._logs[i]
            while log and log[0][0] <= now - span:
                self._sums[i] -= log.popleft()[1]
            if not log:
                self._sums[i] = 0.0  # no float drift on an empty window

    def wait(self, needed: float) -> float:
        """Seconds until `needed` fits both windows (a call bigger than a
        window's cap fits an empty one); 0 if now."""
        return max(self._window_wait(i, min(needed, cap)) for i, cap in enumerate(self.caps))

    def _window_wait(self, i: int, needed: float) -> float:
        excess = self._sums[i] + needed - self.caps[i]
        if excess <= 1e-9:
            return 0.0
        for at, amount in self._logs[i]:  # oldest first: wait until enough has left the window
            excess -= amount
            if excess <= 1e-9:
                return max(1e-3, at + self.WINDOWS[i] - self._now)
        return 1e-3

    def take(self, amount: float) -> None:
        for i in range(2):
            self._logs[i].append((self._now, amount))
            self._sums[i] += amount

    def in_debt_for(self) -> float:
        """Seconds until neither window is full (output tokens are charged
        after the call: a full window refuses the next one)."""
        return max(self._window_wait(i, 1e-6) for i in range(2))


Limit = TokenBucket | SlidingWindow
WINDOW_KINDS = ("bucket", "sliding")


class RateLimits:
    """The loopback's limits: requests, input tokens, output tokens and
    (OpenAI's) prompt + max_tokens, each a token bucket or a sliding window."""

    def __init__(self, rpm: float | None, input_tpm: float | None, output_tpm: float | None, burst_seconds: float,
                 *, tpm: float | None = None, window: str = "bucket", headers: bool = True):
        if window not in WINDOW_KINDS:
            raise ValueError(f"window must be one of {', '.join(WINDOW_KINDS)}, not {window!r}")

        def limit(per_minute: float | None) -> Limit | None:
            if not per_minute:
                return None
            return SlidingWindow(per_minute) if window == "sliding" else TokenBucket(per_minute, burst_seconds)

        self.requests, self.input, self.output, self.total = limit(rpm), limit(input_tpm), limit(output_tpm), limit(tpm)
        self.active = any((self.requests, self.input, self.output, self.total))
        self.headers = headers

        def budget(bucket: Limit | None) -> TokenBucket | None:  # what the headers report
            if bucket is None:
                return None
            if isinstance(bucket, TokenBucket) and burst_seconds >= BUDGET_SECONDS:
                return bucket
            return TokenBucket(bucket.limit, BUDGET_SECONDS)

        self.budgets = {"requests": budget(self.requests), "input": budget(self.input),
                        "output": budget(self.output), "total": budget(self.total)}

    def _buckets(self, now: float) -> None:
        for bucket in (self.requests, self.input, self.output, self.total, *self.budgets.values()):
            if bucket is not None:
                bucket.refill(now)

    def _charge(self, name: str, bucket: Limit | None, amount: float) -> None:
        """Take `amount` from a limit and its budget (once if they are one)."""
        if bucket is not None:
            bucket.take(amount)
            budget = self.budgets[name]
            if budget is not None and budget is not bucket:
                budget.take(amount)

    def admit(self, input_tokens: int, now: float, max_tokens: int = 0) -> tuple[float, str]:
        """(0, "") and charge the limits if the call may run now, else
        (seconds to wait, which limit). `max_tokens` counts toward `tpm`."""
        self._buckets(now)
        waits = []
        if self.requests is not None:
            waits.append((self.requests.wait(1.0), "requests"))
        if self.input is not None:
            waits.append((self.input.wait(input_tokens), "input tokens"))
        if self.total is not None:
            waits.append((self.total.wait(input_tokens + max_tokens), "tokens"))
        if self.output is not None:
            waits.append((self.output.in_debt_for(), "output tokens"))
        wait, which = max(waits, default=(0.0, ""))
        if wait > 0:
            return wait, which
        self._charge("requests", self.requests, 1.0)
        self._charge("input", self.input, input_tokens)
        self._charge("total", self.total, input_tokens + max_tokens)
        return 0.0, ""

    def charge_output(self, output_tokens: int, now: float) -> None:
        if self.output is not None:
            self._buckets(now)
            self._charge("output", self.output, output_tokens)

    def openai_headers(self, now: float) -> dict[str, str]:
        if not self.headers:
            return {}
        self._buckets(now)
        headers: dict[str, str] = {}
        tokens = self.budgets["total"] or self.budgets["input"]
        for name, bucket in (("requests", self.budgets["requests"]), ("tokens", tokens)):
            if bucket is not None:
                headers[f"x-ratelimit-limit-{name}"] = str(int(bucket.limit))
                headers[f"x-ratelimit-remaining-{name}"] = str(bucket.remaining())
                headers[f"x-ratelimit-reset-{name}"] = go_duration(bucket.until_full())
        return headers

    def anthropic_headers(self, now: float) -> dict[str, str]:
        if not self.headers:
            return {}
        self._buckets(now)
        wall = time.time()
        headers: dict[str, str] = {}
        # "tokens": the most restrictive token limit in force (the lesser share left).
        budgets = self.budgets
        token_buckets = [b for b in (budgets["input"], budgets["output"]) if b is not None]
        tightest = min(token_buckets, key=lambda b: b.level / b.capacity, default=None)
        for name, bucket in (("requests", budgets["requests"]), ("tokens", tightest),
                             ("input-tokens", budgets["input"]), ("output-tokens", budgets["output"])):
            if bucket is not None:
                headers[f"anthropic-ratelimit-{name}-limit"] = str(int(bucket.limit))
                headers[f"anthropic-ratelimit-{name}-remaining"] = str(bucket.remaining())
                # Whole seconds, rounded up: the bucket is full by then, never before.
                headers[f"anthropic-ratelimit-{name}-reset"] = rfc3339(math.ceil(wall + bucket.until_full()))
        return headers


def go_duration(seconds: float) -> str:
    """Seconds in OpenAI's reset format (Go's time.Duration, to the
    millisecond): "0s", "20ms", "1.5s", "6m0s", "1h0m0s"."""
    ms = max(0, int(round(seconds * 1000)))
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{secs}"
    return f"{minutes}m{secs}" if minutes else secs


def rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
