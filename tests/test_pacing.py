"""The 429 and pacing controller (engine/pacing.py) on its own: no server, no
clock, every `now` given."""
from __future__ import annotations

import pytest

from engine.limiter import EndpointLimits
from engine.pacing import (
    DEFAULT_PAUSE,
    IGNORE_SECONDS,
    INFERRED_DOUBLING,
    PAUSE_WINDOW,
    RECOVERY_SECONDS,
    TRIAL_REPLIES,
    Pacing,
)
from providers.base import EndpointSpec


def pacing(rpm: float | None = 600, max_concurrency: int = 16, now: float = 0.0) -> Pacing:
    spec = EndpointSpec(name="e", kind="builtin", rpm=rpm, max_concurrency=max_concurrency)
    return Pacing(max_concurrency, EndpointLimits(spec, now=now), now)


def replies(p: Pacing, pattern: list[bool], sent_at: float, now: float, retry_after: float | None = 0.0) -> list[float]:
    """Feed replies as the dispatcher does; returns the shares of the trials undone."""
    undone = []
    for limited in pattern:
        share = p.on_reply(limited, now, sent_at)
        if share is not None:
            undone.append(share)
        if limited:
            p.on_rate_limited(retry_after, now, sent_at=sent_at)
    return undone


# -- pause -----------------------------------------------------------------------
def test_a_first_429_with_nothing_known_pauses_for_the_servers_wait_or_the_default():
    p = pacing()
    assert p.on_rate_limited(2.5, now=10.0, sent_at=9.0) == 2.5
    assert p.paused_until == 12.5
    q = pacing()
    assert q.on_rate_limited(None, now=10.0, sent_at=9.0) == DEFAULT_PAUSE
    assert q.paused_until == 10.0 + DEFAULT_PAUSE


def test_a_lone_429_among_successes_pauses_nothing():
    p = pacing()
    for _ in range(PAUSE_WINDOW):
        p.on_reply(False, 1.0, 0.5)
    p.on_reply(True, 2.0, 1.5)
    assert p.on_rate_limited(5.0, now=2.0, sent_at=1.5) is None
    assert p.paused_until == 0.0


def test_the_endpoint_pauses_when_429s_dominate_its_recent_replies():
    p = pacing()
    p.on_reply(False, 1.0, 0.5)
    for _ in range(PAUSE_WINDOW - 1):
        p.on_reply(True, 2.0, 1.5)
    assert p.on_rate_limited(5.0, now=2.0, sent_at=1.5) == 5.0
    assert p.paused_until == 7.0
    assert p.on_rate_limited(1.0, now=2.1, sent_at=1.5) is None  # a shorter wait does not shorten the pause
    assert p.paused_until == 7.0


# -- slow-down trials ---------------------------------------------------------------
def test_one_slow_down_per_episode_and_recovery_after_the_pause():
    p = pacing()
    p.on_rate_limited(2.0, now=100.0, sent_at=99.9)
    p.on_rate_limited(None, now=100.1, sent_at=99.95)  # sent before the slow-down: the same episode
    assert p.factor(101.0) == 0.5
    assert p.factor(102.0 + RECOVERY_SECONDS / 4) == pytest.approx(0.75)
    assert p.factor(102.0 + RECOVERY_SECONDS) == 1.0


def test_a_running_trial_that_can_be_judged_holds_further_slow_downs_back():
    p = pacing()
    replies(p, [False] * 10 + [True], sent_at=0.0, now=1.0)  # evidence before, then the first slow-down
    assert p.factor(1.0) == 0.5
    replies(p, [True] + [False] * 3, sent_at=2.0, now=2.0)  # sent after it, but the trial is still running
    assert p.factor(2.0) == pytest.approx(0.5 + 1.0 / RECOVERY_SECONDS)


def test_429s_far_too_many_slow_down_again_during_a_trial():
    p = pacing()
    replies(p, [False] * 10 + [True], sent_at=0.0, now=1.0)
    replies(p, [True] * 4, sent_at=2.0, now=2.0)  # every call after the slow-down is a 429: still far too fast
    assert p.factor(2.0) < 0.5 / 2 + 0.1


def test_a_trial_that_does_not_lower_the_share_is_undone_and_the_share_then_ignored():
    p = pacing()
    every_third = [i % 3 == 0 for i in range(30)]
    assert replies(p, every_third[:12], sent_at=0.0, now=1.0) == []
    assert p.factor(1.0) == 0.5
    undone = replies(p, every_third, sent_at=2.0, now=3.0)  # the same share at half speed
    assert len(undone) == 1 and undone[0] == pytest.approx(1 / 3, abs=0.1)
    assert p.reverted == 1 and p.factor(3.0) == 1.0
    replies(p, every_third, sent_at=4.0, now=5.0)  # within the ignore window: no new slow-down, no pause
    assert p.factor(5.0) == 1.0 and p.paused_until <= 5.0
    later = 3.0 + IGNORE_SECONDS + 1.0  # the window is over: the same share slows down again
    replies(p, [True], sent_at=later, now=later)
    assert p.factor(later) == 0.5


def test_a_trial_that_stops_the_429s_is_kept():
    p = pacing()
    replies(p, [i % 3 == 0 for i in range(12)], sent_at=0.0, now=1.0)
    assert replies(p, [False] * TRIAL_REPLIES, sent_at=2.0, now=3.0) == []
    assert p.reverted == 0
    assert p.factor(3.0) == pytest.approx(0.5 + 2.0 / RECOVERY_SECONDS)


# -- concurrency (AIMD) ---------------------------------------------------------------
def test_a_429_saying_nothing_halves_the_concurrency_cap_which_regrows_by_one_per_caps_worth():
    p = pacing(max_concurrency=16)
    assert p.concurrency_cap(1.0) == 16
    p.on_rate_limited(None, now=10.0, sent_at=9.0)
    assert p.concurrency_cap(1.0) == 8
    for _ in range(8):
        p.on_success()
    assert p.concurrency_cap(1.0) == 9
    for _ in range(9):
        p.on_success()
    assert p.concurrency_cap(1.0) == 10
    for _ in range(200):
        p.on_success()
    assert p.concurrency_cap(1.0) == 16


def test_a_429_that_names_its_wait_or_carries_limits_leaves_concurrency_alone():
    for kwargs in ({"retry_after": 1.0}, {"retry_after": None, "said_limits": True}):
        p = pacing(max_concurrency=16)
        p.on_rate_limited(now=10.0, sent_at=9.0, **kwargs)
        assert p.concurrency_cap(1.0) == 16
        assert p.concurrency_cap(0.5) == 8  # the rate's slow-down still scales it


# -- inferred rate ----------------------------------------------------------------------
def test_without_a_known_rate_a_429_infers_the_achieved_one_which_then_doubles():
    p = pacing(rpm=None, now=0.0)
    assert p.limits.requests is None
    for _ in range(100):  # 100 calls in 10 s
        p.on_success()
    p.on_rate_limited(0.5, now=10.0)
    assert p.limits.requests is not None and p.limits.requests.rate * 60 == pytest.approx(600)
    assert p.factor(10.5) == pytest.approx(0.9)
    assert p.factor(10.5 + INFERRED_DOUBLING) == pytest.approx(1.8)
    p.told_request_limit(11.0 + INFERRED_DOUBLING)  # the provider's own figure replaces the guess
    assert p.limits.requests is None and p.factor(12.0 + INFERRED_DOUBLING) == 1.0


# (whether and when a failed call is tried again: the gate's, tests/test_gate.py)


def test_occasional_429s_do_not_keep_a_slow_down():
    """1 429 in 40 replies: the slow-down cannot lower that share beyond
    chance, so it is undone after its trial instead of holding the rate."""
    p = pacing(rpm=3000, max_concurrency=64)
    replies(p, [False] * 15, sent_at=0.5, now=1.0)
    p.on_reply(True, 1.0, 0.9)
    p.on_rate_limited(1.0, now=1.0, sent_at=0.9)
    assert p.factor(1.0) == 0.5
    undone = replies(p, [False] * TRIAL_REPLIES, sent_at=1.1, now=1.5)
    assert len(undone) == 1 and p.factor(1.5) == 1.0 and p.reverted == 1


def test_a_slow_down_that_lowers_a_high_share_is_kept():
    p = pacing(rpm=3000, max_concurrency=64)
    replies(p, [False, True] * 10, sent_at=0.5, now=1.0, retry_after=None)  # half the replies 429
    assert p.factor(1.0) < 1.0
    assert replies(p, [False] * TRIAL_REPLIES, sent_at=p._last_slowdown + 0.01, now=2.0) == []
    assert p.reverted == 0


def test_stray_429s_among_many_successes_under_known_limits_slow_nothing():
    """Under known limits, 429s fewer than a slow-down could be shown to
    lower (not beyond chance over TRIAL_REPLIES, even with no 429 after it)
    slow nothing; more do."""
    p = pacing(rpm=3000, max_concurrency=64)
    replies(p, [False] * 39, sent_at=0.5, now=1.0)
    replies(p, [True], sent_at=0.9, now=1.0, retry_after=1.0)
    assert p.factor(1.0) == 1.0 and p.paused_until <= 1.0
    replies(p, [True, False] * 3, sent_at=1.0, now=1.2, retry_after=1.0)  # 4 of the last 40: still stray
    assert p.factor(1.2) == 1.0 and p.paused_until <= 1.2
    replies(p, [True] * 5, sent_at=1.2, now=1.3, retry_after=1.0)  # 9 of the last 40: a trial can show it
    assert p.factor(1.3) == 0.5 and p.reverted == 0
