"""`tulving models --remote`: ask each keyed endpoint which models this key
can use (GET /v1/models, the kinds with the `list_models` capability), and
mark the aliases it does not list."""
from __future__ import annotations

import asyncio
import os

from engine.config import Config
from engine.errors import printable
from providers import make_provider
from providers.base import EndpointSpec, ProviderError
from providers.kinds import kind_of

LIST_TIMEOUT = 30.0


def _listable(config: Config) -> list[EndpointSpec]:
    """The endpoints of the configured aliases that can list their models and have their key (or need none)."""
    names = {e for alias in config.models.values() for e in alias.endpoints}
    specs = [config.endpoints[n] for n in sorted(names)]
    return [s for s in specs if kind_of(s).capabilities.list_models and (not s.key_env or os.environ.get(s.key_env))]


async def _list(config: Config, spec: EndpointSpec) -> set[str] | str:
    """The model ids the endpoint lists, or why it could not be asked (one line)."""
    provider = make_provider(spec, config.api_key(spec))
    try:
        list_models = getattr(provider, "list_models", None)
        if list_models is None:
            return "its provider cannot list models"
        return set(await list_models(timeout=min(spec.timeout, LIST_TIMEOUT)))
    except ProviderError as exc:
        return f"{exc.kind}" + (f" {exc.status}" if exc.status else "") + f": {exc.message}"
    finally:
        await provider.aclose()


async def remote_models(config: Config) -> tuple[dict[str, set[str]], list[str]]:
    """({endpoint: listed ids}, one line per endpoint that could not be asked)."""
    specs = _listable(config)
    answers = await asyncio.gather(*(_list(config, s) for s in specs))
    listed: dict[str, set[str]] = {}
    failures = []
    for spec, answer in zip(specs, answers):
        if isinstance(answer, str):
            failures.append(f"{spec.name}: model list unreachable ({printable(answer)})")
        else:
            listed[spec.name] = answer
    return listed, failures


def availability(config: Config, name: str, listed: dict[str, set[str]]) -> str:
    """Whether the key can use the alias: "listed", "not listed" (on some
    endpoint), or "-" (no endpoint of it was asked)."""
    alias = config.models[name]
    asked = [e for e in alias.endpoints if e in listed]
    if not asked:
        return "-"
    missing = [e for e in asked if alias.model not in listed[e]]
    return "listed" if not missing else "not listed" + (f" ({', '.join(missing)})" if len(asked) > 1 else "")
