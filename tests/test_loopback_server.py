"""The loopback provider server itself: its limits hold, its faults fire as
scheduled, its replies and fine-tuning flow follow the real formats."""
from __future__ import annotations

import asyncio
import base64
import math
import os
import re
import signal
import struct
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import aiohttp
import orjson
import pytest
from multidict import CIMultiDict

from engine.loopback.server import Faults, LoopbackServer, constant, go_duration, hashed_embedding, lognormal, uniform
from engine.tokens import count_tokens
from providers.http_errors import retry_after

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["m", "c", "e"]

REPO = Path(__file__).resolve().parents[1]
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
MESSAGES = {"model": "c", "max_tokens": 100, "messages": [{"role": "user", "content": "hello"}]}


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict, CIMultiDict]:
    async with session.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}) as resp:
        return resp.status, orjson.loads(await resp.read()), resp.headers.copy()


async def hammer(url: str, body: dict, seconds: float, workers: int = 8) -> list[int]:
    """Send calls back to back (no waiting on 429) for `seconds`; statuses."""
    statuses: list[int] = []
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:
        async def worker():
            while time.monotonic() < deadline:
                status, _, _ = await post(session, url, body)
                statuses.append(status)
                if status == 429:
                    await asyncio.sleep(0.002)
        await asyncio.gather(*(worker() for _ in range(workers)))
    return statuses


# -- rate limits --------------------------------------------------------------------------

async def test_rpm_limit_holds_over_any_window():
    rpm, seconds = 1200, 1.5  # 20 calls/s; the bucket holds one second: 20
    async with LoopbackServer(models=SERVED, rpm=rpm) as server:
        statuses = await hammer(server.openai_base_url + "/chat/completions", CHAT, seconds)
        stats = server.stats
    accepted = len(stats.accepted_times)
    assert statuses.count(200) == accepted and statuses.count(429) == stats.rate_limited > 0
    for window in (0.25, 0.5, 1.0):
        assert stats.max_accepted_in(window) <= 20 + rpm / 60 * window + 1, window
    # ...and it does not starve either: the full burst, then the refill, got through (how close to
    # the rate a client gets is benchmarks/limits_bench.py's: a loaded host sends less).
    assert accepted > 20 and stats.accepted_times[-1] - stats.accepted_times[19] > 0


async def test_input_tpm_limit_holds_and_big_prompts_leave_a_debt():
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 160}]}  # 40 tokens
    async with LoopbackServer(models=SERVED, input_tpm=6000) as server:  # 100 tokens/s
        await hammer(server.openai_base_url + "/chat/completions", body, 1.0)
        stats = server.stats
    assert stats.max_accepted_in(1.0) * 40 <= 100 + 100 * 1.0 + 40
    assert len(stats.accepted_times) >= 3

    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 400}]}  # 100 tokens > bucket of 10
    async with LoopbackServer(models=SERVED, input_tpm=600) as server, aiohttp.ClientSession() as session:
        first, _, _ = await post(session, server.openai_base_url + "/chat/completions", big)
        second, error, headers = await post(session, server.openai_base_url + "/chat/completions", big)
    assert (first, second) == (200, 429)
    assert error["error"]["code"] == "rate_limit_exceeded" and error["error"]["type"] == "tokens"
    assert retry_after(headers) == pytest.approx(10.0, abs=0.1)  # 90 tokens of debt + 10 at 10/s
    assert headers["retry-after"] == "10"


async def test_output_tpm_is_charged_with_generated_tokens():
    async with LoopbackServer(models=SERVED, output_tpm=600, reply=lambda api, body: "y" * 160) as server:  # 10 tok/s, 40/reply
        async with aiohttp.ClientSession() as session:
            url = server.anthropic_base_url + "/v1/messages"
            start = time.monotonic()
            first, reply, _ = await post(session, url, MESSAGES)
            second, error, headers = await post(session, url, MESSAGES)
            between = time.monotonic() - start  # refilling at 10/s meanwhile (long on a loaded host)
    assert first == 200 and reply["usage"]["output_tokens"] == 40
    assert second == 429 and error == {"type": "error", "error": {"type": "rate_limit_error",
                                                                  "message": error["error"]["message"]}}
    assert 3.0 - between - 0.01 <= retry_after(headers) <= 3.0 + 0.01  # 30 tokens of debt at 10/s, less the refill
    # The headers report the minute's budget, as the APIs do: 600 less the 40 spent (the 429
    # comes from the one-second enforcement, with budget left).
    assert 560 <= int(headers["anthropic-ratelimit-output-tokens-remaining"]) <= 562


async def test_every_reply_carries_its_apis_rate_limit_headers():
    async with LoopbackServer(models=SERVED, rpm=600, input_tpm=60_000, output_tpm=6000) as server:
        async with aiohttp.ClientSession() as session:
            _, _, openai_headers = await post(session, server.openai_base_url + "/chat/completions", CHAT)
            _, _, embed_headers = await post(session, server.openai_base_url + "/embeddings",
                                             {"model": "e", "input": "hi"})
            _, _, anthropic_headers = await post(session, server.anthropic_base_url + "/v1/messages", MESSAGES)
    for headers, calls_so_far in ((openai_headers, 1), (embed_headers, 2)):
        assert headers["x-ratelimit-limit-requests"] == "600" and headers["x-ratelimit-limit-tokens"] == "60000"
        # what is left of the minute's 600 (the budget refills at 10/s)
        assert 600 - calls_so_far <= int(headers["x-ratelimit-remaining-requests"]) <= 600 - calls_so_far + 1
        assert headers["x-ratelimit-reset-requests"].endswith("ms") and "x-request-id" in headers
    assert anthropic_headers["anthropic-ratelimit-requests-limit"] == "600"
    assert anthropic_headers["anthropic-ratelimit-input-tokens-limit"] == "60000"
    assert anthropic_headers["anthropic-ratelimit-output-tokens-limit"] == "6000"
    assert anthropic_headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    assert "request-id" in anthropic_headers and "x-ratelimit-limit-requests" not in anthropic_headers


def test_go_duration_format():
    assert [go_duration(s) for s in (0.02, 1.5, 360.0, 61.25)] == ["20ms", "1.5s", "6m0s", "1m1.25s"]
    assert [go_duration(s) for s in (0.0, 0.0004, 3600.0, 3725.5, 119.9996, 59.9999)] == [
        "0s", "0s", "1h0m0s", "1h2m5.5s", "2m0s", "1m0s"]
    grammar = re.compile(r"^(\d+(\.\d+)?h)?(\d+(\.\d+)?m)?(\d+(\.\d+)?s)?(\d+(\.\d+)?ms)?$")
    assert all(grammar.match(go_duration(s / 7)) for s in range(0, 100_000, 37))


async def test_rate_limit_headers_are_exactly_the_providers_families():
    async with LoopbackServer(models=SERVED, rpm=60, input_tpm=6000, output_tpm=600) as server, aiohttp.ClientSession() as session:
        wall = time.time()
        _, _, openai_headers = await post(session, server.openai_base_url + "/chat/completions", CHAT)
        status, _, limited = await post(session, server.anthropic_base_url + "/v1/messages", MESSAGES)
        after = time.time()
    names = {k.lower() for k in openai_headers if k.lower().startswith("x-ratelimit-")}
    assert names == {f"x-ratelimit-{kind}-{what}" for kind in ("limit", "remaining", "reset")
                     for what in ("requests", "tokens")}
    assert openai_headers["x-ratelimit-limit-requests"] == "60" and openai_headers["x-ratelimit-limit-tokens"] == "6000"
    assert openai_headers["x-ratelimit-remaining-requests"] == "59"  # the spec's example: limit 60, 59 left
    assert openai_headers["x-ratelimit-reset-requests"] == "1s"  # one request at 1/s: full again in a second
    assert int(openai_headers["openai-processing-ms"]) >= 0
    assert status == 429 and limited["retry-after"] == "1" and int(limited["retry-after-ms"]) <= 1000
    families = ("requests", "tokens", "input-tokens", "output-tokens")
    names = {k.lower() for k in limited if k.lower().startswith("anthropic-ratelimit-")}
    assert names == {f"anthropic-ratelimit-{f}-{what}" for f in families for what in ("limit", "remaining", "reset")}
    # Refused by the one-second enforcement (1 request/s) with 59 of the minute's 60 left (a
    # refused request is not charged): the headers report the budget, as the APIs do.
    assert limited["anthropic-ratelimit-requests-remaining"] == "59"
    # "tokens" is the tighter of input and output: the first reply spent a few of the 600 output
    # tokens, a smaller share than its few of the 6000 input tokens.
    assert limited["anthropic-ratelimit-tokens-limit"] == limited["anthropic-ratelimit-output-tokens-limit"] == "600"
    assert limited["anthropic-ratelimit-tokens-remaining"] == limited["anthropic-ratelimit-output-tokens-remaining"]
    assert int(limited["anthropic-ratelimit-output-tokens-remaining"]) < 600
    for family in families:
        reset = datetime.fromisoformat(limited[f"anthropic-ratelimit-{family}-reset"].replace("Z", "+00:00"))
        assert limited[f"anthropic-ratelimit-{family}-reset"].endswith("Z") and reset.tzinfo is not None
        assert wall - 1 <= reset.timestamp() <= after + 3  # absolute: when full, from the time of the reply


# -- faults and latency -------------------------------------------------------------------

def test_faults_follow_the_schedule_then_the_seeded_rates():
    def draws(seed):
        faults = Faults(schedule=["503", None, "reset"], rates={"500": 0.2, "stall": 0.1}, seed=seed)
        return [faults.pick() for _ in range(2003)]

    first = draws(1)
    assert first[:3] == ["503", None, "reset"]
    assert first == draws(1) and first != draws(2)
    assert 0.15 < first[3:].count("500") / 2000 < 0.25 and 0.06 < first[3:].count("stall") / 2000 < 0.14
    assert Faults.first(2, "529").schedule == ["529", "529"]
    with pytest.raises(ValueError, match="unknown fault"):
        Faults(schedule=["418"])
    with pytest.raises(ValueError, match="sum to at most 1"):
        Faults(rates={"500": 0.7, "503": 0.6})


async def test_first_n_calls_fail_in_each_apis_error_shape():
    async with LoopbackServer(models=SERVED, faults=Faults.first(2, "529")) as server, aiohttp.ClientSession() as session:
        status1, body1, _ = await post(session, server.openai_base_url + "/chat/completions", CHAT)
        status2, body2, _ = await post(session, server.anthropic_base_url + "/v1/messages", MESSAGES)
        status3, _, _ = await post(session, server.anthropic_base_url + "/v1/messages", MESSAGES)
        stats = server.stats
    assert (status1, status2, status3) == (529, 529, 200)
    assert body1["error"]["type"] == "server_error" and body1["error"]["message"]
    assert body2 == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert stats.by_status == {529: 2, 200: 1} and stats.faults == {"529": 2}
    assert stats.by_path == {"/v1/chat/completions": 1, "/v1/messages": 2}


async def test_a_stalled_call_ends_when_its_client_leaves():
    async with LoopbackServer(models=SERVED, faults=Faults.first(1, "stall")) as server:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.2)) as session:
            with pytest.raises(asyncio.TimeoutError):
                await post(session, server.openai_base_url + "/chat/completions", CHAT)
        for _ in range(6000):  # the server sees its client leave
            if server.stats.in_flight == 0:
                break
            await asyncio.sleep(0.01)
        assert server.stats.in_flight == 0 and server.stats.faults["stall"] == 1
        await asyncio.wait_for(server.close(), 120)  # not the stall's hour (the deadline only stops a hang)


def test_latency_helpers_are_seeded():
    assert constant(0.05)() == 0.05
    a, b = uniform(0.1, 0.2, seed=3), uniform(0.1, 0.2, seed=3)
    values = [a() for _ in range(100)]
    assert values == [b() for _ in range(100)] and all(0.1 <= v <= 0.2 for v in values)
    latency = lognormal(0.05, 0.5, seed=1)
    draws = sorted(latency() for _ in range(2001))
    assert 0.04 < draws[1000] < 0.06 and draws[-1] > 0.1


async def test_latency_delays_replies_and_calls_overlap():
    delays: list[float] = []

    def latency() -> float:  # each reply's wait, as the server draws it
        delays.append(0.1)
        return 0.1

    async with LoopbackServer(models=SERVED, latency=latency) as server, aiohttp.ClientSession() as session:
        results = await asyncio.gather(*(post(session, server.openai_base_url + "/chat/completions", CHAT)
                                         for _ in range(10)))
        assert server.stats.max_in_flight == 10  # all ten waiting at once: overlapping, not in turn
    assert [r[0] for r in results] == [200] * 10 and delays == [0.1] * 10


# -- replies --------------------------------------------------------------------------------

async def test_embeddings_float_and_base64_agree():
    texts = ["the cat sat", "a dog ran"]
    async with LoopbackServer(models=SERVED, embed_dim=16) as server, aiohttp.ClientSession() as session:
        url = server.openai_base_url + "/embeddings"
        _, floats, _ = await post(session, url, {"model": "e", "input": texts})
        _, packed, _ = await post(session, url, {"model": "e", "input": texts, "encoding_format": "base64"})
        _, wide, _ = await post(session, url, {"model": "e", "input": "the cat", "dimensions": 128})
        status, error, _ = await post(session, url, {"model": "e", "input": []})
    assert [d["embedding"] for d in floats["data"]] == [hashed_embedding(t, 16) for t in texts]
    for item, text in zip(packed["data"], texts):
        decoded = struct.unpack("<16f", base64.b64decode(item["embedding"]))
        assert decoded == pytest.approx(hashed_embedding(text, 16), abs=1e-6)
    assert len(wide["data"][0]["embedding"]) == 128
    assert math.isclose(sum(x * x for x in floats["data"][0]["embedding"]), 1.0)
    assert status == 400 and error["error"]["param"] == "input"


async def test_anthropic_requests_are_validated_like_the_real_api():
    async with LoopbackServer(models=SERVED) as server, aiohttp.ClientSession() as session:
        url = server.anthropic_base_url + "/v1/messages"
        no_max, body1, _ = await post(session, url, {"model": "c", "messages": MESSAGES["messages"]})
        system_role, body2, _ = await post(session, url, {**MESSAGES, "messages": [
            {"role": "system", "content": "s"}, *MESSAGES["messages"]]})
        ok, reply, _ = await post(session, url, {**MESSAGES, "system": "be short"})
    assert (no_max, system_role, ok) == (400, 400, 200)
    assert body1["error"]["type"] == body2["error"]["type"] == "invalid_request_error"
    assert reply["type"] == "message" and reply["content"][0]["type"] == "text"
    assert reply["usage"]["input_tokens"] == math.ceil(len("hello") / 4) + math.ceil(len("be short") / 4)


async def test_cl100k_token_counting():
    text = "Episodic memory lets us recall events in time and space."
    async with LoopbackServer(models=SERVED, tokens="cl100k") as server, aiohttp.ClientSession() as session:
        _, reply, _ = await post(session, server.openai_base_url + "/chat/completions",
                                 {"model": "m", "messages": [{"role": "user", "content": text}]})
    assert reply["usage"]["prompt_tokens"] == count_tokens(text)
    assert reply["usage"]["completion_tokens"] == count_tokens(reply["choices"][0]["message"]["content"])
    with pytest.raises(ValueError):
        LoopbackServer(models=SERVED, tokens="words")


# -- fine-tuning ----------------------------------------------------------------------------

def training_jsonl(n: int) -> bytes:
    line = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    return b"\n".join(orjson.dumps(line) for _ in range(n)) + b"\n"


async def finetune_over_http(server: LoopbackServer, content: bytes) -> list[dict]:
    async with aiohttp.ClientSession() as session:
        form = aiohttp.FormData()
        form.add_field("purpose", "fine-tune")
        form.add_field("file", content, filename="train.jsonl", content_type="application/jsonl")
        async with session.post(server.openai_base_url + "/files", data=form) as resp:
            uploaded = await resp.json()
        status, job, _ = await post(session, server.openai_base_url + "/fine_tuning/jobs",
                                    {"model": "gpt-4o-mini", "training_file": uploaded["id"]})
        assert status == 200 and uploaded["bytes"] == len(content)
        states = [job]
        for _ in range(3):
            async with session.get(f"{server.openai_base_url}/fine_tuning/jobs/{job['id']}") as resp:
                states.append(await resp.json())
        return states


async def test_finetune_job_goes_queued_running_succeeded():
    async with LoopbackServer(models=SERVED, finetune_polls=2) as server:
        states = await finetune_over_http(server, training_jsonl(10))
    assert [s["status"] for s in states] == ["queued", "running", "succeeded", "succeeded"]
    assert states[-1]["fine_tuned_model"] == f"ft:gpt-4o-mini:tulving::{states[0]['id']}"


async def test_finetune_job_with_too_few_examples_fails():
    async with LoopbackServer(models=SERVED, finetune_polls=1) as server:
        states = await finetune_over_http(server, training_jsonl(3))
        async with aiohttp.ClientSession() as session:
            async with session.get(server.openai_base_url + "/fine_tuning/jobs/ftjob-nope") as resp:
                missing = resp.status
    assert states[1]["status"] == "failed" and states[1]["fine_tuned_model"] is None
    assert "at least 10 examples" in states[1]["error"]["message"] and missing == 404


# -- standalone ------------------------------------------------------------------------------

def test_standalone_server_serves_until_terminated():
    process = subprocess.Popen(
        [sys.executable, "-m", "engine.loopback", "--port", "0", "--rpm", "60", "--fail-first", "1:503",
         "--models", ",".join(SERVED)],
        cwd=REPO, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        urls = dict(process.stdout.readline().strip().split("=", 1) for _ in range(2))

        async def calls():
            async with aiohttp.ClientSession() as session:
                statuses = [(await post(session, urls["openai_base_url"] + "/chat/completions", CHAT))[0]
                            for _ in range(3)]
                async with session.get(urls["anthropic_base_url"] + "/loopback/stats") as resp:
                    return statuses, await resp.json()

        statuses, stats = asyncio.run(calls())
        assert statuses == [503, 200, 429]
        assert stats["by_status"] == {"503": 1, "200": 1, "429": 1} and stats["rate_limited"] == 1
        assert stats["accepted"] == stats["max_accepted_per_second"] == 1
        assert urls["anthropic_base_url"] + "/v1" == urls["openai_base_url"]
    finally:
        process.send_signal(signal.SIGTERM)
        tail = process.communicate(timeout=10)[0]
    assert process.returncode == 0 and "served 3 calls" in tail


def test_standalone_rejects_bad_arguments():
    out = subprocess.run([sys.executable, "-m", "engine.loopback", "--fault", "teapot=0.5"],
                         cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 2 and "unknown fault kind" in out.stderr and "\n" == out.stderr[-1]


def test_standalone_knobs_for_streams_caches_and_batches():
    process = subprocess.Popen(
        [sys.executable, "-m", "engine.loopback", "--ttft-ms", "200", "--token-delay-ms", "1", "--models", ",".join(SERVED),
         "--cache-min-tokens", "8", "--batch-polls", "1", "--batch-fail-share", "1", "--batch-in-order"],
        cwd=REPO, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        urls = dict(process.stdout.readline().strip().split("=", 1) for _ in range(2))

        async def calls():
            async with aiohttp.ClientSession() as session:
                start = time.perf_counter()
                async with session.post(urls["openai_base_url"] + "/chat/completions",
                                        json={**CHAT, "stream": True}) as resp:
                    first = None
                    async for line in resp.content:
                        if b'"content":"' in line and b'"content":""' not in line:
                            first = first or time.perf_counter() - start
                system = [{"type": "text", "text": "word " * 20, "cache_control": {"type": "ephemeral"}}]
                replies = [await post(session, urls["anthropic_base_url"] + "/v1/messages",
                                      {**MESSAGES, "system": system}) for _ in range(2)]
                requests = [{"custom_id": f"r{i}", "params": MESSAGES} for i in range(3)]
                _, batch, _ = await post(session, urls["anthropic_base_url"] + "/v1/messages/batches",
                                         {"requests": requests})
                async with session.get(f"{urls['anthropic_base_url']}/v1/messages/batches/{batch['id']}") as resp:
                    ended = await resp.json()
                async with session.get(ended["results_url"]) as resp:
                    results = [orjson.loads(line) for line in (await resp.read()).splitlines()]
                async with session.get(urls["anthropic_base_url"] + "/loopback/stats") as resp:
                    stats = await resp.json()
                return first, replies, ended, results, stats

        first, replies, ended, results, stats = asyncio.run(calls())
        assert stats["streams"] == 1 and stats["streams_cancelled"] == 0
        assert stats["cache_write_tokens"] == stats["cache_read_tokens"] == 25
        assert stats["batch_requests"] == {"injected_500": 3} and stats["batch_input_tokens"] == 0
        assert first >= 0.2  # the 200 ms time to first token
        assert replies[0][1]["usage"]["cache_creation_input_tokens"] == 25
        assert replies[1][1]["usage"]["cache_read_input_tokens"] == 25
        assert ended["processing_status"] == "ended" and ended["request_counts"]["errored"] == 3
        assert [r["custom_id"] for r in results] == ["r0", "r1", "r2"]  # --batch-in-order
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=10)
    assert process.returncode == 0
