"""The wire as the real APIs speak it today, each
against the loopback server made as strict as they are: real HTTP, the real
providers, the engine in-process.

- a 429 that names its wait only in OpenAI's message ("Please try again in
  644ms.") waits that long, not the bucket's refill;
- `x-should-retry` decides, as both official SDKs let it;
- Anthropic batch lines failing with billing_error (or a type nobody knows)
  are final, never sent again in a new batch;
- the new stop reasons (refusal, model_context_window_exceeded, pause_turn)
  are answers or final errors, not bad replies retried in vain;
- a batch's shared prefix is cached for an hour, and that write priced at 2x;
- JSONL downloads ask for what they get (a strict server 406s
  `application/json`), and a crashed submit's batch is found past the newest 100.
"""
from __future__ import annotations

import aiohttp
import pytest

from engine.budget import worst_case
from engine.config import Config, ModelAlias
from engine.loopback.batches import BatchKnobs
from engine.loopback.server import Faults, LoopbackServer
from engine.requests import ChatRequest
from engine.retry import RetryPolicy
from engine.scheduler import Engine
from providers.anthropic_batch import AnthropicBatchApi
from providers.anthropic_http import AnthropicProvider
from providers.base import AUTH, BAD_REQUEST, CONTENT_FILTER, OVERLOADED, RATE_LIMITED, EndpointSpec, ProviderError
from providers.http_errors import retry_after, status_error
from providers.openai_batch import OpenAIBatchApi
from providers.openai_http import OpenAIProvider

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["test-model", "m", "x"]

FAST_RETRY = RetryPolicy(base=0.01, cap=0.05)
USER = [{"role": "user", "content": "Where did Maya meet Sam on March 3?"}]
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01", "x-api-key": "k"}


def openai_spec(server: LoopbackServer, **spec: object) -> EndpointSpec:
    return EndpointSpec(name="lo-openai", kind="openai", base_url=server.openai_base_url, **spec)  # type: ignore[arg-type]


def anthropic_spec(server: LoopbackServer) -> EndpointSpec:
    return EndpointSpec(name="lo-anthropic", kind="anthropic", base_url=server.anthropic_base_url)


async def fails(call) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await call
    return info.value


def config(server: LoopbackServer, kind: str = "openai", batch: bool = False, **model: object) -> Config:
    url = server.openai_base_url if kind == "openai" else server.anthropic_base_url
    return Config.from_dicts({"lb": {"kind": kind, "base_url": url, "max_attempts": 3, "max_retry_after": 0.5,
                                     "options": {"batch": batch, "batch_poll": 0.01, "batch_poll_max": 0.02}}},
                             {"m": {"endpoints": ["lb"], "model": "test-model", "params": {"max_tokens": 16},
                                    **model}})


def requests(n: int) -> list[ChatRequest]:
    return [ChatRequest(model="m", messages=[{"role": "user", "content": f"question {i}"}], tag=i) for i in range(n)]


async def run(cfg: Config, reqs: list[ChatRequest], tmp_path=None, batch: bool = False) -> list:
    cache = str(tmp_path / "c.sqlite") if tmp_path is not None else None
    async with Engine(cfg, cache_path=cache, batch=batch, retry_policy=FAST_RETRY, progress=False) as engine:
        return await engine.run(reqs)


# -- a 429 naming its wait in the message ------------------------------------------------------

@pytest.mark.parametrize(("seconds", "said"), [(0.644, "644ms"), (1.574, "1.574s"), (360.0, "6m0s")])
async def test_an_openai_429_waits_what_its_message_names(seconds, said):
    async with LoopbackServer(models=SERVED, faults=Faults.first(1, "429", try_again=seconds)) as server:
        provider = OpenAIProvider(openai_spec(server))
        try:
            err = await fails(provider.chat("m", USER, params={}, timeout=5))
        finally:
            await provider.aclose()
    assert err.kind == RATE_LIMITED and f"try again in {said}" in err.message
    assert err.retry_after == pytest.approx(seconds)


def test_the_message_wait_beats_the_buckets_refill_and_a_header_beats_both():
    # OpenAI's documented headers (limit 150000, reset 6m0s: the whole bucket) with the
    # message's own wait: 0.644 s, not 360 s.
    body = (b'{"error": {"message": "Rate limit reached for gpt-4o on tokens per min (TPM): Limit 150000, '
            b'Used 149984, Requested 385. Please try again in 644ms.", "type": "tokens", '
            b'"code": "rate_limit_exceeded"}}')
    headers = {"x-ratelimit-limit-tokens": "150000", "x-ratelimit-remaining-tokens": "0",
               "x-ratelimit-reset-tokens": "6m0s"}
    assert status_error(429, body, headers, endpoint="e", secret=None).retry_after == pytest.approx(0.644)
    assert status_error(429, body, {**headers, "retry-after": "2"}, endpoint="e",
                        secret=None).retry_after == pytest.approx(2.0)
    assert retry_after(headers) == pytest.approx(360.0)  # no message: the reset header as before


# -- x-should-retry ------------------------------------------------------------------------------

async def test_x_should_retry_false_makes_a_503_final_and_true_makes_a_400_retried():
    async with LoopbackServer(models=SERVED, faults=Faults(schedule=["503", "content_filter"], should_retry="false")) as server:
        provider = OpenAIProvider(openai_spec(server))
        try:
            overloaded = await fails(provider.chat("m", USER, params={}, timeout=5))
        finally:
            await provider.aclose()
    assert overloaded.kind == OVERLOADED and not overloaded.retryable and "x-should-retry" in overloaded.message
    async with LoopbackServer(models=SERVED, faults=Faults(schedule=["content_filter"], should_retry="true")) as server:
        provider = OpenAIProvider(openai_spec(server))
        try:
            refused = await fails(provider.chat("m", USER, params={}, timeout=5))
        finally:
            await provider.aclose()
    assert refused.kind == CONTENT_FILTER and refused.retryable


async def test_the_engine_obeys_x_should_retry_on_429s_and_on_final_statuses():
    async with LoopbackServer(models=SERVED, faults=Faults.first(3, "429", should_retry="false")) as server:
        [stopped] = await run(config(server), requests(1))
        sent = server.stats.by_path["/v1/chat/completions"]
    assert not stopped.ok and stopped.error.kind == RATE_LIMITED and stopped.attempts == 1 and sent == 1
    async with LoopbackServer(models=SERVED, faults=Faults.first(1, "content_filter", should_retry="true")) as server:
        [retried] = await run(config(server), requests(1))
    assert retried.ok and retried.attempts == 2


async def test_a_value_other_than_true_or_false_changes_nothing():
    body = b'{"error": {"message": "bad", "type": "invalid_request_error"}}'
    for said in ("TRUE", "1", "yes"):
        assert not status_error(400, body, {"x-should-retry": said}, endpoint="e", secret=None).retryable
    with pytest.raises(ValueError, match="should_retry"):
        Faults(should_retry="yes")


# -- Anthropic batch errors ----------------------------------------------------------------------

@pytest.mark.parametrize(("status", "etype", "kind"), [(402, None, AUTH), (403, None, AUTH),
                                                       (500, "quota_exploded_error", BAD_REQUEST)])
async def test_billing_and_unknown_batch_errors_are_never_sent_in_a_new_batch(tmp_path, status, etype, kind):
    knobs = BatchKnobs(polls=1, fail_share=0.5, fail_status=status, fail_type=etype)
    async with LoopbackServer(models=SERVED, batch=knobs) as server:
        outcomes = await run(config(server, "anthropic", batch=True), requests(8), tmp_path, batch=True)
        batches = len(server.batches.anthropic)
    failed = [o for o in outcomes if not o.ok]
    assert batches == 1 and len(failed) == 4
    assert all(o.error.kind == kind and not o.error.retryable and o.attempts == 1 for o in failed)


async def test_passing_batch_errors_still_go_into_the_next_batch(tmp_path):
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1, fail_share=0.5, fail_status=529)) as server:
        outcomes = await run(config(server, "anthropic", batch=True), requests(8), tmp_path, batch=True)
        batches = len(server.batches.anthropic)
    assert batches > 1 and sum(o.ok for o in outcomes) > 4


# -- stop reasons ---------------------------------------------------------------------------------

def replying(text: str, stop_reason: str):
    return lambda api, body: (text, stop_reason)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("text", "stop_reason", "finish"), [
    ("", "model_context_window_exceeded", "length"), ("part of it", "model_context_window_exceeded", "length"),
    ("", "refusal", "content_filter"), ("partial", "pause_turn", "pause_turn")])
async def test_new_stop_reasons_are_answers(text, stop_reason, finish, stream):
    async with LoopbackServer(models=SERVED, reply=replying(text, stop_reason)) as server:
        provider = AnthropicProvider(anthropic_spec(server))
        try:
            result = await provider.chat("m", USER, params={"max_tokens": 50}, timeout=5, stream=stream)
        finally:
            await provider.aclose()
    assert (result.text, result.finish_reason) == (text, finish)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_turn_paused_before_any_text_is_final(stream):
    async with LoopbackServer(models=SERVED, reply=replying("", "pause_turn")) as server:
        provider = AnthropicProvider(anthropic_spec(server))
        try:
            err = await fails(provider.chat("m", USER, params={"max_tokens": 50}, timeout=5, stream=stream))
        finally:
            await provider.aclose()
    assert err.kind == BAD_REQUEST and not err.retryable and "pause_turn" in err.message


async def test_an_empty_batch_answer_that_filled_the_window_is_not_retried(tmp_path):
    async with LoopbackServer(models=SERVED, reply=replying("", "model_context_window_exceeded"), batch=BatchKnobs(polls=1)) as server:
        outcomes = await run(config(server, "anthropic", batch=True), requests(3), tmp_path, batch=True)
        batches = len(server.batches.anthropic)
    assert batches == 1 and all(o.ok and o.result.finish_reason == "length" for o in outcomes)


# -- the 1-hour cache of batches, and its price ------------------------------------------------------

BOOK = "A long book about Maya and Sam. " * 400


def with_book(n: int) -> list[ChatRequest]:
    prefix = BOOK + "## Question:\n\n"
    return [ChatRequest(model="m", messages=[{"role": "user", "content": f"{prefix}question {i}?"}], tag=i,
                        prefix_end=(0, len(prefix))) for i in range(n)]


async def test_a_batch_caches_its_shared_prefix_for_an_hour_and_pays_the_1h_write(tmp_path):
    bodies: list[dict] = []

    def reply(api: str, body: dict) -> str:
        bodies.append(body)
        return "an answer"

    async with LoopbackServer(models=SERVED, reply=reply, batch=BatchKnobs(polls=1, shuffle=False)) as server:
        cfg = config(server, "anthropic", batch=True, price_in=3.0, price_cache_write=3.75, price_out=15.0)
        outcomes = await run(cfg, with_book(3), tmp_path, batch=True)
    marks = [block["cache_control"] for body in bodies for block in body["messages"][0]["content"]
             if "cache_control" in block]
    assert marks and all(mark == {"type": "ephemeral", "ttl": "1h"} for mark in marks)
    written = [o.result for o in outcomes if o.result.cache_write_tokens]
    assert written and all(r.cache_write_1h_tokens == r.cache_write_tokens for r in written)
    alias = cfg.models["m"]
    for outcome in outcomes:
        r = outcome.result
        expected = alias.cost(r.input_tokens, r.output_tokens, cache_read=r.cache_read_tokens,
                              cache_write=r.cache_write_tokens, cache_write_1h=r.cache_write_1h_tokens, batch=True)
        assert outcome.cost == pytest.approx(expected)


async def test_direct_calls_keep_the_5_minute_cache(tmp_path):
    bodies: list[dict] = []

    def reply(api: str, body: dict) -> str:
        bodies.append(body)
        return "an answer"

    async with LoopbackServer(models=SERVED, reply=reply) as server:
        outcomes = await run(config(server, "anthropic"), with_book(2), tmp_path)
    assert all(o.ok for o in outcomes)
    assert all(b["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"} for b in bodies)


def test_a_1h_cache_write_costs_twice_the_input_price_unless_set():
    sonnet = ModelAlias(name="s", endpoints=("anthropic",), model="x", price_in=3.0, price_cache_write=3.75,
                        price_out=15.0)
    five_minutes = sonnet.cost(1_000_000, 0, cache_write=1_000_000)
    one_hour = sonnet.cost(1_000_000, 0, cache_write=1_000_000, cache_write_1h=1_000_000)
    assert (five_minutes, one_hour) == (pytest.approx(3.75), pytest.approx(6.0))
    assert sonnet.cost(2_000_000, 0, cache_write=2_000_000, cache_write_1h=500_000) == pytest.approx(1.5 * 3.75 + 3.0)
    cfg = Config.from_dicts({"anthropic": {"kind": "anthropic"}}, {"s": {"endpoint": "anthropic", "model": "x", "price_in": 3.0,
                                       "price_cache_write_1h": 5.0}})
    assert cfg.models["s"].cost(1_000_000, 0, cache_write=1_000_000, cache_write_1h=1_000_000) == pytest.approx(5.0)
    # An alias that prices no cache write (OpenAI's) pays none for an hour's either.
    gpt = ModelAlias(name="g", endpoints=("openai",), model="x", price_in=2.5, price_out=10.0)
    assert gpt.cost(1_000_000, 0, cache_write=1_000_000, cache_write_1h=1_000_000) == pytest.approx(2.5)


def test_a_batch_calls_reservation_covers_a_1h_write():
    sonnet = ModelAlias(name="s", endpoints=("anthropic",), model="x", price_in=3.0, price_cache_write=3.75,
                        price_out=15.0)
    assert worst_case(sonnet, 1_000_000, 0) == pytest.approx(3.75)
    assert worst_case(sonnet, 1_000_000, 0, batch=True) == pytest.approx(6.0 * 0.5)


async def test_the_loopback_refuses_a_cache_ttl_the_api_does_not_know():
    async with LoopbackServer(models=SERVED) as server:
        body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "BOOK.", "cache_control": {"type": "ephemeral", "ttl": "10m"}},
            {"type": "text", "text": "question"}]}]}
        async with aiohttp.ClientSession() as session:
            async with session.post(server.anthropic_base_url + "/v1/messages", json=body,
                                    headers=ANTHROPIC_HEADERS) as reply:
                refused = reply.status, (await reply.json())["error"]["message"]
            body["messages"][0]["content"][0]["cache_control"]["ttl"] = "1h"
            async with session.post(server.anthropic_base_url + "/v1/messages", json=body,
                                    headers=ANTHROPIC_HEADERS) as reply:
                accepted = reply.status
    assert refused[0] == 400 and "ttl" in refused[1] and accepted == 200


# -- JSONL downloads and finding a crashed submit's batch ------------------------------------------------

async def test_jsonl_downloads_are_refused_to_application_json_and_tulving_asks_right():
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1)) as server:
        api = AnthropicBatchApi(anthropic_spec(server), None)
        try:
            info = await api.submit([api.line("a", "m", USER, {"max_tokens": 5})])
            info = await api.poll(info.id)
            results = await api.results(info)
        finally:
            await api.aclose()
        url = info.handles["results_url"]
        async with aiohttp.ClientSession() as session:
            statuses = {}
            for accept in ("application/json", "application/binary", "application/x-jsonl", "*/*"):
                async with session.get(url, headers={**ANTHROPIC_HEADERS, "Accept": accept}) as reply:
                    statuses[accept] = reply.status
    assert list(results) == ["a"] and not isinstance(results["a"], ProviderError)
    assert statuses == {"application/json": 406, "application/binary": 200, "application/x-jsonl": 200, "*/*": 200}


async def test_a_crashed_submit_is_found_past_the_newest_hundred_batches():
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1000)) as server:
        api = OpenAIBatchApi(openai_spec(server), None)
        try:
            line = api.line("a", "m", USER, {"max_tokens": 5})
            handle = await api.prepare([line])
            mine = await api.create(handle, [line])
            for _ in range(120):  # the account's later batches, made by others
                await api.create(None, [line])
            found = await api.find(handle)
            never_made = await api.find(await api.prepare([line]))
            listed = await api.list_batches(limit=150)
        finally:
            await api.aclose()
    assert found is not None and found.id == mine.id
    assert never_made is None
    assert len(listed) == 121 and listed[-1].id == mine.id


# -- the official SDKs read the new shapes, and obey the header as Tulving does ------------------------------

async def test_the_sdks_validate_the_new_reply_and_batch_error_shapes():
    import anthropic
    from anthropic.types import Message
    from anthropic.types.messages import MessageBatchIndividualResponse

    knobs = BatchKnobs(polls=1, fail_share=0.5, fail_status=402)
    async with LoopbackServer(models=SERVED, reply=replying("", "model_context_window_exceeded"), batch=knobs) as server:
        async with aiohttp.ClientSession() as session:
            body = {"model": "m", "max_tokens": 5, "messages": USER}
            async with session.post(server.anthropic_base_url + "/v1/messages", json=body,
                                    headers=ANTHROPIC_HEADERS) as reply:
                message = Message.model_validate(await reply.json())
        client = anthropic.AsyncAnthropic(base_url=server.anthropic_base_url, api_key="k", max_retries=0)
        try:
            batch = await client.messages.batches.create(requests=[
                {"custom_id": f"r{i}", "params": {"model": "m", "max_tokens": 5, "messages": USER}} for i in range(4)])
            await client.messages.batches.retrieve(batch.id)
            lines = [MessageBatchIndividualResponse.model_validate(line.model_dump())
                     async for line in await client.messages.batches.results(batch.id)]
        finally:
            await client.close()
    assert message.stop_reason == "model_context_window_exceeded"
    errors = [line.result.error.error.type for line in lines if line.result.type == "errored"]
    assert errors == ["billing_error"] * 2


async def test_the_openai_sdk_obeys_x_should_retry_as_tulving_does():
    import openai

    async with LoopbackServer(models=SERVED, faults=Faults.first(1, "503", should_retry="false")) as server:
        client = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="k", max_retries=2)
        try:
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(model="m", messages=USER)
        finally:
            await client.close()
        sdk_sent = server.stats.by_path["/v1/chat/completions"]
    async with LoopbackServer(models=SERVED, faults=Faults.first(1, "503", should_retry="false")) as server:
        [outcome] = await run(config(server), requests(1))
        tulving_sent = server.stats.by_path["/v1/chat/completions"]
    assert sdk_sent == tulving_sent == 1 and not outcome.ok
