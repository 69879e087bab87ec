"""Tulving's OpenAI-compatible endpoint for memory systems, driven through the
official openai SDK over loopback HTTP, backed by a real Engine (the built-in
reader, the offline MiniLM embedder, or a loopback OpenAI server upstream)."""
from __future__ import annotations

import socket
from contextlib import asynccontextmanager

import aiohttp
import numpy as np
import openai
import pytest

from engine.benchmark.memory.meter import PhaseMeter
from engine.benchmark.memory.proxy import ModelEndpoint
from engine.config import Config, ConfigError
from engine.loopback.server import LoopbackServer
from engine.requests import ChatRequest, EmbedRequest
from engine.scheduler import Engine

READER, MINILM = "builtin:reader", "local:minilm"
QUESTION = [{"role": "system", "content": "Answer from the text."},
            {"role": "user", "content": "Chapter 1\n\nOn May 07, 2024, Ana met Bo at the Harbour Museum.\n\n"
                                        "Where did Ana meet Bo?"}]


@asynccontextmanager
async def endpoint_over(config: Config, cache_path: str, **engine_options):
    async with Engine(config, cache_path=cache_path, **engine_options) as engine:
        endpoint = await ModelEndpoint(engine).start()
        try:
            yield engine, endpoint
        finally:
            await endpoint.close()


def client(endpoint: ModelEndpoint, secret: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=secret, max_retries=0)


async def test_chat_through_the_sdk_is_the_engines_reply_counted_in_the_phase_and_free_on_a_rerun(tmp_path):
    cache = str(tmp_path / "cache.sqlite")
    config = Config.load()
    for run in (1, 2):
        async with endpoint_over(config, cache) as (engine, endpoint):
            meter = PhaseMeter("keywords")
            sdk = client(endpoint, endpoint.grant(meter, [READER]))
            with meter.phase("ingest"):
                reply = await sdk.chat.completions.create(model=READER, messages=QUESTION, temperature=0.0,
                                                          max_tokens=64, seed=7)
            direct = (await engine.run([ChatRequest(READER, QUESTION, temperature=0.0, max_tokens=64, seed=7)]))[0]
            await sdk.close()
        assert reply.choices[0].message.content == direct.text and reply.object == "chat.completion"
        assert reply.model == READER and reply.choices[0].finish_reason == "stop"
        assert reply.usage.prompt_tokens == direct.result.input_tokens > 0
        assert reply.usage.completion_tokens == direct.result.output_tokens
        ingest = meter.phases["ingest"]
        assert (ingest.calls, ingest.failed, set(meter.phases)) == (1, 0, {"ingest"})
        # The first run made the call (the engine's direct call joined or hit it); the rerun is served from the cache.
        assert ingest.cached == (run - 1)
        assert engine.stats.cache_hits == (1 if run == 1 else 2)
        assert meter.spending.rows()[0]["role"] == "memory keywords: ingest"


async def test_embeddings_default_base64_and_float_equal_the_engines_vectors(tmp_path):
    texts = ["Ana met Bo at the Harbour Museum.", "A storm closed the port."]
    async with endpoint_over(Config.load(), str(tmp_path / "c.sqlite")) as (engine, endpoint):
        meter = PhaseMeter("vectors")
        sdk = client(endpoint, endpoint.grant(meter, [MINILM]))
        with meter.phase("recall"):
            default = await sdk.embeddings.create(model=MINILM, input=texts)  # the SDK asks for base64
            floats = await sdk.embeddings.create(model=MINILM, input=texts, encoding_format="float")
            one = await sdk.embeddings.create(model=MINILM, input=texts[0], dimensions=384)
        direct = (await engine.run([EmbedRequest(MINILM, texts)]))[0].result.vectors
        with pytest.raises(openai.BadRequestError, match="384-dimensional"):
            await sdk.embeddings.create(model=MINILM, input=texts, dimensions=1536)
        with pytest.raises(openai.BadRequestError, match="token arrays"):
            await sdk.embeddings.create(model=MINILM, input=[[1, 2, 3]])
        await sdk.close()
    assert [len(d.embedding) for d in default.data] == [384, 384]
    assert np.allclose(np.asarray([d.embedding for d in default.data]), np.asarray(direct), atol=1e-6)
    assert [d.embedding for d in floats.data] == direct  # floats as the engine returned them
    assert one.data[0].embedding == pytest.approx(direct[0], abs=1e-6)
    assert default.usage.prompt_tokens > 0 and default.model == MINILM
    recall = meter.phases["recall"]
    assert (recall.calls, recall.cached) == (3, 1)  # the float call: the same texts, from the cache


async def test_a_stream_carries_the_same_text_and_usage_as_the_plain_reply(tmp_path):
    async with endpoint_over(Config.load(), str(tmp_path / "c.sqlite")) as (engine, endpoint):
        sdk = client(endpoint, endpoint.grant(PhaseMeter("s"), [READER]))
        plain = await sdk.chat.completions.create(model=READER, messages=QUESTION)
        chunks = [c async for c in await sdk.chat.completions.create(
            model=READER, messages=QUESTION, stream=True, stream_options={"include_usage": True})]
        await sdk.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content and text
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


async def test_requests_without_the_secret_or_for_models_not_granted_are_refused(tmp_path):
    async with endpoint_over(Config.load(), str(tmp_path / "c.sqlite")) as (engine, endpoint):
        reader_meter, embed_meter = PhaseMeter("a"), PhaseMeter("b")
        secret = endpoint.grant(reader_meter, [READER])
        other = endpoint.grant(embed_meter, [MINILM])
        for key in ("", "not-the-secret", secret[:-1], other + "x"):
            with pytest.raises(openai.AuthenticationError) as refused:
                await client(endpoint, key or "x").chat.completions.create(model=READER, messages=QUESTION)
            assert refused.value.code == "invalid_api_key" and (not key or key not in str(refused.value))
        with pytest.raises(openai.NotFoundError) as missing:  # granted to the other system only
            await client(endpoint, other).chat.completions.create(model=READER, messages=QUESTION)
        assert missing.value.code == "model_not_found"
        with pytest.raises(openai.NotFoundError):
            await client(endpoint, secret).embeddings.create(model=MINILM, input="x")
        with pytest.raises(openai.NotFoundError):  # an alias of the config, but not granted
            await client(endpoint, secret).chat.completions.create(model="builtin:judge", messages=QUESTION)
        listed = await client(endpoint, secret).models.list()
        assert [m.id for m in listed.data] == [READER]
        assert (await client(endpoint, other).models.retrieve(MINILM)).id == MINILM
        endpoint.revoke(secret)
        with pytest.raises(openai.AuthenticationError):
            await client(endpoint, secret).chat.completions.create(model=READER, messages=QUESTION)
        async with aiohttp.ClientSession() as session:  # no Authorization header at all
            async with session.post(f"{endpoint.base_url}/chat/completions", json={"model": READER}) as plain:
                assert plain.status == 401 and (await plain.json())["error"]["code"] == "invalid_api_key"
                assert plain.headers["x-should-retry"] == "false"
    assert reader_meter.phases == {} and embed_meter.phases == {}  # nothing refused was counted
    with pytest.raises(ConfigError, match="unknown model"):
        endpoint.grant(PhaseMeter("c"), ["no-such-alias"])


@pytest.mark.parametrize("params, param", [
    ({"n": 2}, "n"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"logprobs": True}, "logprobs"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}]},
     "messages[0].content"),
])
async def test_parameters_the_endpoint_cannot_honour_are_refused_naming_them(tmp_path, params, param):
    async with endpoint_over(Config.load(), str(tmp_path / "c.sqlite")) as (engine, endpoint):
        meter = PhaseMeter("p")
        sdk = client(endpoint, endpoint.grant(meter, [READER]))
        body = {"model": READER, "messages": QUESTION, **params}
        extra = {k: v for k, v in body.items() if k not in ("model", "messages")}
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.chat.completions.create(model=READER, messages=body["messages"], extra_body=extra)
        await sdk.close()
    assert refused.value.param == param and refused.value.status_code == 400
    assert engine.stats.requests == 0 and meter.phases == {}


async def test_wire_parameters_reach_the_provider_and_max_cost_caps_the_calls(tmp_path):
    seen: list[dict] = []

    def reply(api, body):
        seen.append(body)
        return '{"facts": ["Ana met Bo"]}'

    async with LoopbackServer(models=["up-model"], reply=reply) as server:
        config = Config.from_dicts(
            {"up": {"kind": "openai", "base_url": server.openai_base_url, "max_attempts": 1}},
            {"extractor": {"endpoint": "up", "model": "up-model", "price_in": 1.0, "price_out": 2.0}})
        async with endpoint_over(config, str(tmp_path / "c.sqlite"), max_cost=0.01) as (engine, endpoint):
            meter = PhaseMeter("mem0")
            sdk = client(endpoint, endpoint.grant(meter, ["extractor"]))
            schema = {"type": "json_schema", "json_schema": {"name": "facts", "schema": {"type": "object"}}}
            with meter.phase("ingest"):
                reply_ = await sdk.chat.completions.create(
                    model="extractor", messages=[{"role": "developer", "content": "Extract facts."},
                                                 {"role": "user", "content": [{"type": "text", "text": "Ana met Bo"}]}],
                    max_completion_tokens=50, temperature=0.2, stop=["\n\n"], seed=3, top_p=0.9,
                    response_format=schema, user="someone")
                with pytest.raises(openai.RateLimitError) as capped:  # its worst case is over --max-cost
                    await sdk.chat.completions.create(model="extractor", messages=QUESTION, max_tokens=100_000)
            await sdk.close()
    assert reply_.choices[0].message.content == '{"facts": ["Ana met Bo"]}'
    sent = seen[0]
    assert sent["model"] == "up-model" and sent["response_format"] == schema
    assert (sent["max_tokens"], sent["temperature"], sent["stop"], sent["seed"], sent["top_p"]) == (50, 0.2, ["\n\n"], 3, 0.9)
    assert sent["messages"] == [{"role": "system", "content": "Extract facts."}, {"role": "user", "content": "Ana met Bo"}]
    assert "user" not in sent and len(seen) == 1
    assert capped.value.code == "insufficient_quota" and capped.value.response.headers["x-should-retry"] == "false"
    ingest = meter.phases["ingest"]
    assert (ingest.calls, ingest.failed) == (2, 1) and ingest.spent_usd > 0 and ingest.list_usd == ingest.spent_usd


async def test_concurrent_systems_are_counted_apart_in_their_own_phases(tmp_path):
    async with endpoint_over(Config.load(), str(tmp_path / "c.sqlite")) as (engine, endpoint):
        first, second = PhaseMeter("first"), PhaseMeter("second")
        a = client(endpoint, endpoint.grant(first, [READER, MINILM]))
        b = client(endpoint, endpoint.grant(second, [READER, MINILM]))
        with first.phase("ingest"), second.phase("recall"):
            await a.embeddings.create(model=MINILM, input=["one", "two"])
            await a.chat.completions.create(model=READER, messages=QUESTION)
            await b.chat.completions.create(model=READER, messages=QUESTION[1:])
        await a.close()
        await b.close()
    assert (first.phases["ingest"].calls, set(first.phases)) == (2, {"ingest"})
    assert (second.phases["recall"].calls, set(second.phases)) == (1, {"recall"})


def _outside_address() -> str | None:
    """An address of this machine other than loopback, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


async def test_it_listens_on_loopback_only_and_closes_with_the_run(tmp_path):
    async with endpoint_over(Config.load(), str(tmp_path / "c.sqlite")) as (engine, endpoint):
        secret = endpoint.grant(PhaseMeter("x"), [READER])
        assert endpoint.base_url == f"http://127.0.0.1:{endpoint.port}/v1"
        assert [address[0] for address in endpoint._runner.addresses] == ["127.0.0.1"]
        outside = _outside_address()
        if outside is not None:
            with pytest.raises(OSError):
                socket.create_connection((outside, endpoint.port), timeout=5).close()
        await client(endpoint, secret).models.list()
        await endpoint.close()
        with pytest.raises(openai.APIConnectionError):
            await client(endpoint, secret).models.list()
