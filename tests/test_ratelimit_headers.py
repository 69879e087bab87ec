"""Rate limits read from reply headers (providers/ratelimit_headers.py): both
providers' header families on real samples, garbage ignored, and the limits
attached to every result and error of the HTTP providers, over real HTTP
against the loopback server."""
from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from multidict import CIMultiDict

from engine.loopback.limits import go_duration
from engine.loopback.server import LoopbackServer
from providers.anthropic_http import AnthropicProvider
from providers.base import RATE_LIMITED, EndpointSpec, ProviderError, RateLimitInfo
from providers.http_errors import status_error
from providers.openai_http import OpenAIProvider
from providers.ratelimit_headers import parse_duration, parse_rfc3339, rate_limit_info

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["m", "e", "c"]

USER = [{"role": "user", "content": "Where did Maya meet Sam on March 3?"}]

# OpenAI's documented example (platform.openai.com, "Rate limits", "Rate limits in headers").
OPENAI_SAMPLE = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-limit-tokens": "150000",
    "x-ratelimit-remaining-requests": "59",
    "x-ratelimit-remaining-tokens": "149984",
    "x-ratelimit-reset-requests": "1s",
    "x-ratelimit-reset-tokens": "6m0s",
}

# A real Anthropic reply (claude-3-7-sonnet, curl -i, quoted in bespokelabsai/curator#535): no
# input-token group, and a requests reset already past when the reply was dated 20:38:03.
ANTHROPIC_SAMPLE = {
    "date": "Mon, 24 Feb 2025 20:38:03 GMT",
    "anthropic-ratelimit-requests-limit": "4000",
    "anthropic-ratelimit-requests-remaining": "3999",
    "anthropic-ratelimit-requests-reset": "2025-02-24T20:37:51Z",
    "anthropic-ratelimit-output-tokens-limit": "80000",
    "anthropic-ratelimit-output-tokens-remaining": "80000",
    "anthropic-ratelimit-output-tokens-reset": "2025-02-24T20:38:03Z",
    "request-id": "",
}
SAMPLE_NOW = datetime(2025, 2, 24, 20, 38, 3, tzinfo=UTC).timestamp()

# Every group, as the rate-limits page documents them, two seconds before the resets.
ANTHROPIC_FULL = {
    "anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "49",
    "anthropic-ratelimit-requests-reset": "2025-02-24T20:38:05Z",
    "anthropic-ratelimit-tokens-limit": "8000", "anthropic-ratelimit-tokens-remaining": "7900",
    "anthropic-ratelimit-tokens-reset": "2025-02-24T20:38:05Z",
    "anthropic-ratelimit-input-tokens-limit": "40000", "anthropic-ratelimit-input-tokens-remaining": "39000",
    "anthropic-ratelimit-input-tokens-reset": "2025-02-24T20:38:05Z",
    "anthropic-ratelimit-output-tokens-limit": "8000", "anthropic-ratelimit-output-tokens-remaining": "7900",
    "anthropic-ratelimit-output-tokens-reset": "2025-02-24T20:38:05+00:00",
    "retry-after": "2",
}


def test_openai_sample():
    assert rate_limit_info(OPENAI_SAMPLE) == RateLimitInfo(
        requests_limit=60, requests_remaining=59, requests_reset=1.0,
        tokens_limit=150000, tokens_remaining=149984, tokens_reset=360.0)


def test_anthropic_samples_with_absolute_resets():
    info = rate_limit_info(ANTHROPIC_SAMPLE, now=SAMPLE_NOW)
    assert info == RateLimitInfo(requests_limit=4000, requests_remaining=3999, requests_reset=0.0,  # already past
                                 output_tokens_limit=80000, output_tokens_remaining=80000, output_tokens_reset=0.0)
    full = rate_limit_info(ANTHROPIC_FULL, now=SAMPLE_NOW)
    assert full is not None
    assert (full.requests_limit, full.requests_remaining, full.requests_reset) == (50, 49, 2.0)
    assert (full.tokens_limit, full.tokens_remaining, full.tokens_reset) == (8000, 7900, 2.0)
    assert (full.input_tokens_limit, full.input_tokens_remaining, full.input_tokens_reset) == (40000, 39000, 2.0)
    assert (full.output_tokens_limit, full.output_tokens_remaining, full.output_tokens_reset) == (8000, 7900, 2.0)


def test_header_names_are_found_whatever_their_case():
    """aiohttp hands the headers over as a case-insensitive multidict, the pool lower-cased."""
    mixed = CIMultiDict({name.upper(): value for name, value in OPENAI_SAMPLE.items()})
    assert rate_limit_info(mixed) == rate_limit_info(OPENAI_SAMPLE)


def test_durations_parse_ms_before_m():
    cases = {"12ms": 0.012, "1s": 1.0, "6m0s": 360.0, "1h0m0s": 3600.0, "1m30.5s": 90.5, "8.64s": 8.64,
             "1h2m3.5s": 3723.5, "0s": 0.0, "2m12ms": 120.012, "250": 250.0}
    for text, seconds in cases.items():
        assert parse_duration(text) == pytest.approx(seconds), text


def test_the_loopback_servers_durations_parse_back():
    grammar = re.compile(r"^(\d+(\.\d+)?h)?(\d+(\.\d+)?m)?(\d+(\.\d+)?s)?(\d+(\.\d+)?ms)?$")
    for ms in list(range(0, 2000, 7)) + [59_999, 60_000, 61_250, 3_599_999, 3_600_000, 86_400_000]:
        text = go_duration(ms / 1000)
        assert grammar.match(text), text
        assert parse_duration(text) == pytest.approx(ms / 1000, abs=5e-4), text


@pytest.mark.parametrize("value", ["", "abc", "-5", "nan", "inf", "-inf", "1e999", "5m3", "1x", "s", "ms",
                                   "1.2.3s", "1h-2m", "--", "0x10", "1s 2s", "\x00", "9" * 400, "１０"])
def test_garbage_counts_and_durations_are_ignored(value):
    headers = {f"x-ratelimit-{what}-{kind}": value for what in ("limit", "remaining", "reset")
               for kind in ("requests", "tokens")}
    info = rate_limit_info(headers)
    if info is not None:  # a few of these read as numbers ("250"-like); none may be negative or infinite
        for number in (getattr(info, f) for f in info.__slots__ if getattr(info, f) is not None):
            assert 0 <= number < float("inf")


@pytest.mark.parametrize("value", ["", "yesterday", "2025-02-24T20:38:05", "2025-13-45T25:61:61Z",
                                   "2025-02-24", "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00",
                                   "Mon, 24 Feb 2025 20:38:03 GMT", "1740429485", "\x00Z"])
def test_garbage_times_are_ignored(value):
    reset = parse_rfc3339(value, SAMPLE_NOW)
    assert reset is None or 0 <= reset < float("inf")
    info = rate_limit_info({"anthropic-ratelimit-requests-reset": value}, now=SAMPLE_NOW)
    assert info is None or info.requests_reset == reset


def test_no_rate_limit_header_is_none():
    assert rate_limit_info({}) is None
    assert rate_limit_info({"retry-after": "3", "content-type": "application/json"}) is None
    assert rate_limit_info({"x-ratelimit-limit-requests": "many"}) is None


def test_errors_carry_the_limits_of_their_reply():
    body = b'{"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}'
    headers = {**OPENAI_SAMPLE, "x-ratelimit-remaining-requests": "0"}
    error = status_error(429, body, headers, endpoint="e", secret=None)
    assert error.kind == RATE_LIMITED and error.rate_limits is not None
    assert error.rate_limits.requests_remaining == 0 and error.rate_limits.requests_limit == 60
    overloaded = status_error(529, b'{"type": "error", "error": {"type": "overloaded_error"}}', ANTHROPIC_FULL,
                              endpoint="e", secret=None)
    assert overloaded.rate_limits is not None and overloaded.rate_limits.output_tokens_limit == 8000
    assert status_error(500, b"oops", {}, endpoint="e", secret=None).rate_limits is None


# -- every result and error of the HTTP providers, over real HTTP --------------------------

async def test_providers_attach_the_limits_to_results_and_errors():
    async with LoopbackServer(in_process=True, models=SERVED, rpm=600, input_tpm=60_000, output_tpm=6_000) as server:
        openai = OpenAIProvider(EndpointSpec(name="o", kind="openai", base_url=server.openai_base_url), None)
        anthropic = AnthropicProvider(EndpointSpec(name="a", kind="anthropic", base_url=server.anthropic_base_url),
                                      None)
        try:
            chat = await openai.chat("m", USER, params={"max_tokens": 16}, timeout=5)
            embed = await openai.embed("e", ["hi"], timeout=5)
            message = await anthropic.chat("c", USER, params={"max_tokens": 16}, timeout=5)
            streamed = [await openai.chat("m", USER, params={"max_tokens": 16}, timeout=5, stream=True),
                        await anthropic.chat("c", USER, params={"max_tokens": 16}, timeout=5, stream=True)]
        finally:
            await openai.aclose()
            await anthropic.aclose()
    for result in (chat, embed):
        info = result.rate_limits
        assert info is not None and info.requests_limit == 600 and info.tokens_limit == 60_000
        assert 597 <= info.requests_remaining <= 600 and 0 <= info.requests_reset <= 0.3
        assert info.input_tokens_limit is None
    info = message.rate_limits
    assert info is not None and info.requests_limit == 600
    assert info.input_tokens_limit == 60_000 and info.output_tokens_limit == 6_000
    assert 0 <= info.output_tokens_reset <= 61  # absolute, whole seconds: rounded up
    for result in streamed:  # a streamed reply's headers too
        assert result.timings is not None and result.rate_limits is not None
        assert result.rate_limits.requests_limit == 600


async def test_a_429_error_carries_the_limits():
    async with LoopbackServer(in_process=True, models=SERVED, rpm=60) as server:  # enforced as one request a second
        openai = OpenAIProvider(EndpointSpec(name="o", kind="openai", base_url=server.openai_base_url), None)
        anthropic = AnthropicProvider(EndpointSpec(name="a", kind="anthropic", base_url=server.anthropic_base_url),
                                      None)
        try:
            await openai.chat("m", USER, params={"max_tokens": 4}, timeout=5)
            with pytest.raises(ProviderError) as openai_429:
                await openai.chat("m", USER, params={"max_tokens": 4}, timeout=5)
            with pytest.raises(ProviderError) as anthropic_429:
                await anthropic.chat("c", USER, params={"max_tokens": 4}, timeout=5)
        finally:
            await openai.aclose()
            await anthropic.aclose()
    for info in (openai_429.value, anthropic_429.value):
        assert info.kind == RATE_LIMITED and info.rate_limits is not None
        assert info.rate_limits.requests_limit == 60 and info.rate_limits.requests_remaining == 59


def test_anthropic_resets_are_read_against_the_servers_clock():
    # The client's clock runs 100 s behind the server's: against it, a reset 30 s away
    # would look 130 s away (and a per-minute limit like an hourly one).
    import time
    from datetime import UTC, datetime
    from email.utils import format_datetime

    server_now = time.time() + 100
    headers = {"date": format_datetime(datetime.fromtimestamp(int(server_now), UTC), usegmt=True),
               "anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "25",
               "anthropic-ratelimit-requests-reset": datetime.fromtimestamp(int(server_now) + 30, UTC)
               .isoformat().replace("+00:00", "Z")}
    info = rate_limit_info(headers)
    assert info is not None and info.requests_reset == pytest.approx(30.0)
    headers["date"] = "not a date"  # unreadable: the client's clock, as before
    assert rate_limit_info(headers).requests_reset == pytest.approx(130.0, abs=2)
