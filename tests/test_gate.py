"""An endpoint's gate (engine/gate.py) on a clock the test advances: what it
admits, what a reply teaches it, whether and when a call is tried again, and
when it takes the endpoint for dead. No server, no loop, no sleeping."""
from __future__ import annotations

import pytest

from engine.budget import Budget
from engine.gate import (
    DONE,
    DOWN_AFTER,
    NOTICE_WAIT,
    RATE_LIMITED_ATTEMPTS,
    UNNAMED_429_RETRY_CAP,
    Refuse,
    RetryAt,
    Start,
    Wait,
)
from engine.limiter import COLD_MARGIN, SEND_WINDOW
from providers.base import AUTH, BAD_REQUEST, OVERLOADED, PROMPT_TOO_LONG, TIMEOUT, RateLimitInfo
from tests.virtual_gate import Notes, failure, make_gate, make_job, reply, send, too_many

# -- whether and when a failed call is tried again ---------------------------------------------


def test_a_servers_retry_after_is_honoured_capped_and_the_cap_reported_for_429s():
    notes = Notes()
    gate = make_gate(notes=notes, max_retry_after=60.0)
    job = make_job()
    send(gate, job, 0.0)
    verdict = reply(gate, job, 1.0, error=too_many(retry_after=86_400.0))
    assert isinstance(verdict, RetryAt) and 1.0 + 60.0 <= verdict.at <= 1.0 + 60.0 * 1.1 + 0.05
    assert gate.retry_after_capped == 1 and gate.rate_limited == 1
    assert any("asked to wait 86,400 s" in line and "waiting 60 s instead" in line for line in notes.lines)
    send(gate, job, 100.0)
    verdict = reply(gate, job, 101.0, error=too_many(retry_after=5.0))
    assert isinstance(verdict, RetryAt) and 106.0 <= verdict.at <= 106.0 + 0.55


def test_a_retry_waiting_notice_wait_or_longer_is_announced_and_a_shorter_one_is_not():
    notes = Notes()
    gate = make_gate(notes=notes, max_retry_after=60.0)
    job = make_job()
    send(gate, job, 0.0)
    assert isinstance(reply(gate, job, 1.0, error=too_many(retry_after=NOTICE_WAIT - 1.0)), RetryAt)
    assert notes.lines == []  # 4 s and its jitter: under NOTICE_WAIT, said nothing
    send(gate, job, 10.0)
    verdict = reply(gate, job, 11.0, error=too_many(retry_after=NOTICE_WAIT))
    assert isinstance(verdict, RetryAt) and verdict.at >= 11.0 + NOTICE_WAIT  # 5 s and a little jitter upwards
    assert notes.lines == [f"waiting for e: rate_limited, retrying in {verdict.at - 11.0:.0f} s"]


def test_a_503s_long_wait_is_capped_without_a_429_report():
    gate = make_gate(max_retry_after=60.0)
    job = make_job()
    send(gate, job, 0.0)
    err = failure(OVERLOADED, 503)
    err.retry_after = 86_400.0
    verdict = reply(gate, job, 1.0, error=err)
    assert isinstance(verdict, RetryAt) and verdict.at <= 1.0 + 66.05 and gate.retry_after_capped == 0


def test_a_429_naming_no_wait_backs_off_a_bounded_time():
    gate = make_gate()
    job = make_job()
    for n in range(9):
        send(gate, job, 10.0 * n)
        verdict = reply(gate, job, 10.0 * n + 1, error=too_many())
        assert isinstance(verdict, RetryAt)
    assert verdict.at - (10.0 * 8 + 1) == UNNAMED_429_RETRY_CAP  # 2**8 s of backoff, capped


def test_429s_have_their_own_allowance_apart_from_other_errors():
    gate = make_gate(max_attempts=3)
    job = make_job()
    now = 0.0
    for _ in range(RATE_LIMITED_ATTEMPTS - 1):  # many 429s do not spend the attempts for other errors
        send(gate, job, now)
        assert isinstance(reply(gate, job, now + 1, error=too_many(retry_after=0.0)), RetryAt)
        now += 1000.0
    for _ in range(2):  # two other failures: the 3rd attempt of max_attempts 3 is still allowed
        send(gate, job, now)
        assert isinstance(reply(gate, job, now + 1, error=failure(OVERLOADED)), RetryAt)
        now += 1000.0
    send(gate, job, now)
    assert reply(gate, job, now + 1, error=failure(OVERLOADED)) is DONE
    other = make_job()
    send(gate, other, now)
    assert reply(gate, other, now + 1, error=failure(BAD_REQUEST, 400)) is DONE  # not retryable


def test_the_nth_other_failure_backs_off_exponentially():
    gate = make_gate(max_attempts=6)
    job = make_job(max_attempts=6)
    waits = []
    for n in range(4):
        send(gate, job, 100.0 * n)
        verdict = reply(gate, job, 100.0 * n + 1, error=failure(TIMEOUT, None))
        assert isinstance(verdict, RetryAt)
        waits.append(verdict.at - (100.0 * n + 1))
    assert waits == [1.0, 2.0, 4.0, 8.0]  # base 1 s, no jitter in the test policy


def test_a_call_past_its_total_timeout_is_not_tried_again():
    gate = make_gate(total_timeout=5.0)
    job = make_job(total_timeout=5.0)
    send(gate, job, 0.0)
    assert job.deadline == 5.0
    assert isinstance(reply(gate, job, 1.0, error=failure(OVERLOADED)), RetryAt)  # 1 + 1 s < 5
    send(gate, job, 2.0)
    assert reply(gate, job, 4.5, error=failure(OVERLOADED)) is DONE  # 4.5 + 2 s > 5


# -- admission ---------------------------------------------------------------------------------


def test_a_pause_after_429s_holds_calls_back_until_it_ends():
    gate = make_gate(rpm=None)
    for i in range(4):  # 429s dominate the last replies: the endpoint pauses for the server's wait
        job = make_job(text=f"call {i}")
        send(gate, job, 0.0, in_flight=i)
    for _ in range(4):
        reply(gate, job, 1.0, error=too_many(retry_after=3.0))
    waiting = gate.admit(make_job(), 2.0, 0)
    assert isinstance(waiting, Wait) and waiting.seconds == pytest.approx(2.0)
    assert isinstance(gate.admit(make_job(), 4.0, 0), Start)


def _send_when_admitted(gate, job, now: float) -> float:
    """Send `job` as soon as the gate admits it from `now`; returns when it was sent."""
    while isinstance(verdict := gate.admit(job, now, 0), Wait):
        now += verdict.seconds
    assert isinstance(verdict, Start)
    return now


def test_429s_to_the_opening_sends_wait_the_named_time_without_slowing_down():
    """The first second's share of sends under a configured request limit
    met a server window already in use (a run just before): their 429s say
    nothing of our pace. The endpoint waits what the server named and keeps
    its rate; a 429 to a later send slows down as usual."""
    gate = make_gate(rpm=600)  # 10 a second: the opening is the first 10 sends
    opening = [make_job(text=f"opening {i}") for i in range(10)]
    sent, now = [], 0.0
    for job in opening:
        now = _send_when_admitted(gate, job, now)
        sent.append(now)
    for job, at in zip(opening[:4], sent):
        assert isinstance(reply(gate, job, now, error=too_many(retry_after=0.05), sent_at=at), RetryAt)
    assert gate.pacing.factor(now) == 1.0 and gate.pacing.paused_until == pytest.approx(now + 0.05)
    for job, at in zip(opening[4:], sent[4:]):
        reply(gate, job, now, sent_at=at)
    later = make_job(text="after the opening")
    at = _send_when_admitted(gate, later, now + 0.05)
    reply(gate, later, at + 0.1, error=too_many(retry_after=0.05), sent_at=at)
    assert gate.pacing.factor(at + 0.1) == 0.5


def test_the_concurrency_cap_waits_for_a_slot():
    gate = make_gate(max_concurrency=2)
    assert isinstance(gate.admit(make_job(), 0.0, 1), Start)
    waiting = gate.admit(make_job(), 0.0, 2)
    assert isinstance(waiting, Wait) and waiting.seconds is None and not waiting.for_budget


def test_rate_limits_say_how_long_to_wait_and_admit_once_the_clock_gets_there():
    gate = make_gate(rpm=60)  # one a second, a burst of one
    assert isinstance(gate.admit(make_job(), 0.0, 0), Start)
    waiting = gate.admit(make_job(), 0.0, 0)
    # on the test's clock: a second's window, plus the margin the first second's sends keep in the log
    assert isinstance(waiting, Wait) and waiting.seconds == pytest.approx(SEND_WINDOW + COLD_MARGIN)
    assert isinstance(gate.admit(make_job(), 0.0 + waiting.seconds, 0), Start)


def test_the_budget_refuses_what_cannot_fit_and_holds_back_what_fits_once_calls_settle():
    budget = Budget(max_cost=0.0001)
    gate = make_gate(budget=budget)
    refused = gate.admit(make_job(input_estimate=1_000_000), 0.0, 0)  # $1 of input: never fits
    assert isinstance(refused, Refuse) and refused.error.kind == "budget"
    budget.reserve(make_job().resolved.alias, 40, 10)  # calls in flight hold most of the room
    waiting = gate.admit(make_job(input_estimate=40), 0.0, 1)
    assert isinstance(waiting, Wait) and waiting.for_budget


def test_a_call_its_provider_holds_starts_without_a_slot_even_while_paused():
    gate = make_gate(rpm=None)
    job = make_job()
    send(gate, job, 0.0)
    for _ in range(4):
        reply(gate, job, 1.0, error=too_many(retry_after=30.0))
    assert gate.pacing.paused_until > 2.0
    held = make_job(held=True)
    verdict = gate.admit(held, 2.0, 16)
    assert verdict == Start(slot=False) and held.deadline is None


# -- what replies teach ------------------------------------------------------------------------


def test_reported_limits_are_learned_once_announced_and_pace_the_model():
    notes = Notes()
    gate = make_gate(notes=notes, rpm=None)
    job = make_job()
    send(gate, job, 0.0)
    reply(gate, job, 0.5, limits=RateLimitInfo(requests_limit=60, requests_remaining=59))
    assert gate.learned_limits == {"m-1": {"requests": 60.0}}
    assert [line for line in notes.lines if "reports for m-1 60 requests/min" in line]
    assert isinstance(gate.admit(make_job(), 0.6, 0), Start)
    assert isinstance(gate.admit(make_job(), 0.6, 0), Wait)  # 60/min learned: the next one waits


def test_token_reservations_are_corrected_from_the_reported_usage():
    gate = make_gate(input_tpm=600)  # 10 tokens a second
    job = make_job(input_estimate=100)
    send(gate, job, 0.0)
    waiting = gate.admit(make_job(input_estimate=10), 0.0, 1)
    assert isinstance(waiting, Wait) and waiting.seconds == pytest.approx(10.0)  # 100 reserved: 10 s of rate
    reply(gate, job, 0.1, usage=(1, 1))  # the server counted 1
    assert isinstance(gate.admit(make_job(input_estimate=1), 1.2, 0), Start)


# -- a dead endpoint ---------------------------------------------------------------------------


def _fail_for_good(gate, now: float, kind=OVERLOADED) -> float:
    """One call that fails with `kind` until its attempts are spent; returns the clock after it."""
    job = make_job(text=f"call at {now}")
    while True:
        send(gate, job, now)
        verdict = reply(gate, job, now + 1, error=failure(kind))
        now += 100.0
        if verdict is DONE:
            return now


def test_an_endpoint_whose_calls_all_fail_for_good_is_down_and_refuses_the_rest():
    notes = Notes()
    gate = make_gate(notes=notes, rpm=None)
    now = 0.0
    for _ in range(DOWN_AFTER - 1):
        now = _fail_for_good(gate, now)
    assert gate.down is None
    in_flight = make_job(text="in flight when it died")
    send(gate, in_flight, now)
    now = _fail_for_good(gate, now)
    assert gate.down is not None and gate.down.kind == OVERLOADED and "endpoint e is down" in str(gate.down)
    refused = gate.admit(make_job(), now, 0)
    assert isinstance(refused, Refuse) and refused.error is gate.down
    assert reply(gate, in_flight, now, error=failure(OVERLOADED)) is DONE  # no retry once down
    line = gate.down_line(42, "`tulving run --config x.toml`")
    assert "e is down" in line and f"{DOWN_AFTER} calls in a row failed" in line and "42 waiting calls" in line
    assert "rerun `tulving run --config x.toml` to resume" in line and "\n" not in line


def test_a_success_between_failures_keeps_the_endpoint_up():
    gate = make_gate(rpm=None)
    now = 0.0
    for _ in range(3):
        for _ in range(DOWN_AFTER - 1):
            now = _fail_for_good(gate, now)
        job = make_job()
        send(gate, job, now)
        assert reply(gate, job, now + 1) is DONE
        now += 10.0
    assert gate.down is None


@pytest.mark.parametrize("kind", [PROMPT_TOO_LONG, BAD_REQUEST])
def test_a_refusal_of_one_call_shows_the_endpoint_works(kind):
    gate = make_gate(rpm=None)
    now = 0.0
    for _ in range(3):
        for _ in range(DOWN_AFTER - 1):
            now = _fail_for_good(gate, now, TIMEOUT)
        job = make_job()
        send(gate, job, now)
        assert reply(gate, job, now + 1, error=failure(kind, 400)) is DONE
        now += 10.0
    assert gate.down is None


def test_a_429_storm_is_never_taken_for_death():
    gate = make_gate(rpm=None, max_attempts=1)
    now = 0.0
    for i in range(10 * DOWN_AFTER):
        job = make_job(text=f"storm {i}")
        verdict = None
        while verdict is not DONE:
            send(gate, job, now)
            verdict = reply(gate, job, now + 0.5, error=too_many(retry_after=0.1))
            now += 1000.0  # past any pause
    assert gate.down is None and gate.rate_limited == 10 * DOWN_AFTER * RATE_LIMITED_ATTEMPTS


def test_auth_failures_take_the_endpoint_down_after_as_many_calls():
    gate = make_gate(rpm=None)
    now = 0.0
    for _ in range(DOWN_AFTER):
        now = _fail_for_good(gate, now, AUTH)
    assert gate.down is not None and gate.down.kind == AUTH


# -- the call record has one writer ----------------------------------------------------------


def test_only_the_call_record_changes_its_fields():
    """`Job` (engine/call.py) is read by the engine, the dispatcher and the
    gate; its fields change only through its own methods."""
    import re
    from pathlib import Path

    engine_dir = Path(__file__).resolve().parents[1] / "engine"
    assignment = re.compile(r"\b(job|nxt|held|other)\.(\w+)\s*(\+|-)?=(?!=)")
    found = [f"{path.name}: {m.group(0)}" for path in sorted(engine_dir.glob("*.py")) if path.name != "call.py"
             for m in assignment.finditer(path.read_text(encoding="utf-8"))]
    assert found == []
