"""When to try a failed call again: jittered exponential backoff.

Only `ProviderError.retryable` kinds are retried (the engine checks); this
module only says how long to wait before attempt n+1. A rate-limited reply that
names its wait (retry-after / x-ratelimit-reset) is honoured exactly, plus a
little jitter upwards so a crowd of callers does not return in one instant.
"""
from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    base: float = 0.5      # seconds before the 2nd attempt (before jitter)
    cap: float = 60.0      # longest wait between two attempts
    jitter: float = 0.5    # share of the wait drawn at random

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        if retry_after is not None and retry_after >= 0:
            return min(retry_after, self.cap * 10) * (1.0 + random.uniform(0.0, 0.1)) + random.uniform(0.0, 0.05)
        wait = min(self.cap, self.base * 2.0 ** max(0, attempt - 1))
        # "Equal jitter": never less than (1 - jitter) of the nominal wait.
        return wait * (1.0 - self.jitter) + random.uniform(0.0, wait * self.jitter)
