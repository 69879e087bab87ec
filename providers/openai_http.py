"""OpenAI-format chat and embeddings over raw HTTP (kind "openai").

Speaks the standard `/chat/completions` and `/embeddings` format only, so the
same class serves api.openai.com and any OpenAI-compatible server (vLLM,
llama.cpp server, Ollama, OpenRouter) by its base URL. `Authorization: Bearer`
is sent only when a key is set. Parameters pass through as given: for OpenAI's
reasoning models put `max_completion_tokens` in the alias params.

A reply whose finish_reason is "content_filter" is returned as a result (text +
finish_reason "content_filter"), not raised; a 400 whose error code is
content_filter / content_policy_violation is a CONTENT_FILTER error.

Endpoint options (`[endpoints.X] options = {...}`): `headers` (extra headers,
e.g. OpenRouter's HTTP-Referer or OpenAI-Organization), `trust_env` (honour
HTTP(S)_PROXY, default false), `drop_params` (parameter names never sent, for
servers that reject some, e.g. ["seed"]).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from providers.base import ChatResult, EmbedResult, EndpointSpec, ProviderError
from providers.http_client import HttpProvider, JsonHttpClient
from providers.http_errors import bad_reply, token_count
from providers.ratelimit_headers import rate_limit_info

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIProvider(HttpProvider):
    kind = "openai"
    default_base_url = DEFAULT_BASE_URL

    def __init__(self, spec: EndpointSpec, api_key: str | None = None):
        super().__init__(spec, api_key)
        self._chat_url = self.url("/chat/completions")
        self._embed_url = self.url("/embeddings")
        self._http = JsonHttpClient.for_endpoint(spec, api_key, auth={"Authorization": f"Bearer {api_key}"},
                                                 request_id_header="x-request-id")
        self._drop = frozenset(spec.options.get("drop_params") or ())

    async def chat(self, model: str, messages: Sequence[Mapping[str, str]], *,
                   params: Mapping[str, Any], timeout: float, stream: bool = False) -> ChatResult:
        if self._drop:
            params = {k: v for k, v in params.items() if k not in self._drop}
        body = {"model": model, "messages": messages, **params}
        data, headers, latency = await self._http.post(self._chat_url, body, timeout)
        result = self.chat_result(data, _request_id(headers.get("x-request-id") or data.get("id")), latency)
        result.rate_limits = rate_limit_info(headers)
        return result

    def chat_result(self, data: dict[str, Any], request_id: str | None, latency: float = 0.0) -> ChatResult:
        """The normalised result of a `chat.completion` object (a direct
        reply's body, or a batch result line's `response.body`)."""
        try:
            choice = data["choices"][0]
            message = choice["message"]
            finish = choice.get("finish_reason") or "unknown"
        except (KeyError, IndexError, TypeError, AttributeError):
            raise self._malformed(data, "chat reply has no choices[0].message", request_id) from None
        if not isinstance(message, dict) or not isinstance(finish, str):
            raise self._malformed(data, "chat reply's choices[0] is not a message", request_id)
        usage = data.get("usage")
        try:
            input_tokens = token_count(usage, "prompt_tokens") or 0
            output_tokens = token_count(usage, "completion_tokens")
            details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
            cached = token_count(details, "cached_tokens") or 0  # OpenAI's automatic prompt caching
        except ValueError as exc:
            raise self._malformed(data, f"chat reply's {exc}", request_id) from None
        text = self._content(data, message, finish, output_tokens, usage, request_id)
        return ChatResult(text=text, finish_reason=finish, input_tokens=input_tokens,
                          output_tokens=output_tokens or 0, latency=latency, request_id=request_id,
                          cache_read_tokens=min(cached, input_tokens))

    def _content(self, data: dict[str, Any], message: dict[str, Any], finish: str, output_tokens: int | None,
                 usage: Any, request_id: str | None) -> str:
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

    def _malformed(self, data: dict[str, Any], what: str, request_id: str | None) -> ProviderError:
        # Some compatible servers (OpenRouter) report failures as a 200 with an
        # "error" object; surface their message.
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            what = f"{what}: {str(error['message'])}"
        return bad_reply(self.spec.name, what, secret=self._api_key, request_id=request_id)


def _request_id(value: Any) -> str | None:
    """A request id from a header or the body's `id`: kept only when it is a string."""
    return value if isinstance(value, str) and value else None
