"""Anthropic Messages API over raw HTTP (kind "anthropic").

POST `{base_url}/v1/messages` with `x-api-key` and `anthropic-version`.
Differences from the OpenAI format handled here:
- system messages go to the top-level `system` field (several are joined by a
  blank line);
- `max_tokens` is required: 4096 when the request and alias give none;
- `stop` becomes `stop_sequences`; `seed` is dropped (the API has none and
  rejects unknown fields); `max_completion_tokens` is read as `max_tokens`;
- the reply text is the concatenation of the `text` content blocks;
  stop_reason end_turn/stop_sequence -> "stop", max_tokens -> "length",
  refusal -> "content_filter", others kept as they are.
Anthropic serves no embeddings (the base class raises).

Endpoint options: `anthropic_version` (default "2023-06-01"), `headers`
(extra headers, e.g. `anthropic-beta`), `trust_env`, `drop_params` (parameter
names never sent: newer models may reject e.g. "temperature"; the anthropic SDK
2.x no longer exposes temperature/top_p/top_k).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from providers.base import ChatResult, EndpointSpec
from providers.http_client import HttpProvider, JsonHttpClient
from providers.http_errors import bad_reply, token_count
from providers.ratelimit_headers import rate_limit_info

DEFAULT_BASE_URL = "https://api.anthropic.com"
DEFAULT_MAX_TOKENS = 4096
API_VERSION = "2023-06-01"

_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
           "refusal": "content_filter", "tool_use": "tool_calls"}
_DROPPED = frozenset({"seed", "stop", "max_completion_tokens"})


def messages_body(model: str, messages: Sequence[Mapping[str, str]], params: Mapping[str, Any]) -> dict[str, Any]:
    """The /v1/messages request body for OpenAI-style messages and params."""
    system = [m["content"] for m in messages if m["role"] == "system"]
    turns = [m for m in messages if m["role"] != "system"]
    body: dict[str, Any] = {"model": model, "messages": turns}
    if system:
        body["system"] = "\n\n".join(system)
    body.update((k, v) for k, v in params.items() if k not in _DROPPED)
    if "max_tokens" not in body:
        body["max_tokens"] = params.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
    stop = params.get("stop")
    if stop:
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    return body


class AnthropicProvider(HttpProvider):
    kind = "anthropic"
    default_base_url = DEFAULT_BASE_URL

    def __init__(self, spec: EndpointSpec, api_key: str | None = None):
        super().__init__(spec, api_key)
        self._url = self.url("/v1/messages")
        self._http = JsonHttpClient.for_endpoint(
            spec, api_key, auth={"x-api-key": api_key or ""}, request_id_header="request-id",
            base_headers={"anthropic-version": str(spec.options.get("anthropic_version", API_VERSION))})
        self._drop = frozenset(spec.options.get("drop_params") or ())

    async def chat(self, model: str, messages: Sequence[Mapping[str, str]], *,
                   params: Mapping[str, Any], timeout: float, stream: bool = False) -> ChatResult:
        if self._drop:
            params = {k: v for k, v in params.items() if k not in self._drop}
        data, headers, latency = await self._http.post(self._url, messages_body(model, messages, params), timeout)
        request_id = headers.get("request-id") or data.get("id")
        result = self.chat_result(data, request_id if isinstance(request_id, str) and request_id else None, latency)
        result.rate_limits = rate_limit_info(headers)
        return result

    def chat_result(self, data: dict[str, Any], request_id: str | None, latency: float = 0.0) -> ChatResult:
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
        except ValueError as exc:
            raise bad_reply(self.spec.name, f"messages reply's {exc}", secret=self._api_key,
                            request_id=request_id) from None
        finish = _FINISH.get(stop_reason, stop_reason)
        # Empty text is an answer only when the API says the turn ended and
        # no output token was counted for it (see openai_http._content).
        thinking = any(block.get("type") in ("thinking", "redacted_thinking") for block in content)
        if not text and (finish not in ("stop", "length", "content_filter") or output_tokens > 0 and not thinking):
            raise bad_reply(self.spec.name, f"messages reply has no text (stop_reason {stop_reason!r}, "
                                            f"{output_tokens} output tokens)",
                            secret=self._api_key, request_id=request_id)
        return ChatResult(text=text, finish_reason=finish, input_tokens=input_tokens + cache_write + cache_read,
                          output_tokens=output_tokens, latency=latency, request_id=request_id,
                          cache_read_tokens=cache_read, cache_write_tokens=cache_write)
