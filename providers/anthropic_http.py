"""Anthropic Messages API over raw HTTP (kind "anthropic").

POST `{base_url}/v1/messages` with `x-api-key` and `anthropic-version`.
Differences from the OpenAI format handled here:
- system messages go to the top-level `system` field (several are joined by a
  blank line);
- `max_tokens` is required: 4096 when the request and alias give none;
- `stop` becomes `stop_sequences`; `seed` is dropped (the API has none and
  rejects unknown fields); `max_completion_tokens` is read as `max_tokens`;
- the reply text is the concatenation of the `text` content blocks;
  stop_reason end_turn/stop_sequence -> "stop", max_tokens and
  model_context_window_exceeded (the model's window filled up while
  generating) -> "length", refusal -> "content_filter" (a final answer, even
  with no text: asking again is refused again), others kept as they are.
  `pause_turn` (the API paused a long turn of server tools, to be continued by
  sending it back; Tulving sends no tools) keeps its partial text as is; with
  no text it is a final bad request, not a bad reply retried in vain.
  (StopReason of the anthropic SDK 2.14: end_turn, max_tokens, stop_sequence,
  tool_use, pause_turn, refusal, model_context_window_exceeded; checked 2026-11-26.)
Anthropic serves no embeddings (the base class raises).

Streaming (`chat(..., stream=True)`, or every call with the endpoint option
`stream = true`): `"stream": true`; the events message_start (the message and
its input usage, prompt-cache counts included), content_block_start /
content_block_delta (text and thinking) and message_delta (stop reason, final
usage) are assembled into the `message` the same call would have returned,
which `chat_result` normalises, so both give the same result; the streamed one
has `timings` too. A stream that ends before message_stop is a connection
error, one without a message_start or the message_delta usage a bad reply
(both retried); an `error` event is classified by its type
(`http_errors.stream_error`: overloaded_error -> overloaded, ...).

Endpoint options: `anthropic_version` (default "2026-10-21", the current one, which takes no
temperature/top_p/top_k: a default temperature is left out, any other refused), `headers`
(extra headers, e.g. `anthropic-beta`), `trust_env`, `drop_params` (parameter
names never sent: newer models may reject e.g. "temperature"; the anthropic SDK
2.x no longer exposes temperature/top_p/top_k), `prompt_cache` (default true:
the block ending a shared prompt prefix, e.g. the book before its question,
carries `cache_control: {"type": "ephemeral"}`, in a batch
`{"type": "ephemeral", "ttl": "1h"}`; false sends no marker),
`stream` (stream every call).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from time import perf_counter
from typing import Any

import orjson

from providers.anthropic_stream import MessageAssembler
from providers.base import (
    BAD_REQUEST,
    CONNECTION,
    PREFIX_END,
    ChatResult,
    EndpointSpec,
    JSONObject,
    ProviderError,
    StreamTimings,
)
from providers.http_client import HttpProvider, JsonHttpClient
from providers.http_errors import bad_reply, stream_error, token_count
from providers.kinds import opt_bool, opt_str, opt_strings
from providers.ratelimit_headers import rate_limit_info
from providers.sse import SSEParser
from providers.standard_kinds import ANTHROPIC_API_VERSION

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_MAX_TOKENS = 4096

_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
           "model_context_window_exceeded": "length", "refusal": "content_filter", "tool_use": "tool_calls"}
# Stop reasons whose reply may hold no text at all, output tokens or not.
_MAY_BE_EMPTY = frozenset({"refusal", "model_context_window_exceeded"})
_DROPPED = frozenset({"seed", "stop", "max_completion_tokens"})
SAMPLING = ("temperature", "top_p", "top_k")
SAMPLING_FREE_VERSION = "2026-10-21"  # the first anthropic-version without sampling parameters


def _cache_control(ttl: str | None) -> dict[str, str]:
    """The marker of a cached prefix: the 5-minute default, or `ttl` ("1h")."""
    return {"type": "ephemeral"} if ttl is None else {"type": "ephemeral", "ttl": ttl}


def _blocks(text: str, end: int, ttl: str | None) -> list[dict[str, object]]:
    """`text` as content blocks, the first (up to `end`) marked for the
    prompt cache: everything up to and including it is the cached prefix."""
    if not text[end:].strip():  # the API refuses a block of only whitespace: it joins the prefix
        return [{"type": "text", "text": text, "cache_control": _cache_control(ttl)}]
    return [{"type": "text", "text": text[:end], "cache_control": _cache_control(ttl)},
            {"type": "text", "text": text[end:]}]


def _prefix_end(message: Mapping[str, object]) -> int | None:
    end = message.get(PREFIX_END)
    return end if type(end) is int and end > 0 else None


def messages_body(model: str, messages: Sequence[Mapping[str, Any]], params: Mapping[str, object], *,
                  cache_ttl: str | None = None) -> dict[str, object]:
    """The /v1/messages request body for OpenAI-style messages and params. A
    message carrying PREFIX_END becomes content blocks, the one ending the
    shared prefix marked `cache_control` (Anthropic's prompt caching), with
    the lifetime `cache_ttl` ("1h") where given, else the API's 5 minutes."""
    system = [m for m in messages if m["role"] == "system"]
    turns: list[Mapping[str, object]] = []
    for m in messages:
        if m["role"] == "system":
            continue
        if PREFIX_END in m:
            end = _prefix_end(m)
            m = {"role": m["role"], "content": _blocks(m["content"], end, cache_ttl) if end else m["content"]}
        turns.append(m)
    body: dict[str, object] = {"model": model, "messages": turns}
    if system:
        text = "\n\n".join(m["content"] for m in system)
        ends = [(i, _prefix_end(m)) for i, m in enumerate(system) if _prefix_end(m)]
        if ends:  # the system prompt's own prefix: its text up to the marked message's end
            i, end = ends[-1]
            body["system"] = _blocks(text, sum(len(m["content"]) + 2 for m in system[:i]) + (end or 0), cache_ttl)
        else:
            body["system"] = text
    body.update((k, v) for k, v in params.items() if k not in _DROPPED)
    if "max_tokens" not in body:
        body["max_tokens"] = params.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
    stop = params.get("stop")
    if stop:
        body["stop_sequences"] = _stop_sequences(stop)
    return body


def _stop_sequences(stop: object) -> object:
    """`stop` (a string or a list of them) as Anthropic's stop_sequences list."""
    if isinstance(stop, str):
        return [stop]
    return list(stop) if isinstance(stop, list | tuple) else stop


class AnthropicProvider(HttpProvider):
    kind = "anthropic"
    default_base_url = DEFAULT_BASE_URL
    can_stream = True
    cache_reads_count_toward_limits = False  # "cache_read_input_tokens do not count" toward ITPM

    def __init__(self, spec: EndpointSpec, api_key: str | None = None):
        super().__init__(spec, api_key)
        self.version = opt_str(spec, "anthropic_version") or ANTHROPIC_API_VERSION
        self._url = self.url("/v1/messages")
        self._http = JsonHttpClient.for_endpoint(
            spec, api_key, auth={"x-api-key": api_key or ""}, request_id_header="request-id",
            base_headers={"anthropic-version": self.version})
        self._drop = frozenset(opt_strings(spec, "drop_params"))
        self.caches_prompt_prefix = opt_bool(spec, "prompt_cache")
        self._stream_always = opt_bool(spec, "stream")

    async def list_models(self, *, timeout: float) -> list[str]:
        """The ids GET /v1/models lists for this key, every page (the `list_models` capability)."""
        ids: list[str] = []
        after = ""
        for _ in range(100):  # pages of 1000: far more than Anthropic serves
            data = await self._http.request_json("GET", self.url(f"/v1/models?limit=1000{after}"), timeout=timeout)
            items = data.get("data")
            if not isinstance(items, list):
                raise bad_reply(self.spec.name, "GET /v1/models: reply has no data list", secret=self._api_key)
            ids += [str(item["id"]) for item in items if isinstance(item, dict) and "id" in item]
            if not data.get("has_more") or not ids:
                break
            after = f"&after_id={ids[-1]}"
        return ids

    async def chat(self, model: str, messages: Sequence[Mapping[str, object]], *,
                   params: Mapping[str, object], timeout: float, stream: bool = False) -> ChatResult:
        body = self.chat_body(model, messages, params)
        if stream or self._stream_always:
            return await self._chat_streamed(body, timeout)
        data, headers, latency = await self._http.post(self._url, body, timeout)
        request_id = headers.get("request-id") or data.get("id")
        result = self.chat_result(data, request_id if isinstance(request_id, str) and request_id else None, latency)
        result.rate_limits = rate_limit_info(headers)
        return result

    def chat_body(self, model: str, messages: Sequence[Mapping[str, object]], params: Mapping[str, object],
                  *, cache_ttl: str | None = None) -> dict[str, object]:
        """The `/v1/messages` body of a call (a direct call's, and a batch
        request's `params`, whose cached prefix lives `cache_ttl`)."""
        if self._drop:
            params = {k: v for k, v in params.items() if k not in self._drop}
        if self.version >= SAMPLING_FREE_VERSION:
            params = self._without_sampling(params)
        return messages_body(model, messages, params, cache_ttl=cache_ttl)

    def _without_sampling(self, params: Mapping[str, object]) -> Mapping[str, object]:
        """API version 2026-10-21 refuses temperature, top_p and top_k even at
        their defaults (400 "Extra inputs are not permitted"; checked
        2026-11-28): a default temperature (1.0, what the paper sent) is left
        out, changing nothing; any other sampling value would be silently
        ignored if left out, so it is refused here, with the way out."""
        sent = [name for name in SAMPLING if params.get(name) is not None]
        if not sent:
            return params
        meant = [name for name in sent if not (name == "temperature" and params[name] == 1)]
        if meant:
            raise ProviderError(BAD_REQUEST, f"{self.spec.name}: anthropic-version {self.version} takes no "
                                             f"{meant[0]} (value {params[meant[0]]!r}): leave it unset, or set "
                                             f'options.anthropic_version = "2023-06-01" on this endpoint if your '
                                             f"account may use that version (Claude 5 models refuse it anyway)")
        return {k: v for k, v in params.items() if k not in SAMPLING}

    async def _chat_streamed(self, body: dict[str, object], timeout: float) -> ChatResult:
        body["stream"] = True
        parser = SSEParser()
        async with self._http.stream(self._url, body, timeout) as reply:
            start, headers = reply.start, reply.headers
            header_id = headers.get("request-id")

            def malformed(what: str) -> ProviderError:
                return bad_reply(self.spec.name, f"stream {what}", secret=self._api_key, request_id=header_id)

            stream = MessageAssembler(malformed)
            async for piece in reply:  # read to the end (after message_stop too): the connection is then reused
                arrived = perf_counter() - start
                for event in parser.feed(piece):
                    if stream.done or event.event == "ping":
                        continue
                    payload = self._event_payload(event.event, event.data, header_id, malformed)
                    stream.feed(payload, arrived)
            latency = perf_counter() - start
            first_byte = reply.first_byte - start
        message_id = stream.message.get("id") if stream.message else None
        request_id = header_id or (message_id if isinstance(message_id, str) and message_id else None)
        if not stream.done:
            raise ProviderError(CONNECTION, f"{self.spec.name}: the stream ended before its end (message_stop) "
                                            f"after {len(stream.times)} text chunks", request_id=request_id)
        missing = stream.missing()
        if missing:
            raise bad_reply(self.spec.name, f"the stream has no {missing}", secret=self._api_key,
                            request_id=request_id)
        result = self.chat_result(stream.assembled(), request_id, latency)
        times = stream.times
        result.timings = StreamTimings(ttft=times[0] if times else latency, chunk_times=tuple(times),
                                       first_byte=first_byte)
        result.rate_limits = rate_limit_info(headers)
        return result

    def _event_payload(self, name: str | None, data: str, request_id: str | None,
                       malformed: Callable[[str], ProviderError]) -> JSONObject:
        """An event's JSON object; an `error` event (by name or type) raised as its classified error."""
        if name == "error":
            raise stream_error(data.encode(), endpoint=self.spec.name, secret=self._api_key, request_id=request_id)
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise malformed(f"event {name!r} is not JSON") from None
        if not isinstance(payload, dict):
            raise malformed(f"event {name!r} is not an object")
        if payload.get("type") == "error":
            raise stream_error(data.encode(), endpoint=self.spec.name, secret=self._api_key, request_id=request_id)
        return payload

    def chat_result(self, data: Mapping[str, object], request_id: str | None, latency: float = 0.0) -> ChatResult:
        """The normalised result of a `message` object (a direct reply's body,
        or a batch result's `result.message`)."""
        content = data.get("content")
        if not isinstance(content, list):
            raise bad_reply(self.spec.name, "messages reply has no content list",
                            secret=self._api_key, request_id=request_id)
        if not all(isinstance(block, dict) for block in content):
            raise bad_reply(self.spec.name, "messages reply's content holds a block that is not an object",
                            secret=self._api_key, request_id=request_id)
        texts = [block.get("text") for block in content if block.get("type") == "text"]
        if not all(isinstance(t, str) for t in texts):
            raise bad_reply(self.spec.name, "messages reply has a text block whose text is not a string",
                            secret=self._api_key, request_id=request_id)
        text = "".join(texts)
        stop_reason = data.get("stop_reason") or "unknown"
        if not isinstance(stop_reason, str):
            raise bad_reply(self.spec.name, f"messages reply's stop_reason is {stop_reason!r}",
                            secret=self._api_key, request_id=request_id)
        usage = data.get("usage")
        try:
            input_tokens = token_count(usage, "input_tokens") or 0
            output_tokens = token_count(usage, "output_tokens") or 0
            # Prompt caching: reported beside input_tokens, which excludes them.
            cache_write = token_count(usage, "cache_creation_input_tokens") or 0
            cache_read = token_count(usage, "cache_read_input_tokens") or 0
            # Of the writes, those to the 1-hour cache cost more (Usage.cache_creation, anthropic 2.14).
            written_1h = token_count(usage.get("cache_creation") if isinstance(usage, dict) else None,
                                     "ephemeral_1h_input_tokens") or 0
        except ValueError as exc:
            raise bad_reply(self.spec.name, f"messages reply's {exc}", secret=self._api_key,
                            request_id=request_id) from None
        finish = _FINISH.get(stop_reason, stop_reason)
        if not text:
            self._check_empty(content, stop_reason, output_tokens, request_id)
        return ChatResult(text=text, finish_reason=finish, input_tokens=input_tokens + cache_write + cache_read,
                          output_tokens=output_tokens, latency=latency, request_id=request_id,
                          cache_read_tokens=cache_read, cache_write_tokens=cache_write,
                          cache_write_1h_tokens=min(written_1h, cache_write))

    def _check_empty(self, content: list[dict[str, object]], stop_reason: str, output_tokens: int,
                     request_id: str | None) -> None:
        """Whether a reply with no text is an answer: when the API says the
        turn ended and no output token was counted for it (see
        openai_http._content), or it refused / filled the model's window;
        raises otherwise."""
        if stop_reason in _MAY_BE_EMPTY:
            return
        if stop_reason == "pause_turn":
            raise ProviderError(BAD_REQUEST, f"{self.spec.name}: the API paused the turn (stop_reason pause_turn, "
                                             f"server tools) before any text: not retried", request_id=request_id)
        thinking = any(block.get("type") in ("thinking", "redacted_thinking") for block in content)
        if _FINISH.get(stop_reason) not in ("stop", "length", "content_filter") or output_tokens > 0 and not thinking:
            raise bad_reply(self.spec.name, f"messages reply has no text (stop_reason {stop_reason!r}, "
                                            f"{output_tokens} output tokens)",
                            secret=self._api_key, request_id=request_id)
