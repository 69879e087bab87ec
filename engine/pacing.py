"""How one endpoint reacts to 429s: the one place a 429 is decided.

`Pacing` is driven by its caller with an explicit `now` and no clock, task or
I/O of its own (aiolimiter's spirit), so every rule below is a unit test away
(tests/test_pacing.py). Each endpoint's gate (engine/gate.py) holds one, tells
it every reply and 429, and asks it for the pause, the share of the rate and
the concurrency cap in force; whether a failed call is tried again is the
gate's own decision.

After a 429 (`on_rate_limited`): the call itself waits the server's
retry-after (capped at the endpoint's max_retry_after); the whole endpoint
pauses only when 429s dominate its recent replies; and it slows down once per
episode -- half the rate and concurrency, recovered linearly over
RECOVERY_SECONDS, or for an endpoint without a set (or learned) RPM an
inferred request rate that then doubles every INFERRED_DOUBLING seconds. A 429
that says nothing (no retry-after, no rate-limit header) also halves the
concurrency cap, which regrows by one per cap's worth of successful replies
(additive increase: `on_success`). Each slow-down is a trial judged on the
replies that follow it (`on_reply`): kept only if it lowered the 429 share
beyond chance, undone otherwise, after which 429s at that share slow nothing
down for IGNORE_SECONDS (429s not caused by our speed -- another process on
the account, a provider's bad minute -- must not starve the run).
"""
from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

from engine.limiter import EndpointLimits, LeakyBucket

DEFAULT_PAUSE = 1.0          # seconds to pause after a 429 that names no wait
# From half rate back to full rate after a 429 (a known request rate: an
# unknown one is inferred). Short: the pacing keeps within known limits, so a
# kept slow-down is mostly the start's cluster of late arrivals; 30 s cost a
# 30 s run a quarter of its rate (benchmarks/limits_bench.py). 429s that persist halve again.
RECOVERY_SECONDS = 8.0
MIN_FACTOR = 1 / 16
INFERRED_DOUBLING = 20.0     # seconds for an inferred request rate to double
MAX_INFERRED_FACTOR = 1e6
SHARE_WINDOW = 40            # replies over which the 429 share before a slow-down is measured
TRIAL_REPLIES = 12           # replies to calls sent after a slow-down before judging it
TRIAL_SECONDS = 30.0         # a trial not judged by then (too few replies) is kept
KEPT_Z = 1.65                # a slow-down is kept if the 429 share fell by this many standard errors
ALWAYS_KEPT_SHARE = 0.6      # past this share of 429s we are far too fast: a slow-down is never undone
IGNORE_SECONDS = 60.0        # after an undone slow-down, 429s at that share slow nothing down
IGNORE_MARGIN = 0.25         # ... unless the share rises this much above it
PAUSE_WINDOW = 10            # the endpoint pauses on a 429 when, over its last replies,
PAUSE_SHARE = 0.8            # at least this share were 429s (30% random 429s reach it once in ~600)
TOO_FAST_SHARE = 0.5         # a 429 share this high is our speed: a running trial does not hold slow-downs back
TOO_FAST_EVIDENCE = 10       # ... over this many replies (over 4, 30% random 429s reach it a third of the time)
ALL_429S = 0.9               # ... or over 4 replies this share (30% random 429s: 4 of 4 one time in 120)
MIN_PAUSE_EVIDENCE = 4       # replies needed to judge (with none known at all, a 429 pauses)


class _Trial(NamedTuple):
    """A running slow-down trial: when it began and the state to go back to."""

    started: float
    factor: float
    inferred: bool
    requests: LeakyBucket | None
    concurrency: int


def _clearly_lower(after: float, n_after: int, before: float, n_before: int) -> bool:
    """Whether the 429 share `after` a slow-down is lower than `before` beyond
    chance (a one-sided two-proportion z-test at KEPT_Z)."""
    pooled = (after * n_after + before * n_before) / (n_after + n_before)
    spread = math.sqrt(pooled * (1.0 - pooled) * (1.0 / n_after + 1.0 / n_before))
    return before - after > KEPT_Z * spread if spread > 0 else after < before


def _share(replies: list[bool]) -> float:
    return sum(replies) / len(replies) if replies else 0.0


class Pacing:
    """One endpoint's pause, slow-down trials, AIMD concurrency cap and
    inferred request rate. `limits` is the endpoint's limiter, whose request
    rate a slow-down may infer, and a reverted trial restores."""

    def __init__(self, max_concurrency: int, limits: EndpointLimits, now: float):
        self.max_concurrency = max_concurrency
        self.limits = limits
        self.paused_until = 0.0
        self.reverted = 0           # slow-downs undone because they did not lower the 429 share
        self.succeeded = 0          # successful replies, for the inferred rate
        self._factor = 1.0
        self._factor_since = now
        self._inferred = False      # the request rate was inferred after a 429
        self._mark_time, self._mark_done = now, 0
        self._last_slowdown = -math.inf
        self._replies: deque[tuple[float, bool]] = deque(maxlen=4 * SHARE_WINDOW)  # (sent at, answered 429)
        self._trial: _Trial | None = None
        self._ignore_until = -math.inf
        self._ignored_share = 0.0
        self._concurrency = max_concurrency  # cap lowered by 429s that say nothing (AIMD)
        self._grow_count = 0                 # successes towards the cap's next +1

    # -- replies ---------------------------------------------------------------------
    def on_reply(self, rate_limited: bool, now: float, sent_at: float = -math.inf) -> float | None:
        """Every finished attempt, answered 429 or not, and when it was sent.
        Returns the 429 share when this reply ended a trial that did not lower
        it (the slow-down was undone), else None."""
        self._replies.append((sent_at, rate_limited))
        return self._judge_trial(now) if self._trial is not None else None

    def on_success(self) -> None:
        """A successful reply: additive increase of the concurrency cap, +1
        per cap's worth of replies."""
        self.succeeded += 1
        if self._concurrency < self.max_concurrency:
            self._grow_count += 1
            if self._grow_count >= self._concurrency:
                self._concurrency, self._grow_count = self._concurrency + 1, 0

    def recent_429_share(self, last: int = SHARE_WINDOW) -> tuple[float, int]:
        """(share of 429s, replies counted) over the last `last` replies."""
        replies = [limited for _, limited in list(self._replies)[-last:]]
        return _share(replies), len(replies)

    def _split(self, started: float) -> tuple[list[bool], list[bool]]:
        """The replies to calls sent before a trial (the last SHARE_WINDOW) and after it."""
        before = [limited for sent, limited in self._replies if sent < started][-SHARE_WINDOW:]
        after = [limited for sent, limited in self._replies if sent >= started]
        return before, after

    # -- a 429 -----------------------------------------------------------------------
    def on_rate_limited(self, retry_after: float | None, now: float, sent_at: float | None = None,
                        said_limits: bool = False, opening: bool = False) -> float | None:
        """A 429 (its `retry_after` already capped; `said_limits`: its reply
        carried rate-limit headers; `opening`: its call was among the
        endpoint's first second's share of sends under its configured request
        limit, EndpointLimits.opening). Pauses the endpoint while 429s dominate
        its recent replies, and slows down once per episode: a 429 to a call
        sent before the last slow-down belongs to that episode. Returns the
        seconds of a pause it set or lengthened, else None."""
        share, counted = self.recent_429_share(PAUSE_WINDOW)
        # Judged on SHARE_WINDOW replies: over PAUSE_WINDOW's 10, 30% random 429s
        # reach the margin above their share one time in twenty (limits_bench.py --cases random429).
        ignoring = now < self._ignore_until and self.recent_429_share()[0] < self._ignored_share + IGNORE_MARGIN
        paused = None
        if not ignoring and (counted == 0 or counted >= MIN_PAUSE_EVIDENCE and share >= PAUSE_SHARE):
            paused = self._pause(retry_after if retry_after is not None else DEFAULT_PAUSE, now)
        trial = self._trial
        if trial is not None and now - trial.started > TRIAL_SECONDS:  # never judged: kept
            trial = self._trial = None
        new_episode = sent_at is None or sent_at >= self._last_slowdown
        if opening and retry_after is not None and not self._inferred:
            # The server's window was in use before our first sends (another
            # client of the account, a run just before): not our pace, which
            # the limit keeps. The call waits what the server named (the
            # endpoint too, when 429s dominate), at full rate; a halving held
            # the first 8 s of a 30 s run at half rate (benchmarks/limits_bench.py
            # --cases none: 3-5 such 429s a round after the bare loop's).
            # Later 429s slow down as usual.
            return paused
        if self._stray(now):
            return paused
        if ignoring or trial is not None and self._trial_blocks(trial.started) and new_episode:
            return paused  # known not to be ours, or a judgeable trial is running: one slow-down per trial
        if new_episode:
            self._slow_down(now, nothing_said=retry_after is None and not said_limits)
        self._factor_since = max(self.paused_until, now)  # no recovery while paused
        return paused

    def _stray(self, now: float) -> bool:
        """429s among many successes under known limits, fewer than a
        slow-down could ever be shown to lower (`_judge_trial`: not beyond
        chance even if no 429 followed it over TRIAL_REPLIES): the pacing keeps
        within the limits, so they are sends that met the window's edge late
        (network jitter, a loaded machine), not our speed. The calls wait their
        retries; nothing slows down. (Such a trial was always undone, after
        about a second at half rate: 1-2 s of a 30 s run each,
        benchmarks/limits_bench.py.)"""
        share, counted = self.recent_429_share()
        return (self._trial is None and self.limits.limited and counted >= SHARE_WINDOW
                and not _clearly_lower(0.0, TRIAL_REPLIES, share, counted))

    def _pause(self, wait: float, now: float) -> float | None:
        """Pause the endpoint `wait` seconds unless it is paused longer already."""
        if now + wait <= self.paused_until:
            return None
        self.paused_until = now + wait
        return wait

    def _slow_down(self, now: float, nothing_said: bool) -> None:
        """Halve the rate (or infer one), and the concurrency cap when the 429 said nothing."""
        if self._trial is None:  # the state to go back to if the slow-down(s) of this trial do not help
            self._trial = _Trial(now, self.factor(now), self._inferred, self.limits.requests, self._concurrency)
        if not self.limits.knows_request_limit() or self._inferred:
            self._infer_rate(now)
            self._factor = 0.9
        else:
            self._factor = max(MIN_FACTOR, self.factor(now) * 0.5)
        if nothing_said:
            self._concurrency, self._grow_count = max(1, self._concurrency // 2), 0
        self._last_slowdown = now

    def _trial_blocks(self, started: float) -> bool:
        """Whether the running trial holds further slow-downs back: there are
        replies to judge it by and 429s are not so many that we are plainly
        still far too fast. (A second slow-down within a trial because few
        replies came before it cost 30% random 429s 4 s of a 28 s run.)"""
        before, after = self._split(started)
        plainly_too_fast = any(len(part) >= TOO_FAST_EVIDENCE and _share(part) >= TOO_FAST_SHARE
                               or len(part) >= 4 and _share(part) >= ALL_429S for part in (before, after))
        return bool(before or after) and not plainly_too_fast

    def _judge_trial(self, now: float) -> float | None:
        trial = self._trial
        assert trial is not None  # judged only while a trial runs
        before, after = self._split(trial.started)
        if len(after) < TRIAL_REPLIES:
            return None
        self._trial = None
        share_before, share_after = _share(before), _share(after)
        # Kept only when it lowered the share beyond chance (or we are far too
        # fast): occasional 429s (1-2%) cannot show that, and a slow-down kept
        # for them held the rate at 0.7 while calls waited (benchmarks/limits_bench.py).
        if (max(share_before, share_after) >= ALWAYS_KEPT_SHARE
                or _clearly_lower(share_after, len(after), share_before, len(before))):
            return None  # kept
        # The slow-down did not lower the 429 share: undo it.
        self._factor, self._factor_since = trial.factor, now
        self._inferred = trial.inferred
        self._concurrency = max(self._concurrency, trial.concurrency)
        self.limits.restore_request_limit(trial.requests, now)
        self.paused_until = min(self.paused_until, now)
        self._ignore_until = now + IGNORE_SECONDS
        self._ignored_share = max(share_before, share_after)
        self.reverted += 1
        return share_after

    # -- the rate --------------------------------------------------------------------
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

    def told_request_limit(self, now: float) -> None:
        """The provider reported its request limit: an inferred rate gives way to it."""
        if self._inferred:
            self.limits.restore_request_limit(None, now)  # an inferred rate means none was configured
            self._inferred = False
            self._factor, self._factor_since = min(1.0, self._factor), now

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
        """Calls the endpoint may have in flight now: max_concurrency, scaled
        down with the rate after a 429 (`factor`) and by the cap that 429s
        saying nothing halve (it regrows additively in `on_success`)."""
        return max(1, min(math.floor(self.max_concurrency * min(1.0, factor)), self._concurrency))
