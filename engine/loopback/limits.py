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
- `openai_headers`: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`,
  resets as relative Go durations (`go_duration`: "0s", "12ms", "1.5s",
  "6m0s", "1h0m0s"). "tokens" is the input-token limit.
- `anthropic_headers`: `anthropic-ratelimit-{requests,tokens,input-tokens,
  output-tokens}-{limit,remaining,reset}`, resets as RFC 3339 UTC instants
  rounded up to the second; "tokens" is the tighter of input and output.
"""
from __future__ import annotations

import math
import time
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


class RateLimits:
    def __init__(self, rpm: float | None, input_tpm: float | None, output_tpm: float | None, burst_seconds: float):
        self.requests = TokenBucket(rpm, burst_seconds) if rpm else None
        self.input = TokenBucket(input_tpm, burst_seconds) if input_tpm else None
        self.output = TokenBucket(output_tpm, burst_seconds) if output_tpm else None
        self.active = any((self.requests, self.input, self.output))

        def budget(bucket: TokenBucket | None) -> TokenBucket | None:  # what the headers report
            if bucket is None or burst_seconds >= BUDGET_SECONDS:
                return bucket
            return TokenBucket(bucket.limit, BUDGET_SECONDS)

        self.budgets = {"requests": budget(self.requests), "input": budget(self.input),
                        "output": budget(self.output)}

    def _buckets(self, now: float) -> None:
        for bucket in (self.requests, self.input, self.output, *self.budgets.values()):
            if bucket is not None:
                bucket.refill(now)

    def _charge(self, name: str, bucket: TokenBucket | None, amount: float) -> None:
        """Take `amount` from a limit's bucket and its budget (once if they are one)."""
        if bucket is not None:
            bucket.level -= amount
            budget = self.budgets[name]
            if budget is not None and budget is not bucket:
                budget.level -= amount

    def admit(self, input_tokens: int, now: float) -> tuple[float, str]:
        """(0, "") and charge the buckets if the call may run now, else
        (seconds to wait, which limit)."""
        self._buckets(now)
        waits = []
        if self.requests is not None:
            waits.append((self.requests.wait(1.0), "requests"))
        if self.input is not None:
            waits.append((self.input.wait(input_tokens), "input tokens"))
        if self.output is not None and self.output.level <= 0:
            waits.append((-self.output.level / self.output.rate + 1e-3, "output tokens"))
        wait, which = max(waits, default=(0.0, ""))
        if wait > 0:
            return wait, which
        self._charge("requests", self.requests, 1.0)
        self._charge("input", self.input, input_tokens)
        return 0.0, ""

    def charge_output(self, output_tokens: int, now: float) -> None:
        if self.output is not None:
            self._buckets(now)
            self._charge("output", self.output, output_tokens)

    def openai_headers(self, now: float) -> dict[str, str]:
        self._buckets(now)
        headers: dict[str, str] = {}
        for name, bucket in (("requests", self.budgets["requests"]), ("tokens", self.budgets["input"])):
            if bucket is not None:
                headers[f"x-ratelimit-limit-{name}"] = str(int(bucket.limit))
                headers[f"x-ratelimit-remaining-{name}"] = str(bucket.remaining())
                headers[f"x-ratelimit-reset-{name}"] = go_duration(bucket.until_full())
        return headers

    def anthropic_headers(self, now: float) -> dict[str, str]:
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
