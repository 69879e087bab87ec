"""The Gemini kind against the loopback's Gemini API over real HTTP: plain and
streamed calls, usage (cached and thinking tokens), finish reasons, errors
(RetryInfo waits, unknown models, keys), the model list, Batch Mode (inlined
and through an uploaded file), and the leaderboard's Gemini aliases as the
resolver sends them."""
from __future__ import annotations

import orjson
import pytest

from engine.config import Config
from engine.loopback.server import LoopbackServer, default_reply
from engine.requests import ChatRequest
from engine.resolve import chat_messages, chat_params
from engine.retry import RetryPolicy
from engine.scheduler import Engine
from providers.base import (
    AUTH,
    BAD_REQUEST,
    CONNECTION,
    OVERLOADED,
    PROMPT_TOO_LONG,
    RATE_LIMITED,
    EndpointSpec,
    ProviderError,
)
from providers.gemini_batch import GeminiBatchApi
from providers.gemini_http import GeminiProvider, generate_body

KEY = "AIza-loopback-test-key-0123456789"
SYSTEM = {"role": "system", "content": "Answer from the book only."}
USER = {"role": "user", "content": "Which events happened in Boston on the day of the harbour festival?"}
MODEL = "gemini-2.5-flash"


def spec(server: LoopbackServer, **options: object) -> EndpointSpec:
    return EndpointSpec(name="g", kind="gemini", base_url=server.gemini_base_url, options=options)


async def call(server: LoopbackServer, messages: list[dict], params: dict | None = None, *, model: str = MODEL,
               stream: bool = False, key: str | None = KEY):
    provider = GeminiProvider(spec(server), key)
    try:
        return await provider.chat(model, messages, params=params or {}, timeout=10, stream=stream)
    finally:
        await provider.aclose()


async def test_a_call_sends_contents_and_system_instruction_and_reads_the_answer():
    async with LoopbackServer(in_process=True, api_keys=[KEY]) as server:
        server.gemini.recorded = []
        result = await call(server, [SYSTEM, USER], {"temperature": 1.0, "max_tokens": 200, "seed": 3,
                                                     "stop": ["\n\n"]})
        sent = server.gemini.recorded[0]
    assert result.text == default_reply("gemini", {"messages": [USER]})
    assert result.finish_reason == "stop" and result.input_tokens > 0 and result.output_tokens > 0
    assert result.request_id  # the responseId
    assert sent.method == "POST" and sent.path == f"/gemini/v1/models/{MODEL}:generateContent"
    assert sent.headers["x-goog-api-key"] == KEY
    assert orjson.loads(sent.body) == {
        "contents": [{"role": "user", "parts": [{"text": USER["content"]}]}],
        "systemInstruction": {"parts": [{"text": SYSTEM["content"]}], "role": "user"},
        "generationConfig": {"temperature": 1.0, "maxOutputTokens": 200, "seed": 3, "stopSequences": ["\n\n"]}}


async def test_a_streamed_call_gives_the_same_result_with_timings():
    async with LoopbackServer(in_process=True, api_keys=[KEY]) as server:
        plain = await call(server, [SYSTEM, USER])
        streamed = await call(server, [SYSTEM, USER], stream=True)
        assert server.stats.streams == 1
    assert streamed.text == plain.text and streamed.finish_reason == plain.finish_reason
    assert (streamed.input_tokens, streamed.output_tokens) == (plain.input_tokens, plain.output_tokens)
    assert plain.timings is None and streamed.timings is not None and len(streamed.timings.chunk_times) > 1


async def test_max_tokens_is_length_and_a_safety_stop_is_a_final_empty_answer():
    async with LoopbackServer(in_process=True, reply=lambda api, body: ("not shown", "content_filter")) as server:
        blocked = await call(server, [USER])
    assert blocked.text == "" and blocked.finish_reason == "content_filter"
    async with LoopbackServer(in_process=True) as server:
        cut = await call(server, [USER], {"max_tokens": 3})
    assert cut.finish_reason == "length" and cut.output_tokens <= 3


async def test_thinking_tokens_are_output_and_thought_parts_are_not_the_answer():
    async with LoopbackServer(in_process=True) as server:
        server.gemini.thinking_tokens = 40
        result = await call(server, [USER], {"thinking_budget": 128, "include_thoughts": True})
        plain = await call(server, [USER])
        server.gemini.recorded = []
        await call(server, [USER], {"thinking_budget": 128})
        sent = server.gemini.recorded[0].body
    assert result.text == default_reply("gemini", {"messages": [USER]}) and "Thinking" not in result.text
    assert result.output_tokens == plain.output_tokens  # both counted 40 thinking tokens as output
    assert result.output_tokens > server.count_tokens(result.text)
    assert b'"thinkingConfig":{"thinkingBudget":128}' in sent


async def test_implicit_cache_reads_are_reported_and_priced_at_the_cached_price():
    book = "Chapter one. " * 800
    first = [{"role": "user", "content": book + "Who was in Boston?"}]
    second = [{"role": "user", "content": book + "Who was in Paris?"}]
    async with LoopbackServer(in_process=True) as server:
        cold = await call(server, [{"role": "user", "content": book}])
        warm = await call(server, second)
        other = await call(server, first)
    assert cold.cache_read_tokens == 0
    assert warm.cache_read_tokens > 2000 and other.cache_read_tokens == warm.cache_read_tokens
    alias = Config.load(None).alias("gemini-2.5-pro")
    cost = alias.cost(warm.input_tokens, warm.output_tokens, cache_read=warm.cache_read_tokens)
    assert cost < alias.cost(warm.input_tokens, warm.output_tokens)
    assert cost == pytest.approx((1.25 * (warm.input_tokens - warm.cache_read_tokens)
                                  + 0.125 * warm.cache_read_tokens + 10.0 * warm.output_tokens) / 1e6)


# -- errors ---------------------------------------------------------------------------------

async def test_a_429_waits_the_retry_delay_google_asks_for():
    async with LoopbackServer(in_process=True) as server:
        server.gemini.busy, server.gemini.retry_delay = 1, 17
        with pytest.raises(ProviderError) as err:
            await call(server, [USER])
        after = await call(server, [USER])
    assert err.value.kind == RATE_LIMITED and err.value.retry_after == 17 and err.value.status == 429
    assert "RESOURCE_EXHAUSTED" in str(err.value) and after.text


@pytest.mark.parametrize(("model", "key", "messages", "kind", "status", "words"), [
    ("gemini-2.0-pro-exp-02-05", KEY, [USER], BAD_REQUEST, 404, "is not found for API version v1"),
    (MODEL, "AIza-wrong-key-but-long-enough-1234", [USER], AUTH, 400, "API key not valid"),
    (MODEL, None, [USER], AUTH, 403, "unregistered callers"),
    (MODEL, KEY, [{"role": "user", "content": ""}], BAD_REQUEST, 400, "empty text parameter"),
    (MODEL, KEY, [SYSTEM], BAD_REQUEST, 400, "contents is not specified"),
])
async def test_errors_are_final_and_one_line_without_the_key(model, key, messages, kind, status, words):
    async with LoopbackServer(in_process=True, api_keys=[KEY]) as server:
        with pytest.raises(ProviderError) as err:
            await call(server, messages, model=model, key=key)
    assert err.value.kind == kind and err.value.status == status and not err.value.retryable
    assert words in str(err.value) and "\n" not in str(err.value)
    assert "wrong-key" not in str(err.value)  # the loopback echoes the key; Tulving scrubs it


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("status", "name"), [(500, "INTERNAL"), (503, "UNAVAILABLE")])
async def test_server_failures_are_overloaded_and_retryable_before_and_inside_a_stream(status, name, stream):
    async with LoopbackServer(in_process=True) as server:
        if stream:
            server.gemini.stream_error = status
        else:
            server.gemini.failures = [status]
        with pytest.raises(ProviderError) as err:
            await call(server, [USER], stream=stream)
        after = await call(server, [USER], stream=stream)
    assert err.value.kind == OVERLOADED and err.value.retryable and name in str(err.value)
    assert err.value.status == (None if stream else status) and after.text


async def test_a_prompt_over_the_context_is_prompt_too_long():
    async with LoopbackServer(in_process=True, context_tokens=50) as server:
        with pytest.raises(ProviderError) as err:
            await call(server, [{"role": "user", "content": "word " * 400}])
    assert err.value.kind == PROMPT_TOO_LONG and "exceeds the maximum number of tokens" in str(err.value)


async def test_a_stream_cut_before_its_finish_reason_is_a_connection_error(monkeypatch):
    from engine.loopback import gemini as loopback_gemini

    async with LoopbackServer(in_process=True) as server:
        original = loopback_gemini.GeminiApi.generate

        def unfinished(self, model, body):
            response = original(self, model, body)
            response["candidates"][0]["finishReason"] = None
            return response
        monkeypatch.setattr(loopback_gemini.GeminiApi, "generate", unfinished)
        with pytest.raises(ProviderError) as err:
            await call(server, [USER], stream=True)
    assert err.value.kind == CONNECTION and err.value.retryable


async def test_the_engine_retries_a_429_and_then_answers():
    async with LoopbackServer(in_process=True) as server:
        server.gemini.busy, server.gemini.retry_delay = 2, 0
        # A set rate: the 429s halve it (unset, the engine infers about a call a second from them: two
        # seconds of waiting here; that inference is tests/test_pacing.py's, on a virtual clock).
        config = Config.from_dicts({"g": {"kind": "gemini", "base_url": server.gemini_base_url, "max_attempts": 3,
                                          "rpm": 60_000}}, {"m": {"endpoint": "g", "model": MODEL}})
        async with Engine(config, cache_path=None, retry_policy=RetryPolicy(base=0.01, cap=0.02)) as engine:
            [outcome] = await engine.run([ChatRequest(model="m", messages=[USER])])
    assert outcome.ok and outcome.attempts == 3 and outcome.result.text


async def test_list_models_reads_every_page():
    async with LoopbackServer(in_process=True, api_keys=[KEY]) as server:
        server.gemini.models = {f"gemini-test-{i:03d}" for i in range(2345)}
        provider = GeminiProvider(spec(server), KEY)
        try:
            names = await provider.list_models()
        finally:
            await provider.aclose()
    assert sorted(names) == sorted(server.gemini.models)


# -- Batch Mode -----------------------------------------------------------------------------

@pytest.mark.parametrize("uploaded", [False, True])
async def test_a_batch_answers_as_direct_calls_do(uploaded):
    async with LoopbackServer(in_process=True, api_keys=[KEY]) as server:
        api = GeminiBatchApi(spec(server), KEY)
        api.inline_bytes = 0 if uploaded else api.inline_bytes
        questions = [[SYSTEM, {"role": "user", "content": f"question {i}"}] for i in range(5)]
        try:
            lines = [api.line(f"k{i}", MODEL, q, {"max_tokens": 50}) for i, q in enumerate(questions)]
            created = await api.submit(lines)
            listed = await api.list_batches()
            ended = await api.poll(created.id)
            results = await api.results(ended)
        finally:
            await api.aclose()
        direct = [await call(server, q, {"max_tokens": 50}) for q in questions]
        files = len(server.gemini.files)
    assert not created.ended and created.counts == {"total": 5, "completed": 0, "failed": 0, "pending": 5}
    assert [b.id for b in listed] == [created.id]
    assert ended.ended and ended.status == "BATCH_STATE_SUCCEEDED" and ended.counts["completed"] == 5
    assert [results[f"k{i}"].text for i in range(5)] == [d.text for d in direct]
    assert bool(ended.handles["responses_file"]) == uploaded and files == (2 if uploaded else 0)


async def test_a_batch_line_the_api_refuses_is_a_final_error_and_the_others_answer():
    async with LoopbackServer(in_process=True) as server:
        api = GeminiBatchApi(spec(server), None)
        try:
            lines = [api.line("good", MODEL, [USER], {}), api.line("bad", MODEL, [{"role": "user", "content": ""}], {})]
            info = await api.poll((await api.submit(lines)).id)
            results = await api.results(info)
        finally:
            await api.aclose()
    assert results["good"].text and isinstance(results["bad"], ProviderError)
    assert results["bad"].kind == BAD_REQUEST and "empty text parameter" in str(results["bad"])


async def test_a_cancelled_batch_ends_without_answers():
    async with LoopbackServer(in_process=True) as server:
        server.gemini.batch_polls = 100
        api = GeminiBatchApi(spec(server), None)
        try:
            created = await api.submit([api.line("k", MODEL, [USER], {})])
            cancelled = await api.cancel(created.id)
            results = await api.results(cancelled)
        finally:
            await api.aclose()
    assert cancelled.ended and cancelled.status == "BATCH_STATE_CANCELLED" and results == {}


async def test_the_engine_batches_gemini_calls_at_the_batch_price(tmp_path):
    async with LoopbackServer(in_process=True) as server:
        config = Config.from_dicts(
            {"g": {"kind": "gemini", "base_url": server.gemini_base_url,
                   "options": {"batch_poll": 0.01, "batch_poll_max": 0.02}}},
            {"m": {"endpoint": "g", "model": MODEL, "price_in": 1.0, "price_out": 1.0}})
        requests = [ChatRequest(model="m", messages=[{"role": "user", "content": f"q {i}"}]) for i in range(6)]
        async with Engine(config, cache_path=str(tmp_path / "c.sqlite"), batch=True,
                          retry_policy=RetryPolicy(base=0.01, cap=0.02)) as engine:
            outcomes = await engine.run(requests)
        generate_calls = server.gemini.requests["generateContent"]
    assert all(o.ok and o.result.batched for o in outcomes)
    assert [o.result.text for o in outcomes] == [default_reply("gemini", {"messages": r.messages}) for r in requests]
    assert server.gemini.requests["batchGenerateContent"] == 1 and generate_calls == 0


# -- the leaderboard's aliases ---------------------------------------------------------------

def test_the_leaderboard_rows_send_the_user_prompt_only():
    """The reference called `client.models.generate_content(model=..., contents=user_prompt)`:
    no system instruction, no generation config (tests/test_gemini_sdk.py checks that body against the SDK's)."""
    config = Config.load(None)
    request = ChatRequest(model="gemini-2.5-pro", messages=[SYSTEM, USER])
    alias = config.alias("gemini-2.5-pro")
    body = generate_body(chat_messages(alias, request), chat_params(alias, request))
    assert body == {"contents": [{"role": "user", "parts": [{"text": USER["content"]}]}]}
    for name in ("gemini-2.5-flash", "gemini-2-pro", "gemini-2-flash", "gemini-2-flash-thinking"):
        row = config.alias(name)
        assert not row.sends_system and row.params == {} and row.checked == "2026-11-26"
        assert row.price_in is not None and row.price_out is not None and row.batch_discount == 0.5
    assert {config.alias(n).retired for n in ("gemini-2-pro", "gemini-2-flash", "gemini-2-flash-thinking")} == {
        "2026-06-01"}
    assert config.alias("gemini-2-flash").replacement == "gemini-flash"
    assert config.alias("gemini-flash").model == "gemini-3.8-flash" and config.alias("gemini-flash").retired is None


async def test_an_unreadable_result_line_costs_only_that_line_and_an_upload_is_found_again():
    async with LoopbackServer(in_process=True) as server:
        api = GeminiBatchApi(spec(server), None)
        api.inline_bytes = 0
        try:
            lines = [api.line(f"k{i}", MODEL, [{"role": "user", "content": f"question {i}"}], {}) for i in range(4)]
            handle = await api.prepare(lines)
            assert handle is not None and await api.find(handle) is None  # uploaded, no batch made of it yet
            created = await api.create(handle, lines)
            found = await api.find(handle)  # a run killed before recording the batch finds it by its upload
            ended = await api.poll(created.id)
            file_id = str(ended.handles["responses_file"]).removeprefix("files/")
            info, data = server.gemini.files[file_id]
            damaged = data.splitlines()
            damaged[2] = damaged[2][:40]  # one line cut short
            server.gemini.files[file_id] = (info, b"\n".join(damaged) + b"\n")
            results = await api.results(ended)
        finally:
            await api.aclose()
    assert found is not None and found.id == created.id
    assert len(results) == 3 and all(r.text for r in results.values())
