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

from typing import Any, Mapping, Sequence

from providers.base import ChatResult, EmbedResult, EndpointSpec, ProviderError
from providers.http_client import HttpProvider, JsonHttpClient
from providers.http_errors import bad_reply

DEFAULT_BASE_URL = "https://api.openai.com/v1"


class OpenAIProvider(HttpProvider):
    kind = "openai"
    default_base_url = DEFAULT_BASE_URL

    def __init__(self, spec: EndpointSpec, api_key: str | None = None):
        super().__init__(spec, api_key)
        base = self.base_url()
        self._chat_url = f"{base}/chat/completions"
        self._embed_url = f"{base}/embeddings"
        self._http = JsonHttpClient.for_endpoint(spec, api_key, auth={"Authorization": f"Bearer {api_key}"},
                                                 request_id_header="x-request-id")
        self._drop = frozenset(spec.options.get("drop_params") or ())

    async def chat(self, model: str, messages: Sequence[Mapping[str, str]], *,
                   params: Mapping[str, Any], timeout: float) -> ChatResult:
        if self._drop:
            params = {k: v for k, v in params.items() if k not in self._drop}
        body = {"model": model, "messages": messages, **params}
        data, headers, latency = await self._http.post(self._chat_url, body, timeout)
        request_id = headers.get("x-request-id") or data.get("id")
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            raise self._malformed(data, "chat reply has no choices[0].message", request_id) from None
        usage = data.get("usage") or {}
        return ChatResult(text=text, finish_reason=choice.get("finish_reason") or "unknown",
                          input_tokens=usage.get("prompt_tokens") or 0,
                          output_tokens=usage.get("completion_tokens") or 0,
                          latency=latency, request_id=request_id)

    async def embed(self, model: str, texts: Sequence[str], *, timeout: float) -> EmbedResult:
        body = {"model": model, "input": texts, "encoding_format": "float"}
        data, headers, latency = await self._http.post(self._embed_url, body, timeout)
        request_id = headers.get("x-request-id") or data.get("id")
        try:
            items = sorted(data["data"], key=lambda item: item["index"])
            vectors = [item["embedding"] for item in items]
        except (KeyError, TypeError):
            raise self._malformed(data, "embeddings reply has no data[].embedding/index", request_id) from None
        if len(vectors) != len(texts) or not all(isinstance(v, list) for v in vectors):
            raise bad_reply(self.spec.name, f"embeddings reply has {len(vectors)} float vectors for {len(texts)} texts",
                            secret=self._api_key, request_id=request_id)
        usage = data.get("usage") or {}
        return EmbedResult(vectors=vectors, input_tokens=usage.get("prompt_tokens") or 0,
                           latency=latency, request_id=request_id)

    def _malformed(self, data: dict, what: str, request_id: str | None) -> ProviderError:
        # Some compatible servers (OpenRouter) report failures as a 200 with an
        # "error" object; surface their message.
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            what = f"{what}: {error['message']}"
        return bad_reply(self.spec.name, what, secret=self._api_key, request_id=request_id)
