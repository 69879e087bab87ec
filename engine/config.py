"""Configuration: endpoints (where calls go, under which limits) and model
aliases (an endpoint + a model name + default parameters).

A user's TOML file is merged over the built-in defaults below:

    [endpoints.vllm-a]
    kind = "openai"                      # openai | anthropic | local | local-embed | builtin
    base_url = "http://gpu-a:8000/v1"
    key_env = "VLLM_KEY"                 # variable holding the key; omit for none
    max_concurrency = 32
    rpm = 3000                           # requests / minute
    input_tpm = 2_000_000                # input tokens / minute
    output_tpm = 200_000                 # output tokens / minute
    timeout = 600                        # seconds per attempt
    max_attempts = 6

    [models.llama-70b]
    endpoints = ["vllm-a", "vllm-b"]     # replicas: each call goes where capacity is free
    model = "meta-llama/Llama-3.3-70B-Instruct"
    params = { temperature = 1.0, max_tokens = 4096 }
    price_in = 0.0                       # USD per million input tokens
    price_out = 0.0                      # USD per million output tokens

Any "endpoint/model-name" (e.g. "openai/gpt-4.1") also works as an alias
without being declared.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from engine.errors import TulvingError
from providers import REGISTRY
from providers.base import EndpointSpec

# The settings behind the published numbers: temperature 1.0, 4096 output tokens.
PAPER_PARAMS = {"temperature": 1.0, "max_tokens": 4096}


class ConfigError(TulvingError):
    """A malformed or inconsistent configuration; the message is one line."""


@dataclass(frozen=True, slots=True)
class ModelAlias:
    name: str
    endpoints: tuple[str, ...]
    model: str
    params: Mapping[str, Any] = field(default_factory=dict)
    price_in: float | None = None   # USD per 1M input tokens
    price_out: float | None = None  # USD per 1M output tokens
    # Reasoning models (o1/o3) take no system prompt, temperature or token limit.
    reasoning: bool = False
    context_tokens: int | None = None

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return ((self.price_in or 0.0) * input_tokens + (self.price_out or 0.0) * output_tokens) / 1e6


DEFAULT_ENDPOINTS: dict[str, dict[str, Any]] = {
    # Public APIs, with limits of a low usage tier; raise them in your config.
    "openai": {"kind": "openai", "base_url": "https://api.openai.com/v1", "key_env": "OPENAI_API_KEY",
               "max_concurrency": 64, "rpm": 500, "input_tpm": 800_000, "output_tpm": 800_000},
    "anthropic": {"kind": "anthropic", "base_url": "https://api.anthropic.com", "key_env": "ANTHROPIC_API_KEY",
                  "max_concurrency": 32, "rpm": 50, "input_tpm": 40_000, "output_tpm": 8_000},
    # Offline models: no key, no network. llama.cpp runs in a worker process;
    # two attempts, so a call whose worker died is retried once on a fresh one.
    "local": {"kind": "local", "max_concurrency": 1, "timeout": 1800, "max_attempts": 2},
    "local-embed": {"kind": "local-embed", "max_concurrency": 1, "timeout": 1800, "max_attempts": 1},
}

DEFAULT_MODELS: dict[str, dict[str, Any]] = {
    "gpt-4o": {"endpoint": "openai", "model": "gpt-4o-2024-08-06", "params": PAPER_PARAMS,
               "price_in": 2.5, "price_out": 10.0, "context_tokens": 128_000},
    "gpt-4o-mini": {"endpoint": "openai", "model": "gpt-4o-mini-2024-07-18", "params": PAPER_PARAMS,
                    "price_in": 0.15, "price_out": 0.6, "context_tokens": 128_000},
    "o3-mini": {"endpoint": "openai", "model": "o3-mini", "reasoning": True,
                "price_in": 1.1, "price_out": 4.4, "context_tokens": 200_000},
    "text-embedding-3-small": {"endpoint": "openai", "model": "text-embedding-3-small", "price_in": 0.02},
    "claude-3-5-sonnet": {"endpoint": "anthropic", "model": "claude-3-5-sonnet-20240620", "params": PAPER_PARAMS,
                          "price_in": 3.0, "price_out": 15.0, "context_tokens": 200_000},
    "claude-sonnet-4": {"endpoint": "anthropic", "model": "claude-sonnet-4-20250514", "params": PAPER_PARAMS,
                        "price_in": 3.0, "price_out": 15.0, "context_tokens": 200_000},
    # Offline models (see providers/local_llama.py, providers/local_embed.py).
    "local:smollm2": {"endpoint": "local", "model": "smollm2", "params": {"temperature": 0.0, "max_tokens": 256},
                      "context_tokens": 8192},
    "local:minilm": {"endpoint": "local-embed", "model": "all-MiniLM-L6-v2"},
}


def register_defaults(*, endpoints: Mapping[str, Mapping[str, Any]] = {},
                      models: Mapping[str, Mapping[str, Any]] = {}) -> None:
    """Add default endpoints and aliases from a higher layer (the benchmark's
    built-in models, engine/builtin): configs loaded afterwards include them."""
    DEFAULT_ENDPOINTS.update({name: dict(table) for name, table in endpoints.items()})
    DEFAULT_MODELS.update({name: dict(table) for name, table in models.items()})

_ENDPOINT_FIELDS = {f.name for f in fields(EndpointSpec)} - {"name"}
_MODEL_FIELDS = {"endpoint", "endpoints", "model", "params", "price_in", "price_out", "reasoning", "context_tokens"}


@dataclass(slots=True)
class Config:
    endpoints: dict[str, EndpointSpec]
    models: dict[str, ModelAlias]
    source: str = "built-in defaults"

    # -- loading -----------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike | None = None) -> "Config":
        """Built-in defaults, with the TOML file at `path` merged over them."""
        raw_endpoints = {k: dict(v) for k, v in DEFAULT_ENDPOINTS.items()}
        raw_models = {k: dict(v) for k, v in DEFAULT_MODELS.items()}
        source = "built-in defaults"
        if path is not None:
            path = Path(path)
            try:
                data = tomllib.loads(path.read_text())
            except FileNotFoundError:
                raise ConfigError(f"config file {path} not found") from None
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
            unknown = set(data) - {"endpoints", "models"}
            if unknown:
                raise ConfigError(f"{path}: unknown top-level section(s) {sorted(unknown)} (expected endpoints, models)")
            for name, table in data.get("endpoints", {}).items():
                if not isinstance(table, dict):
                    raise ConfigError(f"{path}: [endpoints.{name}] must be a table")
                raw_endpoints[name] = {**raw_endpoints.get(name, {}), **table}
            for name, table in data.get("models", {}).items():
                if not isinstance(table, dict):
                    raise ConfigError(f"{path}: [models.{name}] must be a table")
                raw_models[name] = table
            source = str(path)
        return cls.from_dicts(raw_endpoints, raw_models, source=source)

    @classmethod
    def from_dicts(cls, endpoints: Mapping[str, Mapping[str, Any]], models: Mapping[str, Mapping[str, Any]],
                   source: str = "dict") -> "Config":
        eps = {name: _endpoint(name, table, source) for name, table in endpoints.items()}
        config = cls(endpoints=eps, models={}, source=source)
        for name, table in models.items():
            config.models[name] = _alias(name, table, eps, source)
        return config

    # -- lookups -----------------------------------------------------------------
    def alias(self, name: str) -> ModelAlias:
        """The alias `name`, or an ad-hoc one for "endpoint/model-name"."""
        found = self.models.get(name)
        if found is not None:
            return found
        endpoint, sep, model = name.partition("/")
        if sep and endpoint in self.endpoints and model:
            alias = ModelAlias(name=name, endpoints=(endpoint,), model=model, params=dict(PAPER_PARAMS))
            self.models[name] = alias
            return alias
        raise ConfigError(f"unknown model {name!r}: declare it under [models] or write endpoint/model "
                          f"(known aliases: {', '.join(sorted(self.models))})")

    def endpoints_of(self, alias: ModelAlias) -> list[EndpointSpec]:
        return [self.endpoints[e] for e in alias.endpoints]

    def api_key(self, endpoint: EndpointSpec) -> str | None:
        """The key for `endpoint` from its environment variable; a clear error
        when it is needed and missing."""
        if not endpoint.key_env:
            return None
        key = os.environ.get(endpoint.key_env)
        if not key:
            raise ConfigError(f"endpoint {endpoint.name!r} needs an API key: set the environment variable "
                              f"{endpoint.key_env}")
        return key


def _endpoint(name: str, table: Mapping[str, Any], source: str) -> EndpointSpec:
    unknown = set(table) - _ENDPOINT_FIELDS
    if unknown:
        raise ConfigError(f"{source}: [endpoints.{name}] has unknown key(s) {sorted(unknown)}")
    if "kind" not in table:
        raise ConfigError(f"{source}: [endpoints.{name}] needs a kind")
    if table["kind"] not in REGISTRY:
        raise ConfigError(f"{source}: [endpoints.{name}] has unknown kind {table['kind']!r} "
                          f"(known: {', '.join(sorted(REGISTRY))})")
    numeric = ("max_concurrency", "rpm", "input_tpm", "output_tpm", "timeout", "total_timeout", "max_attempts")
    for key in numeric:
        value = table.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0):
            raise ConfigError(f"{source}: [endpoints.{name}] {key} must be a positive number, got {value!r}")
    options = table.get("options") or {}
    if not isinstance(options, Mapping):
        raise ConfigError(f"{source}: [endpoints.{name}] options must be a table, got {options!r}")
    if "http_client" in options:
        from providers.http_client import HTTP_CLIENTS

        if options["http_client"] not in HTTP_CLIENTS:
            raise ConfigError(f"{source}: [endpoints.{name}] options.http_client must be one of "
                              f"{', '.join(HTTP_CLIENTS)}, got {options['http_client']!r}")
    return EndpointSpec(name=name, **dict(table))


def _alias(name: str, table: Mapping[str, Any], endpoints: Mapping[str, EndpointSpec], source: str) -> ModelAlias:
    unknown = set(table) - _MODEL_FIELDS
    if unknown:
        raise ConfigError(f"{source}: [models.{name}] has unknown key(s) {sorted(unknown)}")
    names = table.get("endpoints") or ([table["endpoint"]] if "endpoint" in table else [])
    if isinstance(names, str):
        names = [names]
    if not names:
        raise ConfigError(f"{source}: [models.{name}] needs endpoint or endpoints")
    for e in names:
        if e not in endpoints:
            raise ConfigError(f"{source}: [models.{name}] names unknown endpoint {e!r}")
    if "model" not in table:
        raise ConfigError(f"{source}: [models.{name}] needs model (the provider's model name)")
    params = table.get("params", {})
    if not isinstance(params, dict):
        raise ConfigError(f"{source}: [models.{name}] params must be a table")
    return ModelAlias(name=name, endpoints=tuple(names), model=str(table["model"]), params=dict(params),
                      price_in=table.get("price_in"), price_out=table.get("price_out"),
                      reasoning=bool(table.get("reasoning", False)), context_tokens=table.get("context_tokens"))
