"""Resolve a request against the config: which alias and endpoints serve it,
which wire parameters it carries, and the identity its cache key hashes.

The identity holds exactly what determines a reply: provider kind, model name,
base URL (of the alias's first endpoint, so replicas share one cache entry),
every generation parameter, the messages (or texts) and the draw index.
Credentials, timeouts and retry settings are not part of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cache.keys import request_key
from engine.config import Config, ModelAlias
from engine.requests import ChatRequest, EmbedRequest, Request
from providers.base import EndpointSpec

# Parameters a reasoning model (o1/o3 family) is called without.
_REASONING_DROPPED = ("temperature", "max_tokens")


@dataclass(frozen=True, slots=True)
class Resolved:
    request: Request
    alias: ModelAlias
    endpoints: list[EndpointSpec]
    params: dict[str, Any]
    messages: list[dict[str, str]] | None
    identity: dict[str, Any]
    key: str


def chat_params(alias: ModelAlias, request: ChatRequest) -> dict[str, Any]:
    params = dict(alias.params)
    if request.extra:
        params.update(request.extra)
    for name, value in (("temperature", request.temperature), ("max_tokens", request.max_tokens),
                        ("seed", request.seed), ("stop", request.stop)):
        if value is not None:
            params[name] = list(value) if name == "stop" else value
    if alias.reasoning:
        for name in _REASONING_DROPPED:
            params.pop(name, None)
    return {k: v for k, v in params.items() if v is not None}


def chat_messages(alias: ModelAlias, request: ChatRequest) -> list[dict[str, str]]:
    messages = [{"role": m["role"], "content": m["content"]} for m in request.messages]
    if alias.reasoning:
        messages = [m for m in messages if m["role"] != "system"]
    return messages


def resolve(config: Config, request: Request) -> Resolved:
    """Raises ConfigError for an unknown model alias."""
    alias = config.alias(request.model)
    endpoints = config.endpoints_of(alias)
    first = endpoints[0]
    identity: dict[str, Any] = {"kind": first.kind, "base_url": first.base_url, "model": alias.model}
    if isinstance(request, EmbedRequest):
        params: dict[str, Any] = {}
        messages = None
        identity.update(op="embed", texts=list(request.texts))
    else:
        params = chat_params(alias, request)
        messages = chat_messages(alias, request)
        identity.update(op="chat", params=params, messages=messages, draw=request.draw)
    return Resolved(request=request, alias=alias, endpoints=endpoints, params=params, messages=messages,
                    identity=identity, key=request_key(identity))
