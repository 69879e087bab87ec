"""Replies of OpenAI-compatible servers that do not stream as OpenAI does:
a stream without the usage chunk (llama.cpp's server, Ollama and some vLLM
versions ignore `stream_options.include_usage`) is a normal reply whose
tokens are counted locally, and a streamed request answered with one plain
JSON body is read as that reply (or the error it holds), never retried as a
broken connection. Through both HTTP clients and the engine."""
from __future__ import annotations

from typing import Any

import orjson
import pytest
from aiohttp import web

from engine.config import Config
from engine.requests import ChatRequest
from engine.retry import RetryPolicy
from engine.scheduler import Engine
from engine.spending import spending_lines
from providers.base import BAD_REQUEST, OVERLOADED, ChatResult, EndpointSpec, ProviderError
from providers.openai_http import OpenAIProvider
from providers.tokens import count_chat_tokens, count_tokens
from tests.test_streaming import OPENAI_OK, USAGE, USER

CLIENTS = ["pool", "aiohttp"]
NO_USAGE = b"".join(OPENAI_OK[:4] + OPENAI_OK[5:])  # the chunks of "Hi there", [DONE], no usage chunk
COMPLETION = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
              "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi there"},
                           "finish_reason": "stop"}]}


class OneReplyServer:
    """Answers every POST with `body` and `content_type`, counting the POSTs."""

    def __init__(self, body: bytes, content_type: str, status: int = 200):
        self.body, self.content_type, self.status, self.posts = body, content_type, status, 0

    async def __aenter__(self) -> OneReplyServer:
        async def handler(request: web.Request) -> web.StreamResponse:
            self.posts += 1
            self.seen = orjson.loads(await request.read())
            return web.Response(body=self.body, status=self.status, headers={"Content-Type": self.content_type})

        app = web.Application()
        app.router.add_post("/{tail:.*}", handler)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.base_url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


async def streamed(body: bytes, content_type: str, client: str) -> ChatResult | ProviderError:
    async with OneReplyServer(body, content_type) as server:
        spec = EndpointSpec(name="compat", kind="openai", base_url=server.base_url, options={"http_client": client})
        provider = OpenAIProvider(spec)
        try:
            return await provider.chat("m", USER, params={"max_tokens": 16}, timeout=5, stream=True)
        except ProviderError as exc:
            return exc
        finally:
            await provider.aclose()


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_stream_without_usage_is_a_reply_with_tokens_counted_locally(client):
    result = await streamed(NO_USAGE, "text/event-stream", client)
    assert isinstance(result, ChatResult), result
    assert result.text == "Hi there" and result.finish_reason == "stop"
    assert result.usage_counted_locally
    assert result.input_tokens == count_chat_tokens(USER) > count_tokens(USER[0]["content"])
    assert result.output_tokens == count_tokens("Hi there") == 2
    assert result.timings is not None and len(result.timings.chunk_times) == 2


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_stream_with_usage_keeps_the_servers_figures(client):
    result = await streamed(b"".join(OPENAI_OK), "text/event-stream", client)
    assert isinstance(result, ChatResult) and not result.usage_counted_locally
    assert (result.input_tokens, result.output_tokens) == (USAGE["prompt_tokens"], USAGE["completion_tokens"])


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("usage", [None, {"prompt_tokens": 11, "completion_tokens": 3}])
async def test_a_plain_json_reply_to_a_streamed_request_is_read_as_that_reply(client, usage):
    body = orjson.dumps({**COMPLETION, **({"usage": usage} if usage else {})})
    result = await streamed(body, "application/json; charset=utf-8", client)
    assert isinstance(result, ChatResult), result
    assert result.text == "Hi there" and result.request_id == "chatcmpl-1"
    assert result.usage_counted_locally is (usage is None)
    assert result.output_tokens == (3 if usage else count_tokens("Hi there"))
    # The whole text came at once: one chunk, at the end.
    assert result.timings is not None and result.timings.chunk_times == (result.timings.ttft,)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("error, kind, retryable", [
    ({"message": "model 'm' not found", "type": "invalid_request_error"}, BAD_REQUEST, False),
    ({"message": "model 'm' not found", "code": 404}, BAD_REQUEST, False),
    ("no such model", BAD_REQUEST, False),
    ({"message": "server busy", "code": 503}, OVERLOADED, True),
])
async def test_a_plain_json_error_to_a_streamed_request_is_that_error(client, error, kind, retryable):
    result = await streamed(orjson.dumps({"error": error}), "application/json", client)
    assert isinstance(result, ProviderError) and result.kind == kind and result.retryable is retryable
    assert ("not found" in str(result) or "no such model" in str(result) or "busy" in str(result))
    assert "streamed request" in str(result)


@pytest.mark.parametrize("client", CLIENTS)
async def test_a_plain_json_body_that_is_no_object_is_a_bad_reply(client):
    result = await streamed(b"[1, 2]", "application/json", client)
    assert isinstance(result, ProviderError) and "not a JSON object" in str(result)


async def _engine_outcome(server: OneReplyServer, tmp_path: Any) -> Any:
    config = Config.from_dicts({"compat": {"kind": "openai", "base_url": server.base_url, "max_attempts": 3}},
                               {"m": {"endpoint": "compat", "model": "served"}})
    request = ChatRequest(model="m", messages=USER, stream=True)
    async with Engine(config, cache_path=str(tmp_path / "c.sqlite"),
                      retry_policy=RetryPolicy(base=0.01, cap=0.05)) as engine:
        [outcome] = await engine.run([request])
    return outcome


@pytest.mark.parametrize("body, content_type", [(NO_USAGE, "text/event-stream"),
                                                (orjson.dumps(COMPLETION), "application/json")])
async def test_the_engine_takes_such_a_reply_at_once_never_retrying_it(tmp_path, body, content_type):
    async with OneReplyServer(body, content_type) as server:
        outcome = await _engine_outcome(server, tmp_path)
    assert outcome.error is None and outcome.result.text == "Hi there"
    assert server.posts == 1 and outcome.attempts == 1
    assert server.seen["stream"] is True and server.seen["stream_options"] == {"include_usage": True}
    assert outcome.result.usage_counted_locally


def test_the_run_summary_says_once_how_many_replies_were_counted_locally():
    row = {"model": "m", "role": "answer", "calls": 3, "cached": 0, "input_tokens": 30, "cache_read_tokens": 0,
           "cache_write_tokens": 0, "output_tokens": 6, "spent_usd": 0.0, "list_usd": 0.0,
           "caching_saved_usd": 0.0, "usage_counted_locally": 2}
    lines = spending_lines([row, {**row, "role": "judge", "usage_counted_locally": 1}])
    said = [line for line in lines if "no usage from the server" in line]
    assert said == ["3 replies had no usage from the server: tokens counted locally (cl100k_base)"]
    assert not any("no usage" in line for line in spending_lines([{**row, "usage_counted_locally": 0}]))
