"""The loopback's sliding-window enforcement, its prompt + max_tokens limit and
its header switch, over HTTP on loopback (and the window itself, clocked)."""
from __future__ import annotations

import subprocess
import sys

import aiohttp
import orjson
import pytest

from engine.loopback.limits import RateLimits, SlidingWindow
from engine.loopback.server import LoopbackServer

SERVED = ["m"]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict]:
    async with session.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}) as resp:
        return resp.status, {k.lower(): v for k, v in resp.headers.items()}


async def test_sliding_window_answers_429_to_the_call_past_a_seconds_share():
    async with LoopbackServer(models=SERVED, rpm=600, window="sliding") as server:  # 10 in any second
        async with aiohttp.ClientSession() as session:
            url = server.openai_base_url + "/chat/completions"
            statuses = [(await post(session, url, CHAT))[0] for _ in range(11)]
            _, headers = await post(session, url, CHAT)
        stats = server.stats
    assert statuses == [200] * 10 + [429]
    assert stats.max_accepted_in(1.0) == 10
    # the 429 names the wait until the first call leaves the window, under a second
    assert 0 < float(headers["retry-after-ms"]) <= 1000
    # headers on the per-minute basis, as OpenAI reports them: 600 less the 10 taken
    assert headers["x-ratelimit-limit-requests"] == "600"
    assert 589 <= int(headers["x-ratelimit-remaining-requests"]) <= 591


async def test_bucket_is_still_the_default_and_allows_its_burst_plus_refill():
    async with LoopbackServer(models=SERVED, rpm=600, burst_seconds=1.5) as server:
        async with aiohttp.ClientSession() as session:
            url = server.openai_base_url + "/chat/completions"
            statuses = [(await post(session, url, CHAT))[0] for _ in range(16)]
    assert statuses[:15] == [200] * 15  # a bucket of 1.5 s lets 15 through at once; a sliding second 10


def test_sliding_window_holds_per_second_and_per_minute_on_a_clock():
    window = SlidingWindow(120)  # 2 in any second, 120 in any minute
    taken = []
    for tick in range(0, 70_000, 50):  # a call offered every 50 ms for 70 s
        now = tick / 1000
        window.refill(now)
        if window.wait(1.0) == 0.0:
            window.take(1.0)
            taken.append(now)
    assert all(b - a >= 1.0 - 1e-9 for a, b in zip(taken, taken[2:]))  # never 3 in a second
    assert all(b - a >= 60.0 - 1e-9 for a, b in zip(taken, taken[120:]))
    assert len(taken) >= 120  # ...and it does not starve


def test_sliding_window_wait_is_until_enough_leaves_and_big_calls_fit_an_empty_second():
    window = SlidingWindow(600)  # 10 a second
    window.refill(0.0)
    window.take(4.0)
    window.refill(0.3)
    window.take(6.0)
    window.refill(0.5)
    assert window.wait(4.0) == pytest.approx(0.5)   # the 4 taken at 0.0 leave at 1.0
    assert window.wait(5.0) == pytest.approx(0.8)   # the 6 taken at 0.3 as well
    assert window.wait(50.0) == pytest.approx(0.8)  # bigger than a second's share: an empty second
    window.refill(1.3)
    assert window.wait(50.0) == 0.0


def test_tpm_counts_prompt_plus_max_tokens_at_admission():
    limits = RateLimits(None, None, None, 1.0, tpm=6000, window="sliding")  # 100 tokens a second
    assert limits.admit(30, 0.0, max_tokens=60) == (0.0, "")
    wait, which = limits.admit(30, 0.1, max_tokens=60)  # 90 + 90 > 100
    assert which == "tokens" and wait == pytest.approx(0.9)
    assert limits.admit(5, 0.1, max_tokens=5)[0] == 0.0
    with pytest.raises(ValueError, match="window"):
        RateLimits(60, None, None, 1.0, window="fixed")


async def test_tpm_server_refuses_on_max_tokens_and_reports_it_as_the_token_limit():
    body = {**CHAT, "max_tokens": 80}
    async with LoopbackServer(models=SERVED, tpm=6000, window="sliding") as server:  # 100 tokens a second
        async with aiohttp.ClientSession() as session:
            url = server.openai_base_url + "/chat/completions"
            first, headers = await post(session, url, body)
            second, _ = await post(session, url, body)
            small, _ = await post(session, url, {**CHAT, "max_tokens": 4})
    assert (first, second, small) == (200, 429, 200)
    assert headers["x-ratelimit-limit-tokens"] == "6000"


async def test_no_rate_limit_headers_when_switched_off_but_a_429_still_names_its_wait():
    async with LoopbackServer(models=SERVED, rpm=60, window="sliding", limit_headers=False) as server:
        async with aiohttp.ClientSession() as session:
            url = server.openai_base_url + "/chat/completions"
            ok, headers = await post(session, url, CHAT)
            limited, refused = await post(session, url, CHAT)
    assert (ok, limited) == (200, 429)
    assert not [k for k in (*headers, *refused) if "ratelimit" in k]
    assert refused["retry-after"] == "1"


def test_cli_rejects_an_unknown_window_in_one_line():
    done = subprocess.run([sys.executable, "-m", "engine.loopback", "--window", "fixed"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--window" in done.stderr
