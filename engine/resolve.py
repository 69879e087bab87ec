"""Resolve a request against the config: which alias and endpoints serve it,
which wire parameters it carries, and the identity its cache key hashes.

The identity holds exactly what determines a reply: provider kind, model name,
base URL (of the alias's first endpoint, so replicas share one cache entry),
every generation parameter, the messages (or texts) and the draw index.
Credentials, timeouts and retry settings are not part of it.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from cache.keys import dumps_normalized, key_and_canonical, key_of_canonical, normalize
from engine.config import Config, ModelAlias
from engine.requests import ChatRequest, EmbedRequest, Request
from providers.base import EndpointSpec

# Parameters a reasoning model (o1/o3 family) is called without.
# Serialised identities up to this size travel with the request to the cache
# writer (saves serialising twice on the hot path); larger ones are dropped.
_KEEP_CANONICAL_BYTES = 64 * 1024

_REASONING_DROPPED = ("temperature", "max_tokens")


# Not frozen: a frozen dataclass's __init__ sets each field through
# object.__setattr__, which tripled the cost of building one (once per request).
# Nothing changes a Resolved after _resolve builds it.
@dataclass(slots=True)
class Resolved:
    request: Request
    alias: ModelAlias
    endpoints: list[EndpointSpec]
    params: dict[str, Any]
    messages: list[dict[str, str]] | None
    identity: dict[str, object]
    key: str
    canonical: bytes = b""  # canonical_bytes(identity), what `key` hashes (handed to the cache's writer)
    prefix_end: tuple[int, int] | None = None  # the request's shared-prefix end, in `messages` (not in the key)


def chat_params(alias: ModelAlias, request: ChatRequest) -> dict[str, object]:
    params = dict(alias.params)
    if request.extra:
        params.update(request.extra)
    for name, value in (("temperature", request.temperature), ("max_tokens", request.max_tokens),
                        ("seed", request.seed), ("stop", request.stop)):
        if value is not None:
            params[name] = list(cast(Sequence[str], value)) if name == "stop" else value
    if alias.reasoning:
        for name in _REASONING_DROPPED:
            params.pop(name, None)
    if alias.token_param is not None:
        _name_token_limit(alias.token_param, params, request.max_tokens)
    return {k: v for k, v in params.items() if v is not None}


def _name_token_limit(token_param: str, params: dict[str, Any], asked: int | None) -> None:
    """Send the output-token limit under the model's name for it (current
    OpenAI models refuse `max_tokens` and take `max_completion_tokens`), or
    not at all; the request's own limit wins over the alias's."""
    from_alias = params.pop("max_completion_tokens", None)
    limit = params.pop("max_tokens", None)
    limit = asked if asked is not None else from_alias if limit is None else limit
    if limit is not None and token_param != "none":
        params[token_param] = limit


def chat_messages(alias: ModelAlias, request: ChatRequest, sends_system: bool | None = None) -> list[dict[str, str]]:
    """The messages sent (`sends_system`: alias.sends_system, when the caller has it)."""
    messages = [{"role": m["role"], "content": m["content"]} for m in request.messages]
    if not (alias.sends_system if sends_system is None else sends_system):
        messages = [m for m in messages if m["role"] != "system"]
    return messages


def prefix_end(alias: ModelAlias, request: ChatRequest) -> tuple[int, int] | None:
    """The request's `prefix_end` as an index into the resolved messages (a
    reasoning model is sent no system message), or None."""
    end = request.prefix_end
    if end is None:
        return None
    index, chars = end
    if not 0 <= index < len(request.messages) or chars <= 0:
        return None
    if not alias.sends_system:
        if request.messages[index]["role"] == "system":
            return None
        index -= sum(1 for m in request.messages[:index] if m["role"] == "system")
    return index, chars


def resolve(config: Config, request: Request) -> Resolved:
    """Raises ConfigError for an unknown model alias."""
    targets: dict[str, _Target] = {}
    return _resolve(_long_prompt_route(config, _Target(config, request.model), request, targets), request)


def resolve_many(config: Config, requests: Iterable[Request]) -> list[Resolved]:
    """`resolve` for each request, looking each model alias up once."""
    targets: dict[str, _Target] = {}
    out = []
    for request in requests:
        target = targets.get(request.model)
        if target is None:
            target = targets[request.model] = _Target(config, request.model)
        if target.routes_long_prompts:
            target = _long_prompt_route(config, target, request, targets)
        out.append(_resolve(target, request))
    return out


def _long_prompt_route(config: Config, target: _Target, request: Request, targets: dict[str, _Target]) -> _Target:
    """The target serving `request`: its alias's own, or, for a chat prompt
    over the alias's `long_prompt_tokens`, its `long_prompt_model`'s (whose
    endpoints, parameters, prices and cache identity it then has, so a rerun
    hits the same entry). The prompt is counted as the reference counted it
    (deepseek over 60,000 tokens to OpenRouter): the user messages, cl100k;
    only for an alias with a route, and not when it has too few characters to
    go over (a cl100k token is at least one character)."""
    alias = target.alias
    limit, name = alias.long_prompt_tokens, alias.long_prompt_model
    if limit is None or name is None or not isinstance(request, ChatRequest):
        return target
    user = [m["content"] for m in request.messages if m["role"] == "user"]
    if sum(len(text) for text in user) <= limit:
        return target
    from engine.tokens import count_tokens

    if sum(count_tokens(text) for text in user) <= limit:
        return target
    routed = targets.get(name)
    if routed is None:
        routed = targets[name] = _Target(config, name)
    return routed


class _Target:
    """What every request for one alias shares."""

    __slots__ = ("alias", "endpoints", "first", "sends_system", "default_params", "default_params_normalized",
                 "routes_long_prompts")

    def __init__(self, config: Config, model: str):
        self.alias = config.alias(model)  # ConfigError: unknown alias
        self.endpoints = config.endpoints_of(self.alias)
        self.first = self.endpoints[0]
        self.sends_system = self.alias.sends_system  # read once, not once a request
        self.default_params: dict[str, object] | None = None  # chat params of a request that sets none
        self.default_params_normalized: object = None  # and their canonical form (keys.normalize)
        # Whether long prompts go to another alias (_long_prompt_route), read once, not once a request.
        self.routes_long_prompts = self.alias.long_prompt_tokens is not None and self.alias.long_prompt_model is not None


def _resolve(target: _Target, request: Request) -> Resolved:
    alias, first = target.alias, target.first
    end = None
    if isinstance(request, EmbedRequest):
        params: dict[str, Any] = {}
        messages = None
        identity: dict[str, object] = {"kind": first.kind, "base_url": first.base_url, "model": alias.model,
                                       "op": "embed", "texts": list(request.texts)}
        normalized = normalize(identity)
        longest = max(map(len, request.texts), default=0)
    else:
        params, params_normalized = _chat_params_of(target, request)
        messages, longest = _sent_messages(request.messages, target.sends_system)
        draw = request.draw
        identity = {"kind": first.kind, "base_url": first.base_url, "model": alias.model, "op": "chat",
                    "params": params, "messages": messages, "draw": draw}
        # Normalising only what may need it: the parameters (done above) and
        # the draw; messages of str roles and contents are canonical already.
        # (keys.canonical_bytes(identity) gives the same bytes: a test checks.)
        if longest >= 0 and type(draw) is int and 0 <= draw < 2 ** 63:
            normalized = identity if params_normalized is params else {**identity, "params": params_normalized}
        else:
            normalized = normalize(identity)
        if request.prefix_end is not None:
            end = prefix_end(alias, request)
    if longest > _KEEP_CANONICAL_BYTES or longest < 0:
        # A book-sized prompt: serialised from a copy (no UTF-8 copy left in the
        # prompt); the cache's writer encodes it again rather than hold a copy.
        key, canonical = key_and_canonical(normalized, _KEEP_CANONICAL_BYTES)
    else:
        canonical = dumps_normalized(normalized)
        key = key_of_canonical(canonical)
        if len(canonical) > _KEEP_CANONICAL_BYTES:
            canonical = b""  # long in sum: the cache's writer serialises it again rather than hold a copy
    return Resolved(request, alias, target.endpoints, params, messages, identity, key, canonical, end)


def _chat_params_of(target: _Target, request: ChatRequest) -> tuple[dict[str, object], object]:
    """(wire parameters, their canonical form). A request that sets none
    shares the alias's defaults with the other requests of its batch (read
    only), normalised once for all of them."""
    if (request.temperature is None and request.max_tokens is None and request.seed is None
            and request.stop is None and not request.extra):
        if target.default_params is None:
            target.default_params = chat_params(target.alias, request)
            target.default_params_normalized = normalize(target.default_params)
        return target.default_params, target.default_params_normalized
    params = chat_params(target.alias, request)
    return params, normalize(params)


def _sent_messages(messages: Sequence[Mapping[str, str]], sends_system: bool) -> tuple[list[dict[str, str]], int]:
    """`chat_messages` in one pass, and the characters of the longest content
    when every role and content sent is a str (not a subclass): canonical as
    they are; -1 when one is not."""
    sent = []
    longest = 0
    for m in messages:
        role, content = m["role"], m["content"]
        if role == "system" and not sends_system:
            continue
        if type(role) is not str or type(content) is not str:
            longest = -1
        elif longest >= 0 and len(content) > longest:
            longest = len(content)
        sent.append({"role": role, "content": content})
    return sent, longest
