"""OpenAI-format chat and embeddings over raw HTTP (kind "openai").

Speaks the standard `/chat/completions` and `/embeddings` format only, so the
same class serves api.openai.com and any OpenAI-compatible server (vLLM,
llama.cpp server, Ollama, OpenRouter) by its base URL. `Authorization: Bearer`
is sent only when a key is set. Parameters pass through as given: for OpenAI's
reasoning models put `max_completion_tokens` in the alias params.

A reply whose finish_reason is "content_filter" is returned as a result (text +
finish_reason "content_filter"), not raised; a 400 whose error code is
content_filter / content_policy_violation is a CONTENT_FILTER error.

Streaming (`chat(..., stream=True)`, or every call with the endpoint option
`stream = true`): the body gets `"stream": true, "stream_options":
{"include_usage": true}`; the `chat.completion.chunk` deltas of choice 0 are
assembled into the `chat.completion` the same call would have returned, which
`chat_result` normalises as any reply, so both give the same result; the
streamed one has `timings` too. A stream that ends before `data: [DONE]` is a
connection error (retried), an error event in it is classified
(`http_errors.stream_error`). A stream without the usage chunk (llama.cpp's
server and some versions of Ollama and vLLM ignore `include_usage`) is a normal
reply: its tokens are counted here in cl100k_base and the result says so
(`usage_counted_locally`). A streamed request answered with a plain JSON body
(Content-Type application/json) is read as that reply, or as the error it holds.

Endpoint options (`[endpoints.X] options = {...}`): `headers` (extra headers,
e.g. OpenRouter's HTTP-Referer or OpenAI-Organization), `trust_env` (honour
HTTP(S)_PROXY, default false), `drop_params` (parameter names never sent, for
servers that reject some, e.g. ["seed"]), `prompt_cache` (default true; false:
no warm-first ordering of requests sharing a prefix, see engine/warmup.py),
`prompt_cache_key` (default false; true: requests marking a shared prompt
prefix send `prompt_cache_key`, a digest of that prefix, which OpenAI uses to
route requests sharing it to the same cache), `stream` (stream every chat call).
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from time import perf_counter

import orjson

from providers.base import (
    CONNECTION,
    PREFIX_END,
    ChatResult,
    EmbedResult,
    EndpointSpec,
    JSONObject,
    JSONValue,
    ProviderError,
    StreamTimings,
)
from providers.http_client import HttpProvider, JsonHttpClient, StreamReply
from providers.http_errors import bad_reply, status_error, stream_error, token_count
from providers.kinds import kind_of, opt_bool, opt_strings
from providers.openai_stream import CompletionAssembler
from providers.ratelimit_headers import rate_limit_info
from providers.sse import SSEParser
from providers.tokens import count_chat_tokens, count_tokens

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIProvider(HttpProvider):
    kind = "openai"
    default_base_url = DEFAULT_BASE_URL
    can_stream = True

    def __init__(self, spec: EndpointSpec, api_key: str | None = None):
        super().__init__(spec, api_key)
        self._chat_url = self.url("/chat/completions")
        self._embed_url = self.url("/embeddings")
        self._http = JsonHttpClient.for_endpoint(spec, api_key, auth=self.auth_headers(api_key),
                                                 request_id_header="x-request-id")
        self._drop = frozenset(opt_strings(spec, "drop_params"))
        self.caches_prompt_prefix = opt_bool(spec, "prompt_cache")
        # Only the openai kind has this option (the compatible services' kinds do not).
        self._prompt_cache_key = kind_of(spec).option("prompt_cache_key") is not None and opt_bool(
            spec, "prompt_cache_key")
        self._stream_always = opt_bool(spec, "stream")

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        """The headers carrying the key (sent only when a key is set)."""
        return {"Authorization": f"Bearer {api_key}"}

    async def chat(self, model: str, messages: Sequence[Mapping[str, object]], *,
                   params: Mapping[str, object], timeout: float, stream: bool = False) -> ChatResult:
        body = self.chat_body(model, messages, params)
        if stream or self._stream_always:
            return await self._chat_streamed(body, timeout)
        data, headers, latency = await self._http.post(self._chat_url, body, timeout)
        result = self.chat_result(data, _request_id(headers.get("x-request-id") or data.get("id")), latency)
        result.rate_limits = rate_limit_info(headers)
        return result

    def chat_body(self, model: str, messages: Sequence[Mapping[str, object]], params: Mapping[str, object]
                  ) -> dict[str, object]:
        """The `/chat/completions` body of a call (a direct call's, and a batch line's)."""
        if self._drop:
            params = {k: v for k, v in params.items() if k not in self._drop}
        body = {"model": model, "messages": messages, **params}
        if any(PREFIX_END in m for m in messages):
            body.update(self.prefix_fields(messages))
        return body

    async def _chat_streamed(self, body: dict[str, object], timeout: float) -> ChatResult:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        async with self._http.stream(self._chat_url, body, timeout) as reply:
            header_id = reply.headers.get("x-request-id")
            if _is_json(reply.headers):  # the whole reply at once, not a stream (some compatible servers)
                data, times = await self._whole_reply(reply, header_id), None
            else:
                stream = await self._events(reply, header_id)
                data, times = stream.assembled(), stream.times
            latency = perf_counter() - reply.start
            first_byte = reply.first_byte - reply.start
        request_id = _request_id(header_id or data.get("id"))
        local = data.get("usage") is None
        if local:  # the server ignored stream_options.include_usage: a normal reply, counted here
            data["usage"] = _local_usage(body, data)
        result = self.chat_result(data, request_id, latency)
        result.usage_counted_locally = local
        if times is None:
            times = [latency] if result.text else []
        result.timings = StreamTimings(ttft=times[0] if times else latency, chunk_times=tuple(times),
                                       first_byte=first_byte)
        result.rate_limits = rate_limit_info(reply.headers)
        return result

    async def _events(self, reply: StreamReply, header_id: str | None) -> CompletionAssembler:
        """The stream's chunks, assembled; a stream cut before `data: [DONE]` is a connection error."""
        def malformed(what: str) -> ProviderError:
            return bad_reply(self.spec.name, what, secret=self._api_key, request_id=header_id)

        parser = SSEParser()
        stream = CompletionAssembler(malformed)
        async for piece in reply:  # read to the end (after [DONE] too): the connection is then reused
            arrived = perf_counter() - reply.start
            for event in parser.feed(piece):
                if stream.done:
                    continue
                if event.data == "[DONE]":
                    stream.done = True
                    continue
                stream.feed(self._chunk(event.data, header_id, malformed), arrived)
        if not stream.done:
            raise ProviderError(CONNECTION, f"{self.spec.name}: the stream ended before its end (data: [DONE]) "
                                            f"after {len(stream.texts)} text chunks",
                                request_id=_request_id(header_id or stream.reply_id))
        return stream

    async def _whole_reply(self, reply: StreamReply, header_id: str | None) -> JSONObject:
        """A streamed request answered with a plain JSON body: the `chat.completion`
        it holds, or the error it says, classified as that error's reply would be
        (by its own `code` when that is an HTTP status, else a final bad request)."""
        raw = b"".join([piece async for piece in reply])
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = None
        if not isinstance(data, dict):
            raise bad_reply(self.spec.name, f"a streamed request was answered with Content-Type application/json"
                                            f" but not a JSON object ({len(raw)} bytes)", secret=self._api_key,
                            request_id=header_id)
        error = data.get("error")
        if error and "choices" not in data:
            code = error.get("code") if isinstance(error, dict) else None
            status = code if type(code) is int and 400 <= code <= 599 else 400
            raise status_error(status, raw, reply.headers, endpoint=f"{self.spec.name}: error reply to a streamed"
                                                                     " request", secret=self._api_key,
                               request_id=header_id)
        return data

    def _chunk(self, data: str, request_id: str | None, malformed: Callable[[str], ProviderError]
               ) -> JSONObject:
        """A chunk's JSON object; a chunk carrying an error raised as its classified error."""
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise malformed(f"stream chunk is not JSON ({len(data)} characters)") from None
        if not isinstance(chunk, dict):
            raise malformed("stream chunk is JSON but not an object")
        if chunk.get("error"):
            raise stream_error(data.encode(), endpoint=self.spec.name, secret=self._api_key, request_id=request_id)
        return chunk

    def prefix_fields(self, messages: Sequence[Mapping[str, object]]) -> dict[str, object]:
        """The body fields of messages marking a shared prefix (PREFIX_END):
        the messages without the marker (OpenAI caches prefixes by itself),
        and with `prompt_cache_key` on, a key naming the prefix, which routes
        requests sharing it to the same cache."""
        fields: dict[str, object] = {"messages": [{k: v for k, v in m.items() if k != PREFIX_END} for m in messages]}
        if self._prompt_cache_key:
            hasher = hashlib.sha256()
            for m in messages:
                end = m.get(PREFIX_END)
                hasher.update(f"\x1e{m['role']}\x1f".encode())
                hasher.update(str(m["content"])[:end if type(end) is int else None].encode("utf-8", "surrogatepass"))
                if type(end) is int:
                    break
            fields["prompt_cache_key"] = "tulving-" + hasher.hexdigest()[:32]
        return fields

    def chat_result(self, data: JSONObject, request_id: str | None, latency: float = 0.0) -> ChatResult:
        """The normalised result of a `chat.completion` object (a direct
        reply's body, or a batch result line's `response.body`)."""
        choices = data.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, dict) or "message" not in choice:
            raise self._malformed(data, "chat reply has no choices[0].message", request_id)
        message, finish = choice["message"], choice.get("finish_reason") or "unknown"
        if not isinstance(message, dict) or not isinstance(finish, str):
            raise self._malformed(data, "chat reply's choices[0] is not a message", request_id)
        usage = data.get("usage")
        try:
            input_tokens = token_count(usage, "prompt_tokens") or 0
            output_tokens = _output_tokens(usage, input_tokens)
            details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
            cached = _cache_read(usage, details)
            # Tokens written to the cache, which newer models bill apart (the SDK's
            # PromptTokensDetails.cache_write_tokens, openai 3.57, checked 2026-11-25).
            written = token_count(details, "cache_write_tokens") or 0
        except ValueError as exc:
            raise self._malformed(data, f"chat reply's {exc}", request_id) from None
        text = self._content(data, message, finish, output_tokens, usage, request_id)
        return ChatResult(text=text, finish_reason=finish, input_tokens=input_tokens,
                          output_tokens=output_tokens or 0, latency=latency, request_id=request_id,
                          cache_read_tokens=min(cached, input_tokens),
                          cache_write_tokens=min(written, max(0, input_tokens - cached)),
                          reasoning=_reasoning(message), reported_cost=reported_cost(usage))

    def _content(self, data: JSONObject, message: JSONObject, finish: str, output_tokens: int | None,
                 usage: JSONValue, request_id: str | None) -> str:
        """The reply text. A string is the answer; an empty or missing one is
        a legitimate empty answer only when the provider says so: it finished
        ("stop", or "length"/"content_filter" with nothing visible) and counted
        no visible output token. `null` (a tool call, a refusal) or a list of
        blocks (the Anthropic shape) is a bad reply: retried, then final."""
        content = message.get("content", None) if "content" in message else ""
        if isinstance(content, str) and content:
            return content
        if content is None:
            raise self._malformed(data, "chat reply's message content is null", request_id)
        if not isinstance(content, str):
            raise self._malformed(data, f"chat reply's message content is a {type(content).__name__}, "
                                        "not a string", request_id)
        if finish not in ("stop", "length", "content_filter"):
            raise self._malformed(data, f"chat reply is empty and did not finish (finish_reason {finish!r})",
                                  request_id)
        details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
        hidden = details.get("reasoning_tokens") if isinstance(details, dict) else 0
        visible = (output_tokens or 0) - (hidden if type(hidden) is int else 0)
        if visible > 0:
            raise self._malformed(data, f"chat reply is empty but counts {visible} output tokens", request_id)
        return ""

    async def list_models(self, *, timeout: float) -> list[str]:
        """The ids GET /models lists for this key (the `list_models` capability)."""
        data = await self._http.request_json("GET", self.url("/models"), timeout=timeout)
        items = data.get("data")
        if not isinstance(items, list):
            raise bad_reply(self.spec.name, "GET /models: reply has no data list", secret=self._api_key)
        return [str(item["id"]) for item in items if isinstance(item, dict) and "id" in item]

    async def embed(self, model: str, texts: Sequence[str], *, timeout: float) -> EmbedResult:
        body = {"model": model, "input": texts, "encoding_format": "float"}
        data, headers, latency = await self._http.post(self._embed_url, body, timeout)
        request_id = _request_id(headers.get("x-request-id") or data.get("id"))
        try:
            items = sorted(data["data"], key=lambda item: item["index"])
            vectors = [item["embedding"] for item in items]
        except (KeyError, TypeError, AttributeError):
            raise self._malformed(data, "embeddings reply has no data[].embedding/index", request_id) from None
        if len(vectors) != len(texts) or not all(isinstance(v, list) and v and all(
                type(x) in (float, int) and math.isfinite(x) for x in v) for v in vectors):
            raise bad_reply(self.spec.name, f"embeddings reply has no {len(texts)} finite float vectors",
                            secret=self._api_key, request_id=request_id)
        try:
            input_tokens = token_count(data.get("usage"), "prompt_tokens") or 0
        except ValueError as exc:
            raise self._malformed(data, f"embeddings reply's {exc}", request_id) from None
        return EmbedResult(vectors=vectors, input_tokens=input_tokens, latency=latency, request_id=request_id,
                           rate_limits=rate_limit_info(headers))

    def _malformed(self, data: JSONObject, what: str, request_id: str | None) -> ProviderError:
        # Some compatible servers (OpenRouter) report failures as a 200 with an
        # "error" object; surface their message.
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            what = f"{what}: {str(error['message'])}"
        return bad_reply(self.spec.name, what, secret=self._api_key, request_id=request_id)


def _is_json(headers: Mapping[str, str]) -> bool:
    """Whether a reply's Content-Type says JSON (a whole reply), not server-sent events."""
    content_type = headers.get("content-type") or headers.get("Content-Type") or ""
    return content_type.split(";")[0].strip().lower() == "application/json"


def _local_usage(body: Mapping[str, object], data: JSONObject) -> JSONObject:
    """The usage of a reply that came without one: the prompt and the reply's
    text counted in cl100k_base (providers/tokens.py). An estimate for other
    tokenizers, and said so (`ChatResult.usage_counted_locally`)."""
    messages = body.get("messages")
    prompt = count_chat_tokens(messages) if isinstance(messages, list) else 0
    choices = data.get("choices")  # a malformed reply: chat_result says what is wrong with it
    choice = choices[0] if isinstance(choices, list) and choices else None
    message = choice.get("message") if isinstance(choice, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return {"prompt_tokens": prompt, "completion_tokens": count_tokens(content) if isinstance(content, str) else 0}


def _output_tokens(usage: JSONValue, input_tokens: int) -> int | None:
    """The billed output tokens: `completion_tokens`, plus the reasoning
    tokens where the server counts them apart. OpenAI counts reasoning inside
    completion_tokens; xAI reports completion_tokens as the visible text only,
    with `completion_tokens_details.reasoning_tokens` beside it and in
    `total_tokens` (vercel/ai#12425, inspect_ai#5528; checked 2026-11-28).
    Told apart by the sum: total = prompt + completion + reasoning."""
    output = token_count(usage, "completion_tokens")
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    reasoning = token_count(details, "reasoning_tokens") if isinstance(details, dict) else None
    total = token_count(usage, "total_tokens")
    if output is not None and reasoning and total is not None and total == input_tokens + output + reasoning:
        return output + reasoning
    return output


def reported_cost(usage: JSONValue) -> float | None:
    """What the server says the call cost, in USD, or None: OpenRouter's
    `usage.cost` (in credits, one a dollar; with your own key, plus
    `cost_details.upstream_inference_cost`: openrouter.ai/docs usage
    accounting, checked 2026-11-28); xAI's `cost_in_usd_ticks` (1e10 ticks a
    dollar, as xAI's usage reports it; checked 2026-11-28)."""
    if not isinstance(usage, dict):
        return None
    cost, ticks = _amount(usage.get("cost")), _amount(usage.get("cost_in_usd_ticks"))
    if cost is not None:
        details = usage.get("cost_details")
        upstream = _amount(details.get("upstream_inference_cost")) if isinstance(details, dict) else None
        return cost + ((upstream or 0.0) if usage.get("is_byok") is True else 0.0)
    return None if ticks is None else ticks / 1e10


def _amount(value: JSONValue) -> float | None:
    """A finite amount >= 0, or None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def _cache_read(usage: JSONValue, details: JSONValue) -> int:
    """Prompt tokens read from the provider's cache: OpenAI's
    `prompt_tokens_details.cached_tokens`, else DeepSeek's `prompt_cache_hit_tokens`
    (its usage splits the prompt into cache hits and misses; checked 2026-11-26 in
    api-docs.deepseek.com, "Context Caching"). ValueError on a malformed count."""
    cached = token_count(details, "cached_tokens")
    if cached is None:
        cached = token_count(usage, "prompt_cache_hit_tokens")
    return cached or 0


def _reasoning(message: Mapping[str, object]) -> str | None:
    """The reasoning text a reply carries beside its answer: DeepSeek's
    `message.reasoning_content`, OpenRouter's `message.reasoning` (None when
    absent, null or not a string: reasoning is kept, never required)."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def _request_id(value: JSONValue) -> str | None:
    """A request id from a header or the body's `id`: kept only when it is a string."""
    return value if isinstance(value, str) and value else None
