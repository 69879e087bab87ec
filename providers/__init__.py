"""Provider registry: endpoint kind -> Provider class, imported lazily so that a
missing optional dependency (llama-cpp-python) only matters when used."""
from __future__ import annotations

import importlib

from providers.base import CONFIG, EndpointSpec, Provider, ProviderError

# kind -> "module:Class"
REGISTRY: dict[str, str] = {
    "openai": "providers.openai_http:OpenAIProvider",
    "anthropic": "providers.anthropic_http:AnthropicProvider",
    "local": "providers.local_llama:LocalLlamaProvider",
    "local-embed": "providers.local_embed:LocalEmbedProvider",
}


def register_kind(kind: str, target: str) -> None:
    """Add an endpoint kind served by `target` ("module:Class", imported when
    first used). Higher layers register their own kinds (engine/benchmark/builtin)."""
    REGISTRY[kind] = target


def provider_class(kind: str) -> type[Provider]:
    try:
        target = REGISTRY[kind]
    except KeyError:
        raise ProviderError(CONFIG, f"unknown endpoint kind {kind!r} (known: {', '.join(sorted(REGISTRY))})") from None
    module_name, _, cls_name = target.partition(":")
    cls: type[Provider] = getattr(importlib.import_module(module_name), cls_name)
    return cls


def make_provider(spec: EndpointSpec, api_key: str | None) -> Provider:
    return provider_class(spec.kind)(spec, api_key)
