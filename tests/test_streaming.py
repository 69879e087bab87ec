"""Streamed calls (server-sent events) through both HTTP clients and the engine,
against the loopback server: the same result as a non-streamed call plus its
timings, streams cut or cancelled mid-way, and the engine's per-request
switches (stream, cache_read, cache_write) and send times."""
from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest
from aiohttp import web

from engine.config import Config, ConfigError
from engine.loopback.server import Faults, LoopbackServer, constant
from engine.requests import ChatRequest
from engine.retry import RetryPolicy
from engine.scheduler import Engine
from providers.anthropic_http import AnthropicProvider
from providers.base import BAD_REPLY, CONNECTION, OVERLOADED, RATE_LIMITED, TIMEOUT, EndpointSpec, ProviderError
from providers.openai_http import OpenAIProvider
from providers.sse import SSEEvent, SSEParser
from tests.stalls import Gap

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["m", "lm", "c"]

CLIENTS = ["pool", "aiohttp"]
APIS = ["openai", "anthropic"]
USER = [{"role": "user", "content": "Where did Maya meet Sam on March 3?"}]
LONG = lambda api, body: "word " * 60  # noqa: E731 -- 300 characters: 75 tokens, 75 deltas
BOOK = "The harbour woke before the town did. " * 130   # 1235 "cheap" tokens: the prompt caches hold it
FAST_RETRY = RetryPolicy(base=0.01, cap=0.05)


# -- the SSE parser --------------------------------------------------------------------------

WIRE = (b": keep-alive comment\r\n"
        b"event: message_start\r\ndata: {\"a\": 1}\r\n\r\n"
        b"data: first line\ndata:second line\ndata\n\n"
        b"event: lonely\n\n"                      # no data: dropped
        b"id: 7\nretry: 10\ndata: caf\xc3\xa9\r\r"  # bare \r line ends; UTF-8 split anywhere
        b"data: [DONE]\n\n"
        b"data: cut off")                         # never finished: never returned
EXPECTED = [SSEEvent("message_start", '{"a": 1}'), SSEEvent("message", "first line\nsecond line\n"),
            SSEEvent("message", "café"), SSEEvent("message", "[DONE]")]


def test_sse_parser_reads_events_whole_or_split_at_any_byte():
    assert SSEParser().feed(WIRE) == EXPECTED
    for cut in range(1, len(WIRE)):
        parser = SSEParser()
        assert parser.feed(WIRE[:cut]) + parser.feed(WIRE[cut:]) == EXPECTED, cut
    parser = SSEParser()
    assert [event for i in range(len(WIRE)) for event in parser.feed(WIRE[i:i + 1])] == EXPECTED


def test_sse_parser_waits_for_the_blank_line_and_a_split_crlf():
    parser = SSEParser()
    assert parser.feed(b"event: x\ndata: 1\r") == []
    assert parser.feed(b"\n") == []              # the \r\n was one line end, not two
    assert parser.feed(b"\r\n") == [SSEEvent("x", "1")]
    assert parser.feed(b"data: 2\n") == [] and parser.feed(b"\n") == [SSEEvent("message", "2")]


# -- helpers ---------------------------------------------------------------------------------

def provider(api: str, base: str, client: str, **options: Any) -> OpenAIProvider | AnthropicProvider:
    spec = EndpointSpec(name=f"lo-{api}", kind=api, base_url=base, options={"http_client": client, **options})
    return OpenAIProvider(spec) if api == "openai" else AnthropicProvider(spec)


def base_url(server: LoopbackServer, api: str) -> str:
    return server.openai_base_url if api == "openai" else server.anthropic_base_url


def same_result(a: Any, b: Any) -> dict[str, Any]:
    """The fields a streamed and a non-streamed call must share (not their
    latency, request id or timings)."""
    fields = dataclasses.asdict(a)
    return {k: fields[k] for k in fields if k not in ("latency", "request_id", "timings", "rate_limits")} | {
        "_": type(b).__name__}


# -- streamed results equal the non-streamed ones ----------------------------------------------

def cached_prompt(api: str, question: str) -> list[dict[str, Any]]:
    if api == "openai":
        return [{"role": "system", "content": BOOK}, {"role": "user", "content": question}]
    return [{"role": "user", "content": [{"type": "text", "text": BOOK, "cache_control": {"type": "ephemeral"}},
                                         {"type": "text", "text": question}]}]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("api", APIS)
async def test_a_streamed_result_equals_the_non_streamed_one(api, client):
    # The same calls to two identical servers, one streamed and one not (the
    # prompt caches of both go through the same states).
    cases: list[tuple[Any, dict[str, Any]]] = [
        (USER, {}),
        (USER, {"max_tokens": 4}),                       # finish "length"
        (USER, {"stop": ["Maya"]}),                      # a stop sequence
        (cached_prompt(api, "Who was at the harbour?"), {"max_tokens": 50}),   # writes the prompt cache
        (cached_prompt(api, "Who was at the harbour?"), {"max_tokens": 50}),   # reads it
    ]
    results = {}
    for stream in (False, True):
        async with LoopbackServer(in_process=True, models=SERVED) as server:
            p = provider(api, base_url(server, api), client)
            try:
                results[stream] = [await p.chat("m", messages, params=params, timeout=5, stream=stream)
                                   for messages, params in cases]
            finally:
                await p.aclose()
            assert server.stats.streams == (len(cases) if stream else 0)
    plain, streamed = results[False], results[True]
    assert [same_result(r, r) for r in streamed] == [same_result(r, r) for r in plain]
    assert all(r.timings is None for r in plain) and all(r.timings is not None and r.request_id for r in streamed)
    assert [r.finish_reason for r in streamed[:3]] == ["stop", "length", "stop"]
    # The prompt-cache counts come through the stream too (Anthropic: message_start's usage).
    if api == "anthropic":
        assert streamed[3].cache_write_tokens >= 1024 and streamed[3].cache_read_tokens == 0
    assert streamed[4].cache_read_tokens >= 1024 and streamed[4].cache_write_tokens == 0


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("api", APIS)
async def test_timings_follow_the_servers_time_to_first_token_and_token_gaps(api, client):
    async with LoopbackServer(in_process=True, models=SERVED, ttft=constant(0.05), token_delay=constant(0.005), reply=LONG) as server:
        p = provider(api, base_url(server, api), client)
        try:
            result = await p.chat("m", USER, params={"max_tokens": 500}, timeout=10, stream=True)
        finally:
            await p.aclose()
    timings = result.timings
    assert timings is not None and result.output_tokens == 75 and result.text == "word " * 60
    assert len(timings.chunk_times) == 75 and timings.ttft == timings.chunk_times[0]
    # At least what the server waited (a loaded host only adds): 0.05 s before the first token,
    # then 0.005 s before each of the 74 others; chunks come in order, each timed as it came.
    assert timings.ttft >= 0.05 and timings.chunk_times[-1] >= 0.05 + 74 * 0.005
    assert timings.first_byte is not None and 0 <= timings.first_byte < timings.ttft
    assert list(timings.chunk_times) == sorted(timings.chunk_times)
    assert result.latency >= timings.chunk_times[-1]


# -- streams that end badly ----------------------------------------------------------------------

class ScriptedServer:
    """An aiohttp server that answers every POST with `body` as an event stream."""

    def __init__(self, body: bytes, status: int = 200):
        self.body, self.status = body, status

    async def __aenter__(self) -> str:
        async def handler(request: web.Request) -> web.StreamResponse:
            response = web.StreamResponse(status=self.status, headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(self.body)
            await response.write_eof()
            return response

        app = web.Application()
        app.router.add_post("/{tail:.*}", handler)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


def openai_chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> bytes:
    import orjson

    choices = [{"index": 0, "delta": delta, "finish_reason": finish}] if delta is not None else []
    return b"data: " + orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": choices,
                                     "usage": usage}) + b"\n\n"


def anthropic_event(name: str, payload: dict[str, Any]) -> bytes:
    import orjson

    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **payload}) + b"\n\n"


USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
OPENAI_OK = [openai_chunk({"role": "assistant", "content": ""}), openai_chunk({"content": "Hi"}),
             openai_chunk({"content": " there"}), openai_chunk({}, "stop"), openai_chunk(None, usage=USAGE),
             b"data: [DONE]\n\n"]
START = {"message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "c",
                     "stop_reason": None, "usage": {"input_tokens": 3, "output_tokens": 1,
                                                    "cache_creation_input_tokens": 5, "cache_read_input_tokens": 7}}}
ANTHROPIC_OK = [anthropic_event("message_start", START),
                anthropic_event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
                b"event: ping\ndata: {\"type\": \"ping\"}\n\n",
                anthropic_event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
                anthropic_event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": " there"}}),
                anthropic_event("content_block_stop", {"index": 0}),
                anthropic_event("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                                  "usage": {"output_tokens": 2}}),
                anthropic_event("message_stop", {})]


async def scripted(api: str, client: str, frames: list[bytes]) -> Any:
    async with ScriptedServer(b"".join(frames)) as base:
        p = provider(api, base + ("/v1" if api == "openai" else ""), client)
        try:
            return await p.chat("m", USER, params={}, timeout=5, stream=True)
        except ProviderError as exc:
            return exc
        finally:
            await p.aclose()


@pytest.mark.parametrize("client", CLIENTS)
async def test_usage_comes_from_the_final_chunk_and_the_final_message_delta(client):
    openai_result = await scripted("openai", client, OPENAI_OK)
    anthropic_result = await scripted("anthropic", client, ANTHROPIC_OK)
    assert (openai_result.text, openai_result.input_tokens, openai_result.output_tokens) == ("Hi there", 5, 2)
    assert anthropic_result.text == "Hi there" and anthropic_result.finish_reason == "stop"
    # message_start's output_tokens (1) is replaced by message_delta's; the
    # prompt-cache counts of message_start are part of input_tokens.
    assert anthropic_result.output_tokens == 2 and anthropic_result.input_tokens == 3 + 5 + 7
    assert (anthropic_result.cache_write_tokens, anthropic_result.cache_read_tokens) == (5, 7)
    assert anthropic_result.request_id == "msg_1" and openai_result.request_id == "c1"


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("api, frames, kind, says", [
    ("openai", OPENAI_OK[:3], CONNECTION, "before its end"),
    ("openai", OPENAI_OK[:2] + [b'data: {"error": {"message": "Rate limit", "type": "rate_limit_exceeded"}}\n\n'],
     RATE_LIMITED, "Rate limit"),
    ("openai", OPENAI_OK[:2] + [b"data: {not json\n\n"], BAD_REPLY, "not JSON"),
    ("openai", [openai_chunk({"content": None}), openai_chunk({}, "tool_calls"), openai_chunk(None, usage=USAGE),
                b"data: [DONE]\n\n"], BAD_REPLY, "content is null"),
    ("anthropic", ANTHROPIC_OK[:5], CONNECTION, "before its end"),
    ("anthropic", ANTHROPIC_OK[:6] + ANTHROPIC_OK[7:], BAD_REPLY, "usage in message_delta"),
    ("anthropic", ANTHROPIC_OK[1:], BAD_REPLY, "no message_start"),
    ("anthropic", ANTHROPIC_OK[:1] + ANTHROPIC_OK[2:], BAD_REPLY, "names no started block"),
    ("anthropic", ANTHROPIC_OK[:4] + [b'event: error\ndata: {"type": "error", "error": {"type": '
                                      b'"overloaded_error", "message": "Overloaded"}}\n\n'], OVERLOADED, "Overloaded"),
])
async def test_a_stream_that_ends_badly_is_a_classified_error(client, api, frames, kind, says):
    error = await scripted(api, client, frames)
    assert isinstance(error, ProviderError) and error.kind == kind and says in str(error)
    assert error.retryable


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("api", APIS)
async def test_error_statuses_and_timeouts_of_streamed_calls(api, client):
    async with LoopbackServer(in_process=True, models=SERVED, faults=Faults.first(1, "503"), token_delay=constant(1.0), reply=LONG) as server:
        p = provider(api, base_url(server, api), client)
        try:
            unavailable = await p.chat("m", USER, params={}, timeout=5, stream=True)
        except ProviderError as exc:
            unavailable = exc
        try:
            slow = await p.chat("m", USER, params={}, timeout=0.5, stream=True)
        except ProviderError as exc:
            slow = exc
        finally:
            await p.aclose()
    assert isinstance(unavailable, ProviderError) and unavailable.kind == OVERLOADED and unavailable.status == 503
    assert isinstance(slow, ProviderError) and slow.kind == TIMEOUT  # the timeout bounds the whole stream


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("api", APIS)
async def test_streaming_every_call_lets_a_between_reads_timeout_catch_a_stalled_reply(api, client):
    async with LoopbackServer(in_process=True, models=SERVED, token_delay=constant(1.0), reply=LONG) as server:
        p = provider(api, base_url(server, api), client, stream=True, read_timeout=0.3)
        try:
            stalled = await p.chat("m", USER, params={}, timeout=30)
        except ProviderError as exc:
            stalled = exc
        finally:
            await p.aclose()
    assert isinstance(stalled, ProviderError) and stalled.kind == TIMEOUT
    assert "within 30 s" not in str(stalled)  # the between-reads limit fired, not the call's 30 s


# -- cancelling a stream mid-way --------------------------------------------------------------------

class CountingRelay:
    """A TCP relay in front of the loopback server that counts the
    connections clients open through it (and closes each side when the other
    does, so the server sees a client leave)."""

    def __init__(self, port: int):
        self.port, self.opened = port, 0

    async def __aenter__(self) -> CountingRelay:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.own_port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    def url(self, url: str) -> str:
        return url.replace(f":{self.port}", f":{self.own_port}")

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.opened += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("api", APIS)
async def test_cancelling_a_stream_drops_its_connection(api, client):
    async with LoopbackServer(models=SERVED, token_delay=constant(0.02), reply=LONG) as server, \
            CountingRelay(server.port) as relay:
        p = provider(api, relay.url(base_url(server, api)), client)
        try:
            first = await p.chat("m", USER, params={"max_tokens": 3}, timeout=10, stream=True)
            assert relay.opened == 1                     # kept alive after a stream read to its end
            task = asyncio.create_task(p.chat("m", USER, params={}, timeout=10, stream=True))
            await asyncio.sleep(0.3)                     # some of the 75 deltas (1.5 s) are out
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(200):
                if server.stats.in_flight == 0:
                    break
                await asyncio.sleep(0.01)
            stats = server.stats
            assert stats.streams_cancelled == 1 and stats.by_status["client_gone"] == 1
            assert 3 < stats.output_tokens - 3 < 75      # the server stopped mid-way
            after = [await p.chat("m", USER, params={"max_tokens": 5}, timeout=10, stream=stream)
                     for stream in (True, False, True)]
        finally:
            await p.aclose()
    assert relay.opened == 2     # the cancelled call's connection was not reused; the new one is
    assert first.output_tokens == 3 and all(r.output_tokens == 5 and r.text == after[0].text for r in after)


# -- through the engine ---------------------------------------------------------------------------


def engine_config(server: LoopbackServer, api: str, client: str = CLIENTS[0], **endpoint: Any) -> Config:
    options = {"http_client": client, **endpoint.pop("options", {})}
    spec = {"kind": api, "base_url": base_url(server, api), "max_concurrency": 8, "timeout": 10.0,
            "max_attempts": 4, "options": options, **endpoint}
    return Config.from_dicts({"lo": spec}, {"m": {"endpoint": "lo", "model": "lm", "price_in": 1.0,
                                                  "price_out": 2.0, "params": {"max_tokens": 500}}})


def ask(text: str = "Where did Maya meet Sam?", **flags: Any) -> ChatRequest:
    return ChatRequest(model="m", messages=[{"role": "user", "content": text}], **flags)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("fault", ["reset", "truncate", "stream_error"])
async def test_a_stream_cut_mid_way_is_retried_and_never_cached_half(tmp_path, api, client, fault):
    cache = str(tmp_path / "cache.sqlite")
    async with LoopbackServer(in_process=True, models=SERVED, faults=Faults.first(1, fault), reply=LONG) as server:
        config = engine_config(server, api, client)
        async with Engine(config, cache_path=cache, retry_policy=FAST_RETRY) as engine:
            [outcome] = await engine.run([ask(stream=True)])
        async with Engine(config, cache_path=cache) as engine:
            [again] = await engine.run([ask()])
        stats = server.stats
    assert outcome.ok and outcome.attempts == 2 and outcome.result.text == "word " * 60
    assert outcome.result.timings is not None and len(outcome.result.timings.chunk_times) == 75
    assert stats.faults == {fault: 1} and stats.streams == 2
    assert again.cached and again.result.text == outcome.result.text and again.result.output_tokens == 75


@pytest.mark.parametrize("api", APIS)
async def test_one_cache_entry_serves_streamed_and_non_streamed_requests(tmp_path, api):
    cache = str(tmp_path / "cache.sqlite")
    async with LoopbackServer(in_process=True, models=SERVED) as server:
        config = engine_config(server, api)
        async with Engine(config, cache_path=cache) as engine:
            [streamed] = await engine.run([ask("one", stream=True)])
            [plain] = await engine.run([ask("two")])
        async with Engine(config, cache_path=cache) as engine:
            hits = await engine.run([ask("one"), ask("two", stream=True), ask("one", stream=True)])
        stats = server.stats
    assert not streamed.cached and streamed.result.timings is not None
    assert not plain.cached and plain.result.timings is None
    assert all(o.cached for o in hits) and stats.requests == 2 and stats.streams == 1
    assert [o.result.text for o in hits] == [streamed.result.text, plain.result.text, streamed.result.text]
    # A reply from the cache is never timed, even for a request that asked to stream.
    assert all(o.result.timings is None and o.queued is None and o.sent_at is None for o in hits)


@pytest.mark.parametrize("api", APIS)
async def test_requests_that_skip_the_cache_each_make_their_own_call(tmp_path, api):
    cache = str(tmp_path / "cache.sqlite")
    async with LoopbackServer(in_process=True, models=SERVED, latency=constant(0.05)) as server:
        config = engine_config(server, api)
        async with Engine(config, cache_path=cache) as engine:
            [warm] = await engine.run([ask()])
            outcomes = await engine.run([ask(cache_read=False, stream=True) for _ in range(3)] + [ask()])
            [unstored] = await engine.run([ask("not stored", cache_write=False)])
            [again] = await engine.run([ask("not stored")])
            engine_stats = engine.stats
        stats = server.stats
    *fresh, hit = outcomes
    assert not warm.cached and hit.cached
    assert all(o.ok and not o.cached and o.result.timings is not None for o in fresh)
    assert engine_stats.deduplicated == 0
    assert len({o.result.request_id for o in fresh}) == 3 and stats.streams == 3
    assert not unstored.cached and not again.cached          # cache_write=False stored nothing
    assert stats.requests == 1 + 3 + 2


async def test_a_reply_nobody_asked_to_store_is_stored_when_an_identical_request_joined_it(tmp_path):
    cache = str(tmp_path / "cache.sqlite")
    async with LoopbackServer(in_process=True, models=SERVED, latency=constant(0.05)) as server:
        config = engine_config(server, "openai")
        async with Engine(config, cache_path=cache) as engine:
            alone, joined = await engine.run([ask("a", cache_write=False), ask("a")])
            [later] = await engine.run([ask("a")])
            engine_stats = engine.stats
    assert engine_stats.deduplicated == 1 and not alone.cached and later.cached
    assert later.result.text == alone.result.text == joined.result.text


@pytest.mark.parametrize("api", APIS)
async def test_cancelling_a_run_mid_stream_leaves_the_server_cleanly(api):
    gap = Gap(0.02)
    async with LoopbackServer(in_process=True, models=SERVED, token_delay=gap, reply=LONG) as server:
        async with Engine(engine_config(server, api)) as engine:
            run = asyncio.create_task(engine.run([ask(stream=True)]))
            await asyncio.sleep(0.3)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            for _ in range(200):
                if server.stats.in_flight == 0:
                    break
                await asyncio.sleep(0.01)
            gap.seconds = 0.0  # the cut stream is what had to be slow; the next one streams at once
            [after] = await engine.run([ask("next", stream=True)])
        stats = server.stats
    assert stats.streams_cancelled == 1 and stats.by_status["client_gone"] == 1
    assert after.ok and after.result.output_tokens == 75 and stats.by_status[200] == 1


async def test_queued_and_sent_at_tell_when_each_call_was_sent():
    async with LoopbackServer(in_process=True, models=SERVED, latency=constant(0.1), faults=Faults(schedule=[None, None, "503"])) as server:
        config = engine_config(server, "openai", max_concurrency=1)
        async with Engine(config, retry_policy=FAST_RETRY) as engine:
            before = time.monotonic()
            outcomes = await engine.run([ask("a"), ask("b"), ask("c")])
            after = time.monotonic()
    a, b, c = outcomes
    assert all(o.ok for o in outcomes) and c.attempts == 2
    assert all(before <= o.sent_at <= after and o.queued >= 0 for o in outcomes)
    assert b.queued >= 0.1 and c.queued >= 0.2 and b.sent_at - a.sent_at >= 0.1  # each waited for the one slot
    # c's first attempt failed: its last send came after its first. (The three
    # were taken at once, when a's first and only send was `a.queued` earlier.)
    taken = a.sent_at - a.queued
    assert c.sent_at - (taken + c.queued) >= 0.004


@pytest.mark.parametrize("api", APIS)
async def test_the_endpoint_option_streams_every_call_and_plain_requests_do_not_stream(api):
    async with LoopbackServer(in_process=True, models=SERVED) as server:
        async with Engine(engine_config(server, api)) as engine:
            [plain] = await engine.run([ask("x")])
        async with Engine(engine_config(server, api, options={"stream": True})) as engine:
            [always] = await engine.run([ask("y")])
        stats = server.stats
    assert plain.result.timings is None and always.result.timings is not None and stats.streams == 1


async def test_providers_that_cannot_stream_ignore_the_request_flag():
    config = Config.load()
    async with Engine(config) as engine:
        [outcome] = await engine.run([ChatRequest(model="builtin:reader", stream=True, cache_read=False,
                                                  messages=[{"role": "user", "content": "Who? Context: Maya."}])])
    assert outcome.ok and outcome.result.timings is None and outcome.queued is not None


def test_the_stream_option_is_checked():
    spec = {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"}
    with pytest.raises(ConfigError, match="options.stream must be true or false"):
        Config.from_dicts({"e": {**spec, "options": {"stream": "yes"}}}, {})
    with pytest.raises(ConfigError, match="local endpoints cannot stream"):
        Config.from_dicts({"e": {"kind": "local", "options": {"stream": True}}}, {})
    assert Config.from_dicts({"e": {**spec, "options": {"stream": True}}}, {}).endpoints["e"].options["stream"]
