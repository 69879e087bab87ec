"""Leaky buckets with reservations and refunds, backoff, and the 429 response
of an endpoint (pause, slow down, recover). Time is passed explicitly."""
from __future__ import annotations

import pytest

from engine.budget import Budget
from engine.gate import Gate
from engine.limiter import COLD_MARGIN, SEND_WINDOW, EndpointLimits, LeakyBucket
from engine.pacing import INFERRED_DOUBLING, RECOVERY_SECONDS
from engine.retry import RetryPolicy
from providers.base import EndpointSpec

FIRST_WINDOW = SEND_WINDOW + COLD_MARGIN  # the first second's share of sends stays longer in the log


def test_bucket_admits_its_burst_then_spaces_requests_at_the_rate():
    bucket = LeakyBucket(600, burst_seconds=0.5, now=0.0)  # 10/s, burst 5
    for _ in range(5):
        assert bucket.delay(1, 0.0) == 0.0
        bucket.reserve(1, 0.0)
    assert bucket.delay(1, 0.0) == pytest.approx(0.1)
    assert bucket.delay(1, 0.1) == 0.0  # one unit drained
    bucket.reserve(1, 0.1)
    assert bucket.delay(1, 0.1) == pytest.approx(0.1)
    assert bucket.delay(3, 0.1) == pytest.approx(0.3)


def test_a_reservation_larger_than_the_bucket_waits_for_empty_then_leaves_debt():
    bucket = LeakyBucket(60_000, burst_seconds=0.5, now=0.0)  # 1,000 tokens/s, capacity 500
    bucket.reserve(100, 0.0)
    # admitted once empty and the trailing window holds nothing more
    assert bucket.delay(5_000, 0.0) == pytest.approx(FIRST_WINDOW)
    bucket.reserve(5_000, FIRST_WINDOW)
    assert bucket.delay(1, FIRST_WINDOW) == pytest.approx(4.501)  # the debt drains at the rate
    assert bucket.delay(1, FIRST_WINDOW + 4.6) == 0.0


def test_refund_and_correction_from_reported_usage():
    bucket = LeakyBucket(60_000, burst_seconds=1.0, now=0.0)  # 1,000/s, capacity 1,000
    bucket.reserve(900, 0.0)
    assert bucket.delay(500, 0.0) == pytest.approx(FIRST_WINDOW)  # the trailing second holds 900 of its 1,000
    bucket.correct(900, 200, 0.0)  # the call used less than reserved: the bucket and the log take it back
    assert bucket.level == pytest.approx(200)
    assert bucket.delay(500, 0.0) == 0.0
    bucket.correct(200, 1_200, 0.0)  # ... or more
    assert bucket.level == pytest.approx(1_200)
    bucket.refund(5_000, 0.0)
    assert bucket.level == 0.0


def test_scale_slows_the_drain():
    bucket = LeakyBucket(600, burst_seconds=0.1, now=0.0)  # 10/s, capacity 1
    bucket.reserve(1, 0.0)
    bucket.set_scale(0.5, 0.0)
    assert bucket.delay(1, 0.0) == pytest.approx(0.2)


def test_endpoint_limits_take_the_longest_wait_and_keep_failed_requests_counted():
    spec = EndpointSpec(name="e", kind="openai", rpm=600, input_tpm=60_000, output_tpm=6_000)
    limits = EndpointLimits(spec, burst_seconds=1.0, now=0.0)  # 10 req/s, 1,000 in/s, 100 out/s
    assert limits.limited
    limits.reserve(800, 100, 0.0)
    assert limits.delay(400, 1, 0.0) == pytest.approx(FIRST_WINDOW)  # 1,200 input tokens in a second: the log
    assert limits.delay(10, 50, 0.0) == pytest.approx(FIRST_WINDOW)  # 150 output tokens in a second
    limits.settle((800, 100), None, 0.0)  # failed: tokens refunded
    assert limits.delay(400, 50, 0.0) == 0.0
    assert limits.requests.level == pytest.approx(1.0)  # the request still counts
    limits.reserve(800, 100, 0.0)
    limits.settle((800, 100), (300, 20), 0.0)
    assert limits.input_tokens.level == pytest.approx(300)
    assert limits.output_tokens.level == pytest.approx(20)


def test_an_endpoint_without_limits_never_waits():
    limits = EndpointLimits(EndpointSpec(name="e", kind="openai"), now=0.0)
    assert not limits.limited
    limits.reserve(10**9, 10**9, 0.0)
    assert limits.delay(10**9, 10**9, 0.0) == 0.0


def test_retry_policy_honours_retry_after_and_backs_off_exponentially():
    policy = RetryPolicy(base=0.5, cap=8.0, jitter=0.5)
    for _ in range(200):
        assert 1.0 <= policy.delay(1, retry_after=1.0) <= 1.15
        assert 0.25 <= policy.delay(1) <= 0.5
        assert 1.0 <= policy.delay(3) <= 2.0
        assert 4.0 <= policy.delay(10) <= 8.0  # capped
    assert len({policy.delay(2) for _ in range(20)}) > 1  # jittered


def _paced(spec: EndpointSpec) -> Gate:
    """An endpoint's gate, for its pacing and limits (no loop, no clock)."""
    return Gate(spec, Budget(), _Quiet(), max_concurrency=spec.max_concurrency, now=0.0)


class _Quiet:
    def notice(self, message: str, *, key: object = None, every: float = 10.0) -> None:
        pass


def test_a_429_pauses_the_endpoint_halves_its_rate_once_and_recovers():
    ep = _paced(EndpointSpec(name="e", kind="builtin", rpm=600, max_concurrency=8))  # before any reply
    ep.pacing.on_rate_limited(2.0, now=100.0, sent_at=99.9)
    ep.pacing.on_rate_limited(None, now=100.1, sent_at=99.95)  # sent before the slow-down: same episode
    assert ep.pacing.paused_until == pytest.approx(102.0)
    assert ep.pacing.factor(101.0) == 0.5
    assert ep.pacing.factor(102.0 + RECOVERY_SECONDS / 4) == pytest.approx(0.75)
    assert ep.pacing.factor(102.0 + RECOVERY_SECONDS) == 1.0
    ep.pacing.on_rate_limited(None, now=200.0, sent_at=150.0)  # a new episode, default pause
    assert ep.pacing.paused_until == pytest.approx(201.0)
    assert ep.pacing.factor(200.5) == 0.5
    ep.pacing.on_rate_limited(None, now=200.6, sent_at=200.2)  # sent after the slow-down: still too fast
    assert ep.pacing.factor(200.7) == 0.25


def test_without_a_set_rpm_a_429_installs_the_achieved_rate_then_probes_upwards():
    ep = _paced(EndpointSpec(name="e", kind="builtin", max_concurrency=8))
    assert ep.limits.requests is None
    ep.pacing._mark_time = 0.0
    ep.pacing.succeeded = 100  # 100 calls in 10 s
    ep.pacing.on_rate_limited(0.5, now=10.0)
    assert ep.limits.requests.rate * 60 == pytest.approx(600)
    assert ep.pacing.factor(10.5) == pytest.approx(0.9)
    assert ep.pacing.factor(10.5 + INFERRED_DOUBLING) == pytest.approx(1.8)
    assert ep.limits.delay(0, 0, 10.0) == pytest.approx(0.1)  # no burst right after the 429


@pytest.mark.parametrize("burst_seconds", [0.1, 0.5, 1.0])
def test_the_pacer_never_sends_more_than_a_seconds_share_in_any_trailing_second(burst_seconds):
    """Whatever the bucket's burst, a server counting over any sliding second
    (3,000 RPM: 50) never sees more than 50 in one; the rate is still reached."""
    limits = EndpointLimits(EndpointSpec(name="e", kind="openai", rpm=3000), burst_seconds=burst_seconds, now=0.0)
    sent: list[float] = []
    now = 0.0
    while now < 20.0:  # a backlog offered every millisecond, as the dispatcher does
        if limits.delay(0, 0, now) == 0.0:
            limits.reserve(0, 0, now)
            sent.append(now)
        now = round(now + 0.001, 6)
    assert all(later - first >= 1.0 for first, later in zip(sent, sent[50:]))
    assert len(sent) >= 0.97 * 50 * 20


def test_token_reservations_are_logged_and_a_big_one_waits_for_an_empty_second():
    limits = EndpointLimits(EndpointSpec(name="e", kind="openai", input_tpm=60_000), now=0.0)  # 1,000 a second
    limits.reserve(600, 0, 0.0)
    limits.reserve(300, 0, 0.05)
    assert limits.delay(200, 0, 0.9) == pytest.approx(FIRST_WINDOW - 0.9)  # until the 600 leave
    assert limits.delay(5_000, 0, FIRST_WINDOW) == pytest.approx(0.05)       # until the 300 leave too


def test_tpm_counts_prompt_plus_max_tokens_and_is_not_corrected_by_usage():
    """OpenAI counts a call's prompt and its max_tokens toward TPM when it starts
    (checked 2026-11-26): the `tpm` bucket keeps that charge whatever was generated."""
    limits = EndpointLimits(EndpointSpec(name="e", kind="openai", tpm=60_000), burst_seconds=1.0, now=0.0)
    assert limits.tokens is not None and limits.configured_rate("tokens") == 60_000
    limits.reserve(300, 500, 0.0)
    assert limits.tokens.level == pytest.approx(800)
    limits.settle((300, 500), (300, 20), 0.0)  # generated 20 of its 500
    assert limits.tokens.level == pytest.approx(800)
    limits.settle((300, 500), (330, 20), 0.0)  # the server counted 330 prompt tokens
    assert limits.tokens.level == pytest.approx(830)
    assert limits.delay(100, 150, 0.0) == pytest.approx(FIRST_WINDOW)  # 1,080 > a second's 1,000


def test_input_estimates_follow_the_servers_counts():
    limits = EndpointLimits(EndpointSpec(name="e", kind="openai", input_tpm=60_000), now=0.0)
    assert limits.calibrated(1000) == 1000
    for _ in range(100):  # the server counts 10% more than we estimate
        limits.observe_input(1000, 1100)
    assert limits.calibrated(1000) == pytest.approx(1100, abs=2)


def test_the_config_reads_tpm_and_refuses_a_bad_one():
    from engine.config import Config, ConfigError

    def endpoint(tpm: object) -> dict:
        return {"loop": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1", "tpm": tpm}}

    config = Config.from_dicts(endpoint(450_000), {"m": {"endpoint": "loop", "model": "x"}})
    assert config.endpoints["loop"].tpm == 450_000
    with pytest.raises(ConfigError, match="tpm"):
        Config.from_dicts(endpoint(-1), {"m": {"endpoint": "loop", "model": "x"}})
