"""Limits learned from the provider's reply headers (engine/limiter.py
`EndpointLimits.learn`, engine/gate.py `learn_limits`), the concurrency
AIMD on 429s that say nothing, and `tulving models --probe`.

The buckets are checked with explicit times; the engine runs against the
loopback server configured with request and token limits while the engine's
endpoint has none (or other ones), and counts the server's 429s."""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from engine.config import Config
from engine.gate import Gate
from engine.limiter import EndpointLimits, LeakyBucket, learned_window
from engine.loopback.server import LoopbackServer, constant
from engine.pacing import TRIAL_REPLIES
from engine.requests import ChatRequest
from engine.scheduler import Engine
from providers.base import EndpointSpec, RateLimitInfo
from tests.virtual_gate import make_gate, make_job, reply, too_many

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["test-model", "x"]

ROOT = Path(__file__).resolve().parent.parent


# -- the buckets ---------------------------------------------------------------------------

def test_an_unconfigured_endpoint_is_paced_by_a_learned_limit():
    limits = EndpointLimits(EndpointSpec(name="e", kind="openai"), burst_seconds=0.5, now=0.0)
    assert not limits.limited
    learned = limits.learn(RateLimitInfo(requests_limit=600, requests_remaining=599, requests_reset=0.1), 0.0, "m")
    assert learned == {"requests": 600.0} and limits.limited
    for _ in range(5):  # half a second of 10/s as a burst, then 10/s
        assert limits.delay(10, 10, 0.0, "m") == 0.0
        limits.reserve(10, 10, 0.0, "m")
    assert limits.delay(10, 10, 0.0, "m") == pytest.approx(0.1)
    assert limits.learn(RateLimitInfo(requests_limit=600), 0.0, "m") == {}  # unchanged: nothing new to announce


def test_a_lower_learned_limit_wins_and_a_higher_one_never_raises_the_configured_one():
    lower = EndpointLimits(EndpointSpec(name="e", kind="openai", rpm=600), burst_seconds=0.5, now=0.0)
    lower.learn(RateLimitInfo(requests_limit=300), 0.0, "m")  # 5/s under a configured 10/s
    higher = EndpointLimits(EndpointSpec(name="e", kind="openai", rpm=300), burst_seconds=0.5, now=0.0)
    higher.learn(RateLimitInfo(requests_limit=6000), 0.0, "m")  # 100/s over a configured 5/s
    for limits in (lower, higher):
        for _ in range(3):
            limits.reserve(0, 0, 0.0, "m")
        assert limits.delay(0, 0, 0.0, "m") == pytest.approx(0.2 * 1.5)  # at 5/s: 3 reserved, 2.5 of burst
    assert lower.configured_rate("requests") == 600 and higher.configured_rate("requests") == 300


def test_remaining_keeps_the_bucket_in_step():
    limits = EndpointLimits(EndpointSpec(name="e", kind="openai"), burst_seconds=0.5, now=0.0)
    limits.learn(RateLimitInfo(requests_limit=600, requests_remaining=1), 0.0, "m")  # only one left (others spent it)
    assert limits.delay(0, 0, 0.0, "m") == 0.0
    limits.reserve(0, 0, 0.0, "m")
    assert limits.delay(0, 0, 0.0, "m") == pytest.approx(0.1)  # the next waits for the refill, not our burst of 5
    # More remaining than our bucket has room for never loosens it.
    limits.learn(RateLimitInfo(requests_limit=600, requests_remaining=550), 0.0, "m")
    assert limits.delay(0, 0, 0.0, "m") == pytest.approx(0.1)
    # Token budgets too: 1,000 input tokens/s, 200 left.
    limits.learn(RateLimitInfo(input_tokens_limit=60_000, input_tokens_remaining=200), 1.0, "m")
    assert limits.delay(200, 0, 1.0, "m") == 0.0 and limits.delay(300, 0, 1.0, "m") == pytest.approx(0.1)


def test_a_reply_whose_figures_fit_no_window_keeps_the_minute_and_a_fitting_one_corrects_it():
    # OpenAI's documented example headers: 150,000 tokens, 149,984 left, reset-tokens 6m0s.
    # Taken at its word, 16 tokens take 6 minutes to restore: a "window" of 39 days, which
    # rounded to a day paced the endpoint at 104 tokens a minute for the rest of the run.
    assert learned_window(150_000, 149_984, 360.0) == 60
    limits = EndpointLimits(EndpointSpec(name="e", kind="openai"), burst_seconds=0.5, now=0.0)
    assert limits.learn(RateLimitInfo(tokens_limit=150_000, tokens_remaining=149_984, tokens_reset=360.0),
                        0.0, "m") == {"tokens": pytest.approx(150_000)}
    # A window learned from one reply is corrected by the next that fits another.
    assert learned_window(60_000, 30_000, 30.0, known=86_400) == 60


def test_the_window_is_a_minute_unless_the_reset_says_a_day():
    # OpenAI's requests per day: 10 of 10,000 used take 86.4 s to restore.
    assert learned_window(10_000, 9_990, 86.4) == 86_400
    limits = EndpointLimits(EndpointSpec(name="e", kind="openai"), burst_seconds=0.5, now=0.0)
    assert limits.learn(RateLimitInfo(requests_limit=10_000, requests_remaining=9_990, requests_reset=86.4),
                        0.0, "m") == {"requests": pytest.approx(10_000 / 1440)}
    assert limits.learn(RateLimitInfo(requests_limit=10_000, requests_remaining=9_999, requests_reset=8.6),
                        0.0, "m") == {}
    # Per minute: 59 of 60 left, restored in a second; Anthropic's whole-second resets say nothing.
    assert learned_window(60, 59, 1.0) == 60
    assert learned_window(4000, 3999, 1.0) == 60  # a 15 ms reset rounded up to 1 s
    assert learned_window(150_000, 149_984, 0.0064) == 60
    assert learned_window(60, 0, 60.0) == 60
    assert learned_window(60, None, None) == 60 and learned_window(60, 60, 0.0) == 60


def test_separate_input_and_output_limits_and_the_total_token_limit():
    anthropic = EndpointLimits(EndpointSpec(name="e", kind="anthropic"), burst_seconds=0.5, now=0.0)
    learned = anthropic.learn(RateLimitInfo(tokens_limit=8_000, input_tokens_limit=60_000,
                                            output_tokens_limit=6_000), 0.0, "m")
    assert learned == {"input_tokens": 60_000, "output_tokens": 6_000}  # "tokens" is only the tightest of them
    anthropic.reserve(500, 50, 0.0, "m")  # capacity 500 in, 50 out
    assert anthropic.delay(1, 0, 0.0, "m") == pytest.approx(0.001)
    assert anthropic.delay(0, 1, 0.0, "m") == pytest.approx(0.01)
    openai = EndpointLimits(EndpointSpec(name="e", kind="openai"), burst_seconds=0.5, now=0.0)
    assert openai.learn(RateLimitInfo(tokens_limit=60_000), 0.0, "m") == {"tokens": 60_000}
    openai.reserve(300, 200, 0.0, "m")  # prompt and completion share OpenAI's one token limit
    assert openai.delay(1, 0, 0.0, "m") == pytest.approx(0.001)
    openai.settle((300, 200), (300, 20), 0.0, "m")  # corrected from the reported usage
    assert openai.delay(180, 0, 0.0, "m") == 0.0


def test_learned_limits_are_each_models_own():
    """OpenAI and Anthropic limit each model apart: one model's reply paces that model only."""
    limits = EndpointLimits(EndpointSpec(name="e", kind="openai"), burst_seconds=0.5, now=0.0)
    limits.learn(RateLimitInfo(requests_limit=60, requests_remaining=0), 0.0, "gpt-4o")
    limits.learn(RateLimitInfo(requests_limit=6000, requests_remaining=5999), 0.0, "gpt-4o-mini")
    assert limits.delay(0, 0, 0.0, "gpt-4o") == pytest.approx(1.0)  # none left: the next in a second
    assert limits.delay(0, 0, 0.0, "gpt-4o-mini") == 0.0
    assert limits.delay(0, 0, 0.0, "another-model") == 0.0
    assert limits.learned_rates == {"gpt-4o": {"requests": 60}, "gpt-4o-mini": {"requests": 6000}}


def test_scale_above_one_never_lifts_a_configured_or_learned_limit():
    limits = EndpointLimits(EndpointSpec(name="e", kind="openai", input_tpm=60_000), burst_seconds=0.5, now=0.0)
    limits.learn(RateLimitInfo(output_tokens_limit=6_000), 0.0, "m")
    limits.set_request_rate(600, 0.0)  # an inferred request rate, probing upward
    limits.set_scale(8.0, 0.0)
    assert limits.requests.scale == 8.0
    assert limits.input_tokens.scale == 1.0 and limits.learned["m"]["output_tokens"].scale == 1.0


# -- concurrency AIMD on 429s that say nothing ------------------------------------------------

def _endpoint(**spec) -> Gate:
    """An endpoint's gate on a clock the test gives (tests/virtual_gate.py)."""
    return make_gate(**{"max_concurrency": 16, "rpm": None, **spec})


def _succeed(gate: Gate, n: int, now: float = 11.0) -> None:
    for _ in range(n):
        reply(gate, make_job(), now)


def test_a_429_saying_nothing_halves_concurrency_which_regrows_additively():
    gate = _endpoint()
    assert gate.pacing.concurrency_cap(1.0) == 16
    reply(gate, make_job(), 10.0, error=too_many(), sent_at=9.0)  # no retry-after, no rate-limit header
    assert gate.pacing.concurrency_cap(1.0) == 8
    _succeed(gate, 8)  # one cap's worth of successful replies: +1
    assert gate.pacing.concurrency_cap(1.0) == 9
    _succeed(gate, 9)
    assert gate.pacing.concurrency_cap(1.0) == 10
    _succeed(gate, 200)
    assert gate.pacing.concurrency_cap(1.0) == 16


def test_a_429_with_header_information_leaves_concurrency_to_the_limits():
    for error in (too_many(retry_after=1.0), too_many(limits=RateLimitInfo(requests_remaining=0))):
        gate = _endpoint()
        reply(gate, make_job(), 10.0, error=error, sent_at=9.0)
        assert gate.pacing.concurrency_cap(1.0) == 16


def test_a_concurrency_slow_down_that_does_not_lower_the_429_share_is_undone():
    gate = _endpoint(rpm=600)
    every_third = [i % 3 == 0 for i in range(30)]  # 33% of replies are 429s whatever we do

    def replies(pattern: list[bool], sent_at: float, now: float) -> None:
        for limited in pattern:
            reply(gate, make_job(rpm=600), now, error=too_many() if limited else None, sent_at=sent_at)

    replies(every_third[:12], sent_at=0.0, now=1.0)
    assert gate.pacing.concurrency_cap(1.0) == 9  # halved by the first 429, then +1 after 8 successes
    replies(every_third[:TRIAL_REPLIES], sent_at=2.0, now=3.0)  # the same share at half: undone
    assert gate.pacing.reverted == 1 and gate.pacing.concurrency_cap(gate.pacing.factor(3.0)) == 16


def test_a_reported_request_limit_replaces_an_inferred_one():
    gate = _endpoint()
    reply(gate, make_job(), 10.0, error=too_many(), sent_at=9.0)  # no limit known: a rate is inferred
    assert gate.limits.requests is not None and gate.pacing._inferred
    gate.learn_limits(RateLimitInfo(requests_limit=600), 11.0, "m")
    assert gate.limits.requests is None and not gate.pacing._inferred  # the provider's own figure instead
    assert gate.learned_limits == {"m": {"requests": 600}}
    # the next slow-down (its trial over: TRIAL_SECONDS later) halves the rate, inferring nothing
    reply(gate, make_job(), 50.0, error=too_many(), sent_at=49.0)
    assert gate.limits.requests is None and gate.pacing.factor(50.0) == 0.5


# -- the engine against the loopback server --------------------------------------------------

def _config(server: LoopbackServer, kind: str = "openai", **endpoint) -> Config:
    base = server.openai_base_url if kind == "openai" else server.anthropic_base_url
    ep = {"kind": kind, "base_url": base, "max_concurrency": 16, "timeout": 5.0, "max_attempts": 20, **endpoint}
    # Anthropic's current version (2026-10-21) takes no temperature: these calls send the limit only there.
    params = {"max_tokens": 16} if kind == "anthropic" else {"temperature": 0.0, "max_tokens": 16}
    return Config.from_dicts({"lb": ep}, {"m": {"endpoint": "lb", "model": "test-model", "params": params}})


async def _run(config: Config, n: int, salt: str) -> Engine:
    requests = [ChatRequest(model="m", messages=[{"role": "user", "content": f"{salt} question {i}"}])
                for i in range(n)]
    async with Engine(config) as engine:
        outcomes = await engine.run(requests)
    assert all(o.ok for o in outcomes), [str(o.error) for o in outcomes if not o.ok][:3]
    return engine


@pytest.fixture
def no_learning(monkeypatch):
    """The engine as it was: reply headers ignored (the control run)."""
    def disable() -> None:
        monkeypatch.setattr(Gate, "learn_limits", lambda self, *args: None)
    return disable


async def test_an_unconfigured_endpoint_learns_the_servers_rpm_and_gets_almost_no_429s(no_learning):
    # The server's bucket holds half a second of its 50 calls/s (25: a call sent up to 0.4 s late still
    # fits the engine's pace); 100 calls sent blind go past it.
    async with LoopbackServer(models=SERVED, rpm=3000, burst_seconds=0.5, latency=constant(0.001)) as server:
        engine = await _run(_config(server), 100, "learn")
        learned_429s = server.stats.rate_limited
    assert learned_429s <= 2, learned_429s
    assert engine.stats.learned_limits == {"lb": {"test-model": {"requests": 3000.0}}}
    assert any("lb: the provider reports for test-model 3,000 requests/min (none configured: using it)" in n
               for n in engine.stats.notices)
    no_learning()
    async with LoopbackServer(models=SERVED, rpm=3000, burst_seconds=0.5, latency=constant(0.001)) as server:
        engine = await _run(_config(server), 100, "blind")
        blind_429s = server.stats.rate_limited
    assert not engine.stats.learned_limits
    assert blind_429s >= 10 and blind_429s >= 5 * max(1, learned_429s), (blind_429s, learned_429s)


async def test_anthropic_input_and_output_token_limits_are_learned(no_learning):
    # 60 calls of ~10 input and 16 output tokens under 60k input and 30k output tokens/min.
    limits = {"rpm": 60_000, "input_tpm": 60_000, "output_tpm": 30_000}
    async with LoopbackServer(models=SERVED, reply=lambda api, body: "word " * 40, **limits) as server:
        engine = await _run(_config(server, kind="anthropic"), 60, "tokens")
        learned_429s = server.stats.rate_limited
    assert engine.stats.learned_limits == {"lb": {"test-model": {"requests": 60_000.0, "input_tokens": 60_000.0,
                                                                 "output_tokens": 30_000.0}}}
    assert learned_429s <= 2, learned_429s
    no_learning()
    async with LoopbackServer(models=SERVED, reply=lambda api, body: "word " * 40, **limits) as server:
        await _run(_config(server, kind="anthropic"), 60, "tokens-blind")
        blind_429s = server.stats.rate_limited
    assert blind_429s >= 5 * max(1, learned_429s), (blind_429s, learned_429s)


async def test_a_lower_provider_limit_beats_the_configured_one(no_learning):
    async with LoopbackServer(models=SERVED, rpm=1800, latency=constant(0.001)) as server:
        engine = await _run(_config(server, rpm=12_000), 60, "lower")
        learned_429s = server.stats.rate_limited
    assert learned_429s <= 2, learned_429s
    assert any("1,800 requests/min (lower than the configured 12,000: using it)" in n for n in engine.stats.notices)
    no_learning()
    async with LoopbackServer(models=SERVED, rpm=1800, latency=constant(0.001)) as server:
        await _run(_config(server, rpm=12_000), 60, "lower-blind")
        blind_429s = server.stats.rate_limited
    assert blind_429s >= 5 * max(1, learned_429s), (blind_429s, learned_429s)


async def test_a_higher_provider_limit_does_not_raise_the_configured_one():
    async with LoopbackServer(models=SERVED, rpm=60_000, latency=constant(0.001)) as server:
        engine = await _run(_config(server, rpm=600), 20, "higher")  # at the server's 1,000/s: all in a second
        busiest_second = server.stats.max_accepted_in(1.0)
    assert busiest_second <= 10 + 5 + 1  # the configured 10/s and its burst, not the server's 1,000/s
    assert any("60,000 requests/min (configured 600 kept)" in n for n in engine.stats.notices)


async def _spend_the_budget(server: LoopbackServer) -> None:
    """Another client of the account spends all but ~120 tokens of the minute's
    input-token budget with one long prompt."""
    body = {"model": "x", "max_tokens": 1, "messages": [{"role": "user", "content": "x" * (59_880 * 4)}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(server.openai_base_url + "/chat/completions", json=body) as reply:
            assert reply.status == 200 and int(reply.headers["x-ratelimit-remaining-tokens"]) < 200


async def test_remaining_keeps_the_engine_in_step_with_a_budget_spent_elsewhere(monkeypatch):
    """The server enforces its minute's budget (burst_seconds=60) of 60k input tokens;
    the engine is configured with the same limit but its bucket cannot know that
    another client spent the budget: `remaining` tells it."""
    async def run(salt: str) -> int:
        async with LoopbackServer(models=SERVED, input_tpm=60_000, burst_seconds=60) as server:
            await _spend_the_budget(server)
            await _run(_config(server, input_tpm=60_000, max_concurrency=1), 12, salt + " " + "word " * 80)
            return server.stats.rate_limited
    # A burst of half a second (the engine's is smaller) is what `remaining` must rein in.
    monkeypatch.setattr("engine.limiter.BURST_SECONDS", 0.5)
    synced = await run("synced")
    monkeypatch.setattr(LeakyBucket, "sync_remaining", lambda self, *args: None)
    drifting = await run("drifting")
    assert synced <= 2 and drifting >= synced + 3, (synced, drifting)


# -- tulving models --probe ----------------------------------------------------------------------

async def test_models_probe_through_the_cli_against_the_loopback_server(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TULVING")}
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "engine.loopback", "--port", "0", "--rpm", "600", "--input-tpm", "60000",
        "--output-tpm", "6000", "--models", "loop-model,text-embedding-loop,claude-loop",
        cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE)
    try:
        openai_url = (await server.stdout.readline()).decode().strip().split("=", 1)[1]
        anthropic_url = (await server.stdout.readline()).decode().strip().split("=", 1)[1]
        config = tmp_path / "c.toml"
        config.write_text(f"""
[endpoints.loop-openai]
kind = "openai"
base_url = "{openai_url}"
free = true
key_env = "TULVING_PROBE_KEY"
rpm = 300
[endpoints.loop-anthropic]
kind = "anthropic"
base_url = "{anthropic_url}"
free = true
[endpoints.loop-unkeyed]
kind = "openai"
base_url = "{openai_url}"
free = true
key_env = "TULVING_PROBE_UNSET"
[models.m]
endpoint = "loop-openai"
model = "loop-model"
[models.e]
endpoint = "loop-openai"
model = "text-embedding-loop"
[models.c]
endpoint = "loop-anthropic"
model = "claude-loop"
[models.u]
endpoint = "loop-unkeyed"
model = "never-asked"
""")

        async def tulving(*args: str) -> tuple[int, str, str]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "engine.cli", "--config", str(config), *args, cwd=ROOT,
                env={**env, "TULVING_PROBE_KEY": "sk-probe-0123456789"},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            return proc.returncode, out.decode(), err.decode()

        def served() -> int:
            with urllib.request.urlopen(openai_url.rsplit("/v1", 1)[0] + "/loopback/stats", timeout=5) as r:
                return json.load(r)["requests"]

        code, out, err = await tulving("models")
        assert code == 0, err
        assert "rate limits" not in out and await asyncio.to_thread(served) == 0  # offline without --probe

        code, out, err = await tulving("models", "--probe")
        assert code == 0, err
        assert await asyncio.to_thread(served) == 2  # one call per keyed endpoint, none to the unkeyed one
        rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("loop-")}
        assert "loop-model" in rows["loop-openai"]  # a chat model preferred to the embedding one
        # 600/min reported, 599 or 598 left (the two probes run at once), the configured 300 beside it
        assert re.search(r"\b600 \(59[89] left\), configured 300\b", rows["loop-openai"]), rows["loop-openai"]
        assert "60,000" in rows["loop-openai"]
        assert "claude-loop" in rows["loop-anthropic"]
        assert "600 (" in rows["loop-anthropic"] and "60,000 (" in rows["loop-anthropic"]
        assert "6,000 (" in rows["loop-anthropic"]
        assert "loop-unkeyed: not probed: TULVING_PROBE_UNSET not set" in out
        assert "sk-probe-0123456789" not in out + err
    finally:
        server.terminate()
        await server.wait()


def test_models_probe_of_a_dead_server_says_so_and_fails(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[endpoints.dead]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
                      '[models.d]\nendpoint = "dead"\nmodel = "gone"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("TULVING")}
    result = subprocess.run([sys.executable, "-m", "engine.cli", "--config", str(config), "models", "--probe"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert re.search(r"^dead: connection: dead: .*", result.stdout, re.MULTILINE), result.stdout
    assert "Traceback" not in result.stderr
