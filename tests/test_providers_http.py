"""The OpenAI- and Anthropic-format providers over real HTTP on loopback:
normalised replies, wire format, and every failure classified right."""
from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path

import pytest
from aiohttp import web

from engine.loopback.server import Faults, LoopbackServer, default_reply, hashed_embedding
from providers import make_provider
from providers.anthropic_http import AnthropicProvider
from providers.base import (
    AUTH,
    BAD_REPLY,
    BAD_REQUEST,
    CONNECTION,
    CONTENT_FILTER,
    OVERLOADED,
    PROMPT_TOO_LONG,
    RATE_LIMITED,
    TIMEOUT,
    EndpointSpec,
    ProviderError,
)
from providers.http_errors import parse_duration, redact, retry_after, status_error
from providers.openai_http import OpenAIProvider

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["gpt-x", "m1", "m", "emb", "claude-x", "c", "e", "x"]

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-test-VERYSECRET-0123456789abcdef"
USER = [{"role": "user", "content": "Where did Maya meet Sam on March 3?"}]


def openai(server: LoopbackServer, key: str | None = None, **spec) -> OpenAIProvider:
    return OpenAIProvider(EndpointSpec(name="lo-openai", kind="openai", base_url=server.openai_base_url, **spec), key)


def anthropic(server: LoopbackServer, key: str | None = None, **spec) -> AnthropicProvider:
    return AnthropicProvider(EndpointSpec(name="lo-anthropic", kind="anthropic",
                                          base_url=server.anthropic_base_url, **spec), key)


async def fails(call) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await call
    return info.value


class Recorder:
    """A reply function that keeps the bodies the server received."""

    def __init__(self, text: str | tuple[str, str] | None = None):
        self.bodies: list[dict] = []
        self.text = text

    def __call__(self, api: str, body: dict):
        self.bodies.append(body)
        return default_reply(api, body) if self.text is None else self.text


# -- normal replies -------------------------------------------------------------------------

async def test_openai_chat_reply_is_normalised():
    async with LoopbackServer(in_process=True, models=SERVED) as server:
        provider = openai(server, KEY)
        try:
            result = await provider.chat("gpt-x", USER, params={"temperature": 1.0}, timeout=5)
        finally:
            await provider.aclose()
    assert result.text == default_reply("openai", {"messages": USER})
    assert result.finish_reason == "stop"
    assert result.input_tokens == math.ceil(len(USER[0]["content"]) / 4)
    assert result.output_tokens == math.ceil(len(result.text) / 4)
    assert result.request_id.startswith("req_")
    assert result.latency > 0


async def test_openai_chat_sends_standard_body_and_passes_extra_params():
    recorder = Recorder()
    async with LoopbackServer(in_process=True, models=SERVED, reply=recorder) as server:
        provider = openai(server)
        messages = [{"role": "system", "content": "Be brief."}, *USER]
        params = {"temperature": 0.5, "max_tokens": 50, "seed": 7, "stop": ["\n\n"], "top_p": 0.9,
                  "max_completion_tokens": 60}
        try:
            await provider.chat("m1", tuple(messages), params=params, timeout=5)
        finally:
            await provider.aclose()
    assert recorder.bodies == [{"model": "m1", "messages": messages, **params}]


async def test_openai_finish_reasons_length_stop_and_content_filter():
    async with LoopbackServer(in_process=True, models=SERVED, reply=lambda api, body: "one two three four five six seven eight nine ten") as server:
        provider = openai(server)
        try:
            cut = await provider.chat("m", USER, params={"max_tokens": 3}, timeout=5)
            stopped = await provider.chat("m", USER, params={"stop": ["four"]}, timeout=5)
        finally:
            await provider.aclose()
    assert cut.finish_reason == "length" and cut.output_tokens <= 3 and cut.text
    assert stopped.finish_reason == "stop" and stopped.text == "one two three "
    async with LoopbackServer(in_process=True, models=SERVED, reply=lambda api, body: ("partial answer", "content_filter")) as server:
        provider = openai(server)
        try:
            filtered = await provider.chat("m", USER, params={}, timeout=5)
        finally:
            await provider.aclose()
    # A filtered finish is a result, not an error: the text is kept.
    assert (filtered.text, filtered.finish_reason) == ("partial answer", "content_filter")


async def test_openai_embeddings_vectors_match_texts():
    texts = ["Maya met Sam in Paris", "the weather in Oslo", "Sam met Maya in Paris"]
    async with LoopbackServer(in_process=True, models=SERVED, embed_dim=32) as server:
        provider = openai(server)
        try:
            result = await provider.embed("emb", texts, timeout=5)
        finally:
            await provider.aclose()
    assert result.vectors == [hashed_embedding(t, 32) for t in texts]
    assert result.input_tokens == sum(math.ceil(len(t) / 4) for t in texts)
    def dot(a, b):
        return sum(x * y for x, y in zip(a, b))
    assert dot(result.vectors[0], result.vectors[2]) > dot(result.vectors[0], result.vectors[1])


async def test_openai_embeddings_are_put_back_in_input_order():
    # A compatible server may list the vectors in any order: `index` decides.
    async def shuffled(request: web.Request) -> web.Response:
        body = await request.json()
        data = [{"object": "embedding", "index": i, "embedding": [float(i), float(len(t))]}
                for i, t in enumerate(body["input"])]
        return web.json_response({"object": "list", "data": data[::-1], "model": body["model"],
                                  "usage": {"prompt_tokens": 3, "total_tokens": 3}})

    async with serve_app({"/v1/embeddings": shuffled}) as base_url:
        provider = OpenAIProvider(EndpointSpec(name="x", kind="openai", base_url=base_url))
        try:
            result = await provider.embed("e", ["a", "bb", "ccc"], timeout=5)
        finally:
            await provider.aclose()
    assert result.vectors == [[0.0, 1.0], [1.0, 2.0], [2.0, 3.0]]


async def test_anthropic_reply_is_normalised_and_body_translated():
    recorder = Recorder()
    async with LoopbackServer(in_process=True, models=SERVED, reply=recorder, api_keys=[KEY]) as server:
        # The version that still takes sampling parameters (the current one, 2026-10-21, refuses them).
        provider = anthropic(server, KEY, options={"anthropic_version": "2023-06-01"})
        messages = [{"role": "system", "content": "Rule one."}, {"role": "system", "content": "Rule two."}, *USER]
        try:
            result = await provider.chat("claude-x", messages, params={"temperature": 1.0, "seed": 3,
                                                                     "stop": "STOP", "top_k": 5}, timeout=5)
        finally:
            await provider.aclose()
    assert recorder.bodies == [{"model": "claude-x", "messages": USER, "system": "Rule one.\n\nRule two.",
                                "temperature": 1.0, "top_k": 5, "max_tokens": 4096, "stop_sequences": ["STOP"]}]
    assert result.text == default_reply("anthropic", {"messages": USER})
    assert result.finish_reason == "stop"
    assert result.input_tokens == math.ceil(len(USER[0]["content"]) / 4) + math.ceil(len("Rule one.\n\nRule two.") / 4)
    assert result.output_tokens > 0 and result.request_id.startswith("req_")


async def test_drop_params_option_keeps_named_params_off_the_wire():
    recorder = Recorder()
    async with LoopbackServer(in_process=True, models=SERVED, reply=recorder) as server:
        providers = [openai(server, options={"drop_params": ["seed"]}),
                     anthropic(server, options={"drop_params": ["temperature"]})]
        try:
            for provider in providers:
                await provider.chat("m", USER, params={"temperature": 1.0, "seed": 5, "max_tokens": 9}, timeout=5)
        finally:
            for provider in providers:
                await provider.aclose()
    assert recorder.bodies[0] == {"model": "m", "messages": USER, "temperature": 1.0, "max_tokens": 9}
    assert recorder.bodies[1] == {"model": "m", "messages": USER, "max_tokens": 9}


async def test_anthropic_finish_reasons():
    async with LoopbackServer(in_process=True, models=SERVED, reply=lambda api, body: "alpha beta gamma delta epsilon zeta eta theta") as server:
        provider = anthropic(server)
        try:
            cut = await provider.chat("c", USER, params={"max_tokens": 2}, timeout=5)
            stopped = await provider.chat("c", USER, params={"stop": ["gamma"]}, timeout=5)
        finally:
            await provider.aclose()
    assert cut.finish_reason == "length" and cut.output_tokens <= 2
    assert (stopped.text, stopped.finish_reason) == ("alpha beta ", "stop")


async def test_anthropic_text_is_the_concatenated_text_blocks():
    async def messages(request: web.Request) -> web.Response:
        return web.json_response(
            {"id": "msg_1", "type": "message", "role": "assistant", "model": "c",
             "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Hello, "},
                         {"type": "text", "text": "world."}],
             "stop_reason": "max_tokens", "stop_sequence": None, "usage": {"input_tokens": 4, "output_tokens": 2}})

    async with serve_app({"/v1/messages": messages}) as base_url:
        provider = AnthropicProvider(EndpointSpec(name="a", kind="anthropic", base_url=base_url.removesuffix("/v1")))
        try:
            result = await provider.chat("c", USER, params={}, timeout=5)
        finally:
            await provider.aclose()
    assert (result.text, result.finish_reason, result.request_id) == ("Hello, world.", "length", "msg_1")
    assert (result.input_tokens, result.output_tokens) == (4, 2)


async def test_anthropic_has_no_embeddings():
    provider = AnthropicProvider(EndpointSpec(name="a", kind="anthropic"))
    assert (await fails(provider.embed("x", ["a"], timeout=1))).kind == BAD_REQUEST


async def test_registry_builds_both_providers():
    assert isinstance(make_provider(EndpointSpec(name="o", kind="openai"), None), OpenAIProvider)
    assert isinstance(make_provider(EndpointSpec(name="a", kind="anthropic"), "k"), AnthropicProvider)


# -- headers and keys -------------------------------------------------------------------------

async def test_keys_go_in_the_right_header_and_only_when_set():
    seen: list[dict] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({"id": "x", "choices": [{"message": {"content": ""}, "finish_reason": "stop"}]})

    async with serve_app({"/v1/chat/completions": record, "/v1/messages": record}) as base_url:
        spec = dict(kind="openai", base_url=base_url)
        for key in (KEY, None):
            provider = OpenAIProvider(EndpointSpec(name="o", **spec), key)
            result = await provider.chat("m", USER, params={}, timeout=5)
            await provider.aclose()
            assert result.text == "" and result.request_id == "x"  # an empty answer the provider finished
        provider = AnthropicProvider(EndpointSpec(name="a", kind="anthropic", base_url=base_url.removesuffix("/v1")),
                                     KEY)
        with pytest.raises(ProviderError):  # an OpenAI-shaped reply is not a Messages reply
            await provider.chat("m", USER, params={}, timeout=5)
        await provider.aclose()
    assert seen[0]["Authorization"] == f"Bearer {KEY}" and "x-api-key" not in seen[0]
    assert "Authorization" not in seen[1]
    assert seen[2]["x-api-key"] == KEY and seen[2]["anthropic-version"] == "2026-10-21"  # the current version (checked 2026-11-28)
    assert "Authorization" not in seen[2]
    assert all(h["Content-Type"] == "application/json" for h in seen)


async def test_401_is_auth_and_the_echoed_key_never_appears():
    wrong = "sk-wrong-ALSOSECRET-9876543210"
    async with LoopbackServer(in_process=True, models=SERVED, api_keys=[KEY]) as server:
        errors = []
        for make in (openai, anthropic):
            provider = make(server, wrong)
            try:
                errors.append(await fails(provider.chat("m", USER, params={}, timeout=5)))
            finally:
                await provider.aclose()
        assert server.stats.by_status[401] == 2
    for error in errors:
        assert error.kind == AUTH and error.status == 401
        for text in (str(error), repr(error), json.dumps(error.to_dict()), error.message):
            assert wrong not in text and "ALSOSECRET" not in text and "\n" not in text


async def test_redact_scrubs_key_shapes():
    line = redact(f"bad key {KEY}\nAuthorization: Bearer abc.def x-api-key: sk-ant-123456789", KEY)
    assert KEY not in line and "abc.def" not in line and "sk-ant-123456789" not in line and "\n" not in line
    assert len(redact("x" * 5000, None)) <= 300


# -- failures ---------------------------------------------------------------------------------

async def test_429_is_rate_limited_with_the_servers_wait():
    async with LoopbackServer(in_process=True, models=SERVED, rpm=6) as server:  # one call per 10 s: the second is refused
        provider = openai(server)
        try:
            start = time.monotonic()
            await provider.chat("m", USER, params={}, timeout=60)
            error = await fails(provider.chat("m", USER, params={}, timeout=60))
            between = time.monotonic() - start  # the bucket refills meanwhile (long on a loaded host)
        finally:
            await provider.aclose()
    assert error.kind == RATE_LIMITED and error.status == 429 and error.retryable
    assert 10.0 - between - 0.002 <= error.retry_after <= 10.0  # 10 s less what refilled meanwhile


async def test_anthropic_429_wait_comes_from_its_headers():
    async with LoopbackServer(in_process=True, models=SERVED, rpm=6) as server:  # one call per 10 s
        provider = anthropic(server)
        try:
            start = time.monotonic()
            await provider.chat("m", USER, params={}, timeout=60)
            error = await fails(provider.chat("m", USER, params={}, timeout=60))
            between = time.monotonic() - start
        finally:
            await provider.aclose()
    assert error.kind == RATE_LIMITED and 10.0 - between - 0.002 <= error.retry_after <= 10.0


@pytest.mark.parametrize("fault", ["500", "502", "503", "504", "529"])
async def test_server_errors_are_overloaded(fault):
    async with LoopbackServer(in_process=True, models=SERVED, faults=Faults.first(2, fault)) as server:
        kinds = []
        for make in (openai, anthropic):
            provider = make(server)
            try:
                error = await fails(provider.chat("m", USER, params={}, timeout=5))
                kinds.append((error.kind, error.status))
            finally:
                await provider.aclose()
    assert kinds == [(OVERLOADED, int(fault))] * 2


async def test_stall_past_the_timeout_is_timeout():
    async with LoopbackServer(in_process=True, models=SERVED, faults=Faults.first(1, "stall")) as server:
        provider = openai(server)
        try:
            error = await fails(provider.chat("m", USER, params={}, timeout=0.3))
            after = await provider.chat("m", USER, params={}, timeout=60)  # the session still works
        finally:
            await provider.aclose()
    assert error.kind == TIMEOUT and error.retryable  # the call's timeout ended it, not the hour's stall
    assert after.text


async def test_reset_and_truncated_body_are_connection_errors():
    async with LoopbackServer(in_process=True, models=SERVED, faults=Faults(schedule=["reset", "truncate", None] * 2)) as server:
        kinds = []
        for make in (openai, anthropic):
            provider = make(server)
            try:
                for _ in range(2):
                    kinds.append((await fails(provider.chat("m", USER, params={}, timeout=5))).kind)
                assert (await provider.chat("m", USER, params={}, timeout=5)).text
            finally:
                await provider.aclose()
    assert kinds == [CONNECTION] * 4


async def test_non_json_200_is_bad_reply():
    async with LoopbackServer(in_process=True, models=SERVED, faults=Faults(schedule=["bad_json", "bad_json"])) as server:
        provider = openai(server)
        try:
            chat = await fails(provider.chat("m", USER, params={}, timeout=5))
            embed = await fails(provider.embed("e", ["a"], timeout=5))
        finally:
            await provider.aclose()
    assert chat.kind == embed.kind == BAD_REPLY and chat.retryable


async def test_refused_connection_is_connection_error():
    with socket_port() as port:
        pass  # the port is now closed: nothing listens there
    provider = OpenAIProvider(EndpointSpec(name="o", kind="openai", base_url=f"http://127.0.0.1:{port}/v1"))
    try:
        assert (await fails(provider.chat("m", USER, params={}, timeout=5))).kind == CONNECTION
    finally:
        await provider.aclose()


async def test_context_length_is_prompt_too_long_for_both_apis():
    long = [{"role": "user", "content": "word " * 400}]
    async with LoopbackServer(in_process=True, models=SERVED, context_tokens=100) as server:
        errors = []
        for make in (openai, anthropic):
            provider = make(server)
            try:
                errors.append(await fails(provider.chat("m", long, params={}, timeout=5)))
                assert (await provider.chat("m", USER, params={}, timeout=5)).text  # short prompts pass
            finally:
                await provider.aclose()
    assert [(e.kind, e.status) for e in errors] == [(PROMPT_TOO_LONG, 400)] * 2
    assert not errors[0].retryable


async def test_content_policy_400_is_content_filter():
    async with LoopbackServer(in_process=True, models=SERVED, faults=Faults.first(1, "content_filter")) as server:
        provider = openai(server)
        try:
            error = await fails(provider.chat("m", USER, params={}, timeout=5))
        finally:
            await provider.aclose()
    assert (error.kind, error.status) == (CONTENT_FILTER, 400)


async def test_malformed_request_is_bad_request():
    async with LoopbackServer(in_process=True, models=SERVED) as server:
        provider = openai(server)
        try:
            error = await fails(provider.chat("", USER, params={}, timeout=5))
        finally:
            await provider.aclose()
    assert (error.kind, error.status) == (BAD_REQUEST, 400) and not error.retryable


def test_status_classification_table():
    def kind(status, body=b"", headers=None):
        return status_error(status, body, headers or {}, endpoint="e", secret=None).kind

    assert kind(401) == kind(403) == AUTH
    assert kind(404) == kind(422) == kind(400) == BAD_REQUEST
    assert kind(413) == PROMPT_TOO_LONG
    assert kind(500) == kind(502) == kind(503) == kind(504) == kind(529) == OVERLOADED
    assert kind(429, b'{"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}') == AUTH
    vllm = b'{"object": "error", "message": "This model\'s maximum context length is 4096 tokens.", "code": 400}'
    assert kind(400, vllm) == PROMPT_TOO_LONG
    llama_cpp = b'{"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it", "type": "exceed_context_size_error"}}'
    assert kind(400, llama_cpp) == PROMPT_TOO_LONG
    anthropic_long = b'{"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}}'
    assert kind(400, anthropic_long) == PROMPT_TOO_LONG
    assert kind(400, b'{"error": {"message": "x", "code": "content_filter"}}') == CONTENT_FILTER
    assert kind(400, b'{"error": "plain string error (Ollama)"}') == BAD_REQUEST
    assert kind(502, b"<html>Bad gateway</html>") == OVERLOADED


def test_retry_after_formats():
    now = 1_700_000_000.0
    assert retry_after({"retry-after": "7"}, now=now) == 7.0
    assert retry_after({"retry-after-ms": "250", "retry-after": "1"}, now=now) == 0.25
    http_date = format_datetime(datetime.fromtimestamp(now + 30, UTC), usegmt=True)
    assert retry_after({"retry-after": http_date}, now=now) == pytest.approx(30, abs=1)
    assert retry_after({"x-ratelimit-reset-requests": "6m0s", "x-ratelimit-remaining-requests": "0",
                        "x-ratelimit-reset-tokens": "20ms", "x-ratelimit-remaining-tokens": "900"}, now=now) == 360
    assert retry_after({"x-ratelimit-reset-requests": "1s", "x-ratelimit-remaining-requests": "5",
                        "x-ratelimit-reset-tokens": "1m30.5s", "x-ratelimit-remaining-tokens": "0"}, now=now) == 90.5
    reset = (datetime.fromtimestamp(now, UTC) + timedelta(seconds=12)).isoformat().replace("+00:00", "Z")
    assert retry_after({"anthropic-ratelimit-input-tokens-reset": reset,
                        "anthropic-ratelimit-input-tokens-remaining": "0"}, now=now) == pytest.approx(12)
    assert retry_after({}, now=now) is None and retry_after({"retry-after": "soon"}, now=now) is None
    assert parse_duration("1h2m3.5s") == 3723.5 and parse_duration("20ms") == 0.02 and parse_duration("x1s") is None


# -- connection pool and CPU cost ---------------------------------------------------------------

async def test_connector_caps_concurrency_at_max_concurrency():
    async with LoopbackServer(in_process=True, models=SERVED, latency=lambda: 0.02) as server:
        provider = openai(server, max_concurrency=4)
        try:
            results = await asyncio.gather(*(provider.chat("m", USER, params={}, timeout=10) for _ in range(24)))
        finally:
            await provider.aclose()
        assert len(results) == 24 and server.stats.max_in_flight == 4


async def test_a_provider_survives_successive_event_loops():
    async with LoopbackServer(in_process=True, models=SERVED) as server:
        provider = OpenAIProvider(EndpointSpec(name="o", kind="openai", base_url=server.openai_base_url))

        def successive_runs():  # e.g. two asyncio.run() calls in one program
            first = asyncio.run(provider.chat("m", USER, params={}, timeout=5))
            second = asyncio.run(provider.chat("m", USER, params={}, timeout=5))
            asyncio.run(provider.aclose())
            return first, second

        # (in a thread: the server keeps running in this test's loop meanwhile)
        first, second = await asyncio.to_thread(successive_runs)
    assert first.text == second.text != ""


def start_standalone_server(*args: str) -> tuple[subprocess.Popen, str, str]:
    process = subprocess.Popen([sys.executable, "-m", "engine.loopback", "--port", "0", "--models", ",".join(SERVED),
                                *args],
                               cwd=REPO, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    urls = dict(process.stdout.readline().strip().split("=", 1) for _ in range(2))
    return process, urls["openai_base_url"], urls["anthropic_base_url"]


async def test_standalone_server_process_serves_both_apis():
    """`python -m engine.loopback` (used by the benchmarks) serves
    the OpenAI and Anthropic formats from its own process."""
    process, openai_url, anthropic_url = start_standalone_server("--latency-ms", "1")
    try:
        openai = OpenAIProvider(EndpointSpec(name="o", kind="openai", base_url=openai_url), "sk-x")
        anthropic = AnthropicProvider(EndpointSpec(name="a", kind="anthropic", base_url=anthropic_url), "sk-y")
        first = await openai.chat("m", USER, params={"max_tokens": 16}, timeout=10)
        second = await anthropic.chat("m", USER, params={"max_tokens": 16}, timeout=10)
        await openai.aclose()
        await anthropic.aclose()
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=10)
    assert first.text and second.text
    assert "served 2 calls" in out


# -- helpers ------------------------------------------------------------------------------------

class serve_app:
    """A throwaway aiohttp app on a free port; yields its `/v1` base URL."""

    def __init__(self, routes: dict):
        self.routes = routes

    async def __aenter__(self) -> str:
        app = web.Application()
        for path, handler in self.routes.items():
            app.router.add_post(path, handler)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()


class socket_port:
    """A port that was free a moment ago."""

    def __enter__(self) -> int:
        import socket
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return self.sock.getsockname()[1]

    def __exit__(self, *exc) -> None:
        self.sock.close()


def test_a_body_is_walked_for_long_strings_before_it_is_serialised():
    """providers/base.py holds_long_string: what decides whether a body is
    serialised from a copy (http_client._body_bytes); a long string anywhere
    in it is found, in a dict, a list or a tuple, and nothing else is."""
    from providers.base import holds_long_string

    long, short = "é" * 11, "é" * 10
    for body in ({"messages": [{"role": "user", "content": long}]}, {"system": [("x", {"text": long})]}, long):
        assert holds_long_string(body, 10)
    for body in ({"messages": [{"role": "user", "content": short}], "max_tokens": 11, "stop": [short]},
                 {"n": 12345678901, "x": None, "y": 1.5, "z": True}, short, 11, None):
        assert not holds_long_string(body, 10)


async def test_a_book_sized_non_ascii_prompt_keeps_no_utf8_copy_after_it_is_sent():
    """Serialising a non-ASCII str caches a UTF-8 copy inside it for its life;
    the body is serialised from a copy, so a prompt held while in flight (and
    while the cache's writer stores it) holds the book once, not twice."""
    recorder = Recorder()
    prompt = "Chapter 1. Élodie met Zoë in Montréal.\n\n" * 5_000 + "Where did Élodie meet Zoë?"
    size = sys.getsizeof(prompt)
    async with LoopbackServer(in_process=True, models=SERVED, reply=recorder) as server:
        for provider in (openai(server), anthropic(server)):
            try:
                await provider.chat("gpt-x" if provider.kind == "openai" else "claude-x",
                                    ({"role": "user", "content": prompt},), params={"max_tokens": 5}, timeout=10)
            finally:
                await provider.aclose()
    assert [b["messages"][0]["content"] for b in recorder.bodies] == [prompt, prompt]
    assert sys.getsizeof(prompt) == size
