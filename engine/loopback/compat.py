"""The quirks of OpenAI-compatible services, served by the loopback's OpenAI
chat endpoint when the server is started with `compat=` (`--compat` on the
command line), so tests meet what those services send and refuse:

- "deepseek": usage splits the prompt into `prompt_cache_hit_tokens` /
  `prompt_cache_miss_tokens` (no `prompt_tokens_details`); a model whose name
  says reasoner (or r1) answers with `message.reasoning_content`, whose tokens
  are part of `completion_tokens` and `completion_tokens_details.reasoning_tokens`
  (api-docs.deepseek.com, "Reasoning Model" and "Context Caching", checked 2026-11-26).
- "openrouter": the `provider` routing object is checked against OpenRouter's
  documented fields (openrouter.ai/docs/features/provider-routing, checked
  2026-11-26); an unknown field or a wrong type is a 400. With
  `include_reasoning: true` (or a `reasoning` object) a reasoning model answers with
  `message.reasoning`; usage carries `cost` (USD, openrouter.ai/docs/use-cases/usage-accounting).
- "xai": every model reasons (grok-4.3 cannot turn it off) and, as xAI does,
  its reasoning tokens are reported outside `completion_tokens`, in
  `completion_tokens_details.reasoning_tokens` and in `total_tokens`
  (vercel/ai#12425, inspect_ai#5528), with the cost as `cost_in_usd_ticks`
  (1e10 a dollar; checked 2026-11-28).
- "azure": the Azure OpenAI v1 path `/openai/v1/chat/completions` is served
  too, and the key is read from the `api-key` header only.

The reasoning text is a fixed function of the prompt, so tests can expect it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

FLAVOURS = ("deepseek", "openrouter", "azure", "xai")
AZURE_CHAT_PATH = "/openai/v1/chat/completions"

# OpenRouter's provider object: field -> the JSON types it takes.
_PROVIDER_FIELDS: dict[str, tuple[type, ...]] = {
    "order": (list,), "only": (list,), "ignore": (list,), "quantizations": (list,),
    "allow_fallbacks": (bool,), "require_parameters": (bool,), "zdr": (bool,), "enforce_distillable_text": (bool,),
    "data_collection": (str,), "sort": (str, dict), "max_price": (dict,),
}
# USD per token the loopback bills on OpenRouter (usage.cost): any fixed rate will do.
OPENROUTER_COST_PER_TOKEN = 1e-6


class CompatError(ValueError):
    """A request the service refuses (a 400 with this message)."""


def check_flavour(flavour: str | None) -> None:
    if flavour is not None and flavour not in FLAVOURS:
        raise ValueError(f"unknown compat flavour {flavour!r} (known: {', '.join(FLAVOURS)})")


def presented_key(flavour: str | None, headers: Mapping[str, str]) -> str | None:
    """The key a request presents: Azure's `api-key` header, else the bearer token."""
    if flavour == "azure":
        return headers.get("api-key")
    authorization = headers.get("Authorization", "")
    return authorization[7:] if authorization.startswith("Bearer ") else None


def check_chat(flavour: str | None, body: Mapping[str, object]) -> None:
    """CompatError for a chat body the service refuses."""
    if flavour == "openrouter" and "provider" in body:
        _check_provider(body["provider"])


def _check_provider(provider: object) -> None:
    if provider is None:
        return
    if not isinstance(provider, dict):
        raise CompatError(f"provider: expected an object, received {type(provider).__name__}")
    for name, value in provider.items():
        types = _PROVIDER_FIELDS.get(name)
        if types is None:
            raise CompatError(f"provider: unrecognized key {name!r}")
        if not isinstance(value, types) or (isinstance(value, list) and not all(isinstance(x, str) for x in value)):
            raise CompatError(f"provider.{name}: invalid type {type(value).__name__}")


def reasoning_text(body: Mapping[str, object]) -> str:
    """The loopback's reasoning for a prompt: names the last user message's length."""
    messages = body.get("messages")
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"] if isinstance(messages, list) else []
    content = users[-1].get("content") if users else ""
    return f"Thinking about a question of {len(str(content))} characters before answering."


def _reasons(flavour: str, body: Mapping[str, object]) -> bool:
    model = str(body.get("model", ""))
    thinking_model = "reasoner" in model or "r1" in model
    if flavour == "deepseek":
        return thinking_model
    asked = body.get("include_reasoning") is True or isinstance(body.get("reasoning"), dict)
    return thinking_model and asked


def decorate(flavour: str | None, body: Mapping[str, object], data: dict[str, Any], output_tokens: int,
             count: Callable[[str], int]) -> int:
    """Give an OpenAI chat reply (`data`) the service's fields; the output
    tokens it now counts (the answer's plus the reasoning's)."""
    if flavour == "xai":
        return _xai(body, data, output_tokens, count)
    if flavour not in ("deepseek", "openrouter"):
        return output_tokens
    message, usage = data["choices"][0]["message"], data["usage"]
    reasoning = reasoning_text(body) if _reasons(flavour, body) else None
    hidden = count(reasoning) if reasoning else 0
    output_tokens += hidden
    usage["completion_tokens"] = output_tokens
    usage["total_tokens"] = usage["prompt_tokens"] + output_tokens
    usage["completion_tokens_details"] = {"reasoning_tokens": hidden}
    if flavour == "deepseek":
        message.pop("refusal", None)
        message.pop("annotations", None)
        message["reasoning_content"] = reasoning
        hit = usage.pop("prompt_tokens_details")["cached_tokens"]
        usage["prompt_cache_hit_tokens"] = hit
        usage["prompt_cache_miss_tokens"] = usage["prompt_tokens"] - hit
    else:
        message["reasoning"] = reasoning
        usage["cost"] = round((usage["prompt_tokens"] + output_tokens) * OPENROUTER_COST_PER_TOKEN, 9)
    return output_tokens


def _xai(body: Mapping[str, object], data: dict[str, Any], output_tokens: int, count: Callable[[str], int]) -> int:
    """xAI's usage: reasoning tokens beside completion_tokens, not in it; the cost in ticks."""
    usage = data["usage"]
    hidden = count(reasoning_text(body))
    usage["completion_tokens"] = output_tokens
    usage["completion_tokens_details"] = {"reasoning_tokens": hidden}
    usage["total_tokens"] = usage["prompt_tokens"] + output_tokens + hidden
    billed = output_tokens + hidden
    usage["cost_in_usd_ticks"] = round((usage["prompt_tokens"] + billed) * OPENROUTER_COST_PER_TOKEN * 1e10)
    return billed
