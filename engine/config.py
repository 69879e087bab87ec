"""Configuration: endpoints (where calls go, under which limits) and model
aliases (an endpoint + a model name + default parameters).

A user's TOML file is merged over the built-in defaults below:

    [endpoints.vllm-a]
    kind = "openai"                      # a provider kind: `tulving config reference` lists them
    base_url = "http://gpu-a:8000/v1"
    key_env = "VLLM_KEY"                 # variable holding the key; omit for none
    max_concurrency = 32
    rpm = 3000                           # requests / minute
    input_tpm = 2_000_000                # input tokens / minute
    output_tpm = 200_000                 # output tokens / minute
    # tpm = 450_000                      # or: prompt + max_tokens / minute, as OpenAI counts
    timeout = 600                        # seconds per attempt
    max_attempts = 6

    [models.llama-70b]
    endpoints = ["vllm-a", "vllm-b"]     # replicas: each call goes where capacity is free
    model = "meta-llama/Llama-3.3-70B-Instruct"
    params = { temperature = 1.0, max_tokens = 4096 }
    price_in = 0.0                       # USD per million input tokens
    price_out = 0.0                      # USD per million output tokens
    price_cached_in = 0.0                # ...input tokens read from the provider's prompt cache (default price_in)
    price_cache_write = 0.0              # ...input tokens written to it (default price_in)
    price_cache_write_1h = 0.0           # ...written to Anthropic's 1-hour cache (default 2x price_in
                                         #    when price_cache_write is set, else price_cache_write)
    batch_discount = 0.5                 # share of the price a batch-API call costs, in (0, 1]
    prices = [{ above = 272_000, price_in = 4.0, price_out = 15.0 },   # prompts over 272K tokens
              { until = 2026-12-31, price_in = 0.0 }]                   # a price in force until a date
    free = true                          # calls cost nothing (a server of your own): no price needed

    [cache]                              # the response cache (engine/cache_section.py)
    url = "postgresql://tulving@dbhost/tulving"
    password_env = "TULVING_CACHE_PASSWORD"

Any "endpoint/model-name" (e.g. "openai/gpt-4.1") also works as an alias
without being declared.
"""
from __future__ import annotations

import datetime
import math
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from engine.cache_section import CacheSettings, cache_settings
from engine.errors import TulvingError, did_you_mean
from engine.prices import BAND_KEYS, PRICE_FIELDS, PriceBand, band_of, price_band
from providers.base import EndpointSpec, ProviderError
from providers.kinds import KindRegistry, OptionError, ProviderKind, registry, validate_options
from providers.models_common import PAPER_PARAMS, PROVIDER_NAMES, inferred_settings

__all__ = ["PAPER_PARAMS", "Config", "ConfigError", "ModelAlias", "default_tables"]


# A TOML table as read: keys to values of any TOML type, checked before use.
Table = dict[str, object]


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
    # USD per 1M input tokens written to Anthropic's 1-hour cache (batches use it).
    # Unset: 2x the input price, as Anthropic prices it (checked 2026-11-26), for
    # an alias that prices cache writes (price_cache_write set); else the write price.
    price_cache_write_1h: float | None = None
    price_cached_in: float | None = None    # USD per 1M input tokens read from the provider's prompt cache
    price_cache_write: float | None = None  # USD per 1M input tokens written to it
    batch_discount: float = 0.5             # share of the price a batch-API call costs
    # How the call is made, per model, as the reference made it (see MODEL_KEYS):
    system_prompt: bool = True              # false: the system message is not sent
    token_param: str | None = None          # the wire name of the output-token limit ("none": not sent)
    long_prompt_tokens: int | None = None   # above this many prompt tokens...
    long_prompt_model: str | None = None    # ...the call goes to this alias instead
    # Where the model stands with its provider (dates as YYYY-MM-DD):
    retired: str | None = None              # the provider retired it: no call may name it
    shutdown: str | None = None             # the provider shuts it down that day (still served before it)
    replacement: str | None = None          # the alias the provider recommends instead
    checked: str | None = None              # when id, prices and status were checked in the provider's docs
    # Prices by date and prompt length (engine/prices.py): a band's prices win over the ones above
    # for the calls it holds (its dates, prompts over its `above` tokens).
    prices: tuple[PriceBand, ...] = ()
    free: bool = False                      # the config says its calls cost nothing (a server of one's own)
    legacy: bool = False                    # still served, no longer updated: `replacement` is its successor

    def retired_on(self, today: str | None = None) -> str | None:
        """The day the model was retired (its `retired` date, or a `shutdown`
        date already passed), or None while it is served."""
        if self.retired is not None:
            return self.retired
        today = today or datetime.date.today().isoformat()
        return self.shutdown if self.shutdown is not None and self.shutdown <= today else None

    def status(self, today: str | None = None) -> str:
        """Where the model stands, for `tulving models`: current, shuts down
        on D, or retired on D (and its replacement)."""
        retired = self.retired_on(today)
        if retired is not None:
            return f"retired on {retired}" + (f" -> {self.replacement}" if self.replacement else "")
        if self.shutdown is not None:
            return f"shuts down on {self.shutdown}" + (f" -> {self.replacement}" if self.replacement else "")
        if self.legacy:
            return "legacy" + (f" -> {self.replacement}" if self.replacement else "")
        return "current"

    @property
    def priced(self) -> bool:
        return self.price_in is not None or self.price_out is not None

    def band(self, input_tokens: int, day: str | None = None) -> PriceBand | None:
        """The price band a call of `input_tokens` prompt tokens on `day`
        (default today) is priced by; None: the base prices."""
        return price_band(self.prices, input_tokens, day)

    def at(self, input_tokens: int, day: str | None = None) -> ModelAlias:
        """This alias with the prices in force for such a call (itself when no band holds it)."""
        band = self.band(input_tokens, day)
        return self if band is None else replace(self, prices=(), **band.prices())

    @property
    def sends_system(self) -> bool:
        """Whether the system message is sent (not to reasoning models, nor
        where the reference sent the user prompt only)."""
        return self.system_prompt and not self.reasoning

    def cost(self, input_tokens: int, output_tokens: int, *, cache_read: int = 0, cache_write: int = 0,
             cache_write_1h: int = 0, batch: bool = False, day: str | None = None) -> float:
        """USD of one call on `day` (default today), at the prices in force
        then for its prompt length (`prices`). `input_tokens` counts the whole
        prompt, of which `cache_read` / `cache_write` tokens are priced at the
        prompt-cache prices (the plain input price where none is set);
        `cache_write_1h` of the writes went to the 1-hour cache, at its price."""
        if self.prices and (band := self.band(input_tokens, day)) is not None:
            return replace(self, prices=(), **band.prices()).cost(input_tokens, output_tokens, cache_read=cache_read,
                                                   cache_write=cache_write, cache_write_1h=cache_write_1h,
                                                   batch=batch)
        price_in = self.price_in or 0.0
        plain = max(0, input_tokens - cache_read - cache_write)
        cache_write_1h = min(cache_write_1h, cache_write)
        read_price = price_in if self.price_cached_in is None else self.price_cached_in
        write_price = price_in if self.price_cache_write is None else self.price_cache_write
        write_1h_price = self.price_cache_write_1h
        if write_1h_price is None:
            write_1h_price = write_price if self.price_cache_write is None else 2.0 * price_in
        total = (price_in * plain + read_price * cache_read + write_price * (cache_write - cache_write_1h)
                 + write_1h_price * cache_write_1h + (self.price_out or 0.0) * output_tokens) / 1e6
        return total * self.batch_discount if batch else total


# What no provider kind declares: the offline models' endpoints and aliases. The
# OpenAI and Anthropic endpoints and their dated aliases (prices, status, call
# settings) are the `openai` / `anthropic` kinds' (providers/models_openai.py,
# providers/models_anthropic.py); the built-in benchmark models are the `builtin` kind's.
DEFAULT_ENDPOINTS: dict[str, Table] = {
    # Offline models: no key, no network. llama.cpp runs in a worker process;
    # two attempts, so a call whose worker died is retried once on a fresh one.
    "local": {"kind": "local", "max_concurrency": 1, "timeout": 1800, "max_attempts": 2},
    "local-embed": {"kind": "local-embed", "max_concurrency": 1, "timeout": 1800, "max_attempts": 1},
}

DEFAULT_MODELS: dict[str, Table] = {
    # Offline models (see providers/local_llama.py, providers/local_embed.py).
    "local:smollm2": {"endpoint": "local", "model": "smollm2", "params": {"temperature": 0.0, "max_tokens": 256},
                      "context_tokens": 8192},
    "local:minilm": {"endpoint": "local-embed", "model": "all-MiniLM-L6-v2"},
}


def default_tables() -> tuple[dict[str, Table], dict[str, Table]]:
    """The built-in endpoints and aliases: those above, and those the installed
    provider kinds bring (the `builtin` endpoint and `builtin:*` aliases),
    gathered now rather than registered by an import."""
    endpoints = {name: dict(table) for name, table in DEFAULT_ENDPOINTS.items()}
    models = {name: dict(table) for name, table in DEFAULT_MODELS.items()}
    for kind in _kinds().all():
        endpoints.update({name: dict(table) for name, table in kind.default_endpoints.items()})
        models.update({name: dict(table) for name, table in kind.default_models.items()})
    return endpoints, models


def _kinds() -> KindRegistry:
    """The installed kinds; their one-line failure (no package metadata) as a ConfigError."""
    try:
        return registry()
    except ProviderError as exc:
        raise ConfigError(exc.message) from None


# Every key of an [endpoints.NAME] table: (type, default, what it means). The
# configuration reference (`tulving config reference`) is generated from these
# and from each kind's option schema (providers/kinds.py).
ENDPOINT_KEYS: dict[str, tuple[str, str, str]] = {
    "kind": ("string", "required", "the provider kind (see the kinds below)"),
    "base_url": ("http(s) URL", "the kind's public API", "where calls go"),
    "key_env": ("string", "none", "environment variable holding the API key (the key itself is never stored)"),
    "max_concurrency": ("int, 1..100000", "16", "calls in flight at once"),
    "rpm": ("number > 0", "none", "requests per minute"),
    "input_tpm": ("number > 0", "none", "input tokens per minute"),
    "output_tpm": ("number > 0", "none", "output tokens per minute"),
    "tpm": ("number > 0", "none", "tokens per minute counting prompt + max_tokens when the call starts, as OpenAI "
                                  "counts its TPM (checked 2026-11-26); input_tpm counts the prompt alone"),
    "timeout": ("number > 0", "600", "seconds per attempt"),
    "total_timeout": ("number > 0", "none", "seconds per request over all its attempts"),
    "max_attempts": ("int >= 1", "6", "attempts per call (retryable failures are retried with backoff)"),
    "max_retry_after": ("number >= 0", "60", "a server's longer retry-after is capped to this many seconds"),
    "options": ("table", "{}", "options of the endpoint's kind (see the kinds below)"),
    "free": ("bool", "false", "calls to this endpoint cost nothing (a server of your own): its models need no "
             "price; without it only offline kinds are free"),
}
# Every key of a [models.NAME] table, likewise.
MODEL_KEYS: dict[str, tuple[str, str, str]] = {
    "endpoint": ("string", "-", "the endpoint serving this model (or endpoints)"),
    "endpoints": ("list of strings", "-", "replicas: each call goes where capacity is free"),
    "model": ("string", "required", "the provider's model name"),
    "params": ("table", "{}", "default request parameters (temperature >= 0, max_tokens >= 1, ...)"),
    "price_in": ("number >= 0", "0", "USD per million input tokens"),
    "price_out": ("number >= 0", "0", "USD per million output tokens"),
    "price_cached_in": ("number >= 0", "price_in", "USD per million input tokens read from the prompt cache"),
    "price_cache_write": ("number >= 0", "price_in", "USD per million input tokens written to the prompt cache"),
    "price_cache_write_1h": ("number >= 0", "2x price_in if price_cache_write is set, else price_cache_write",
                             "USD per million input tokens written to Anthropic's 1-hour prompt cache (batches)"),
    "batch_discount": ("number in (0, 1]", "0.5", "share of the price a batch-API call costs"),
    "context_tokens": ("int >= 1", "none", "the model's context window, in tokens"),
    "reasoning": ("bool", "false", "a reasoning model (o1/o3): no system prompt, temperature or token limit"),
    "system_prompt": ("bool", "true", "false: the system message is not sent (the reference called Gemini so)"),
    "token_param": ("max_tokens | max_completion_tokens | none", "as params name it",
                    "the name the output-token limit is sent under (current OpenAI models take max_completion_tokens)"),
    "long_prompt_tokens": ("int >= 1", "none", "prompts over this many tokens (cl100k) go to long_prompt_model"),
    "long_prompt_model": ("alias", "none", "the alias serving prompts over long_prompt_tokens"),
    "retired": ("date YYYY-MM-DD", "none", "the provider retired the model that day: a run naming it stops first"),
    "replacement": ("alias", "none", "the alias the provider recommends in place of a retired one"),
    "shutdown": ("date YYYY-MM-DD", "none", "the provider shuts the model down that day: from then on it is "
                 "retired (`tulving models` shows the date before)"),
    "checked": ("date YYYY-MM-DD", "none", "when the model id, prices and status were checked"),
    "prices": ("list of tables", "[]", "price bands: {above = tokens, since = date, until = date, price_in, "
               "price_out, ...}: prices in force over those dates for prompts over `above` tokens (the "
               "highest `above` in force wins; a price a band leaves out is the alias's own)"),
    "free": ("bool", "false", "its calls cost nothing (a server of your own): no price needed, counted as $0"),
    "legacy": ("bool", "false", "the provider still serves it but calls it legacy: `replacement` names its successor"),
}
TOKEN_PARAMS = ("max_tokens", "max_completion_tokens", "none")
_ENDPOINT_FIELDS = {f.name for f in fields(EndpointSpec)} - {"name"}
_MODEL_FIELDS = set(MODEL_KEYS)


@dataclass(slots=True)
class Config:
    endpoints: dict[str, EndpointSpec]
    models: dict[str, ModelAlias]
    source: str = "built-in defaults"
    cache: CacheSettings = field(default_factory=CacheSettings)  # the file's [cache] section
    # The file's [memories.NAME] tables, as written: the memory systems' registry
    # (engine/benchmark/memory/registry.py) reads and checks them.
    memories: dict[str, object] = field(default_factory=dict)

    # -- loading -----------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> Config:
        """Built-in defaults, with the TOML file at `path` merged over them."""
        # The file first: a malformed one is told before the provider kinds' modules load.
        data = _read_toml(Path(path)) if path is not None else None
        raw_endpoints, raw_models = default_tables()
        source = "built-in defaults"
        cache = CacheSettings()
        memories: dict[str, object] = {}
        if path is not None and data is not None:
            path = Path(path)
            unknown = set(data) - {"endpoints", "models", "cache", "memories"}
            if unknown:
                raise ConfigError(f"{path}: unknown top-level section(s) {sorted(unknown)} "
                                  f"(expected endpoints, models, cache, memories)")
            memories = dict(_tables(data, "memories", path))
            for name, table in _tables(data, "endpoints", path).items():
                raw_endpoints[name] = {**raw_endpoints.get(name, {}), **table}
            declared = _tables(data, "models", path)
            raw_models.update({name: _priced_from_registry(table, raw_models) for name, table in declared.items()})
            cache = cache_settings(data, path)
            source = str(path)
        config = cls.from_dicts(raw_endpoints, raw_models, source=source)
        config.cache = cache
        config.memories = memories
        return config

    @staticmethod
    def cache_section(path: str | os.PathLike[str]) -> CacheSettings:
        """The [cache] section of the config file at `path` alone (the rest
        is checked when a command loads the whole config)."""
        path = Path(path)
        return cache_settings(_read_toml(path), path)

    @classmethod
    def from_dicts(cls, endpoints: Mapping[str, Mapping[str, object]], models: Mapping[str, Mapping[str, object]],
                   source: str = "dict") -> Config:
        eps = {name: _endpoint(name, table, source) for name, table in endpoints.items()}
        config = cls(endpoints=eps, models={}, source=source)
        for name, table in models.items():
            config.models[name] = _alias(name, table, eps, source)
        for alias in config.models.values():
            _check_long_prompt_route(alias, config.models, source)
        return config

    # -- lookups -----------------------------------------------------------------
    def alias(self, name: str) -> ModelAlias:
        """The alias `name`, or an ad-hoc one for "endpoint/model-name"."""
        found = self.models.get(name)
        if found is not None:
            return found
        endpoint, sep, model = name.partition("/")
        if sep and endpoint in self.endpoints and model:
            alias = self._ad_hoc(name, endpoint, model)
            self.models[name] = alias
            return alias
        guess = did_you_mean(name, self.models)
        raise ConfigError(f"unknown model {name!r}{': ' + guess if guess else ''} (`tulving models` lists the "
                          f"{len(self.models)} aliases with their status; for another model, declare it under "
                          f"[models] of your config or write endpoint/model)")

    def _ad_hoc(self, name: str, endpoint: str, model: str) -> ModelAlias:
        """"endpoint/model": a declared alias's settings and prices when one of
        the same kind serves that model (under any of its names:
        `same_model`), else the settings the id implies, with the prices and
        dates of an alias of another kind serving it (a proxy speaking one
        wire for another provider's model), else unpriced."""
        kind = self.endpoints[endpoint].kind
        other: ModelAlias | None = None
        for known in self.models.values():
            if not same_model(known, model):
                continue
            if self.endpoints[known.endpoints[0]].kind == kind:
                return replace(known, name=name, endpoints=(endpoint,), model=model)
            other = other or known
        inferred = inferred_settings(kind, model)
        alias = ModelAlias(name=name, endpoints=(endpoint,), model=model, params=dict(PAPER_PARAMS),
                           reasoning=bool(inferred.get("reasoning", False)),
                           token_param=inferred.get("token_param"))
        if other is None:
            return alias
        return replace(alias, **{f: getattr(other, f) for f in (*PRICE_FIELDS, "prices", "batch_discount", "retired",
                                                                "shutdown", "replacement", "checked",
                                                                "context_tokens")})

    def is_free(self, alias: ModelAlias) -> bool:
        """Whether calls to `alias` cost nothing: its config says so (the
        alias's or every endpoint's `free = true`), or every endpoint is of
        an offline kind (local, built-in). Never by address: a proxy on
        localhost bills like the API behind it."""
        return alias.free or all(self._free_endpoint(self.endpoints[e]) for e in alias.endpoints)

    @staticmethod
    def _free_endpoint(spec: EndpointSpec) -> bool:
        # An offline kind has no HTTP options (no headers): local, local-embed, builtin.
        return spec.free or _kinds().get(spec.kind).option("headers") is None

    def retirement(self, alias: ModelAlias) -> str | None:
        """The one line that stops a call to a retired model, or None."""
        retired = alias.retired_on()
        if retired is None:
            return None
        kind = self.endpoints[alias.endpoints[0]].kind
        use = f"use {alias.replacement} " if alias.replacement else ""
        return (f"{alias.name} ({alias.model}) was retired by {PROVIDER_NAMES.get(kind, kind)} on {retired}: "
                f"{use}(or declare the alias in your config to call it anyway, e.g. through a proxy that "
                f"still serves it)")

    def check_callable(self, names: Iterable[str], *, max_cost: float | None = None) -> None:
        """Stop, before any call, a command that would call a retired model,
        or one without a price under a spending cap (one ConfigError line)."""
        for name in names:
            alias = self.alias(name)
            line = self.retirement(alias)
            if line is not None:
                raise ConfigError(line)
            if max_cost is not None and not alias.priced and not self.is_free(alias):
                raise ConfigError(f"--max-cost cannot bound {name}: it has no price; declare an alias for it "
                                  f"with price_in and price_out (USD per million tokens) under [models.NAME]")

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


def _priced_from_registry(table: Table, shipped: Mapping[str, Table]) -> Table:
    """A declared alias that names no price (and is not `free`) takes the
    prices of the shipped alias serving the same model (`same_model`), so
    declaring a model anew (another endpoint, a proxy) does not make it free."""
    model = table.get("model")
    if not isinstance(model, str) or table.get("free") or any(k in table for k in (*PRICE_FIELDS, "prices")):
        return table
    for name, known in shipped.items():
        known_model = known.get("model")
        if isinstance(known_model, str) and (model == known_model or _undated(model) in (_undated(known_model), name)):
            priced = {k: known[k] for k in (*PRICE_FIELDS, "prices", "batch_discount") if k in known}
            return {**priced, **table}
    return table


# A dated snapshot's suffix: OpenAI's -2025-08-07, Anthropic's -20251001.
_SNAPSHOT = re.compile(r"-(?:\d{4}-\d{2}-\d{2}|\d{8})$")


def _undated(model: str) -> str:
    """A model id without a routing prefix ("openai/", a proxy's) or a snapshot date."""
    return _SNAPSHOT.sub("", model.rsplit("/", 1)[-1])


def same_model(known: ModelAlias, model: str) -> bool:
    """Whether `model` names the model `known` serves, under any of the names
    a provider serves it by (checked 2026-11-28: OpenAI serves `gpt-5` and
    its snapshot `gpt-5-2025-08-07`, Anthropic `claude-haiku-4-5` and
    `claude-haiku-4-5-20251001`, and proxies such as LiteLLM and OpenRouter
    prefix them "openai/"): the exact id, the alias's own name, or the same
    id without a prefix or a snapshot date."""
    if model in (known.model, known.name):
        return True
    bare = _undated(model)
    return bare in (_undated(known.model), known.name) and "/" not in known.name


# -- the schema ---------------------------------------------------------------------
# Every key of an endpoint and model table is checked at load: its type, its
# range, finite numbers, well-formed URLs and headers. A violation is one
# ConfigError line naming the file, the table and the key.

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _tables(data: Table, section: str, path: Path) -> dict[str, Table]:
    """The [section.NAME] tables of a config file."""
    found = data.get(section, {})
    if not isinstance(found, dict):
        raise ConfigError(f"{path}: {section} must be a table of [{section}.NAME] tables, got {found!r}")
    for name, table in found.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [{section}.{name}] must be a table")
    return found


def _where(source: str, section: str, name: str, key: str | None = None) -> str:
    return f"{source}: [{section}.{name}]" + (f" {key}" if key else "")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _positive(table: Mapping[str, object], key: str, where: str, *, integer: bool = False,
              allow_zero: bool = False) -> float | None:
    """The number at `key` (None when unset), checked: finite (a whole number
    when `integer`), > 0 (>= 0 when `allow_zero`)."""
    value = table.get(key)
    if value is None:
        return None
    ok = (type(value) is int) if integer else _is_number(value)
    if not ok or not isinstance(value, int | float) or value < 0 or (value == 0 and not allow_zero):
        what = "a whole number" if integer else "a finite number"
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{where} {key} must be {what} {bound}, got {value!r}")
    return value


def check_base_url(value: object, where: str) -> None:
    """An http(s) URL with a host (a path and a query are kept; no fragment)."""
    if not isinstance(value, str):
        raise ConfigError(f"{where} base_url must be a string URL, got {value!r}")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{where} base_url must start with http:// or https://, got {value!r}")
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise ConfigError(f"{where} base_url {value!r} is not a valid URL ({exc})") from None
    if not host:
        raise ConfigError(f"{where} base_url {value!r} has no host")
    if parts.fragment or any(c.isspace() or ord(c) < 32 for c in value):
        raise ConfigError(f"{where} base_url {value!r} must not hold a fragment, spaces or control characters")
    del port


def _check_options(options: object, kind: ProviderKind, where: str) -> dict[str, object]:
    """The endpoint's options checked against its kind's schema (providers/kinds.py)."""
    try:
        return validate_options(kind, {} if options is None else options)
    except OptionError as exc:
        raise ConfigError(f"{where} {exc}") from None


def _kind(table: Mapping[str, object], where: str) -> ProviderKind:
    if "kind" not in table:
        raise ConfigError(f"{where} needs a kind")
    name = table["kind"]
    known = _kinds()
    if not isinstance(name, str) or name not in known:
        raise ConfigError(f"{where} has unknown kind {name!r} (known: {', '.join(known.names())})")
    return known.get(name)


def _read_toml(path: Path) -> Table:
    """The TOML file at `path`; one ConfigError line for every way it can fail."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a folder, not a file") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None


def _endpoint(name: str, table: Mapping[str, object], source: str) -> EndpointSpec:
    where = _where(source, "endpoints", name)
    unknown = set(table) - _ENDPOINT_FIELDS
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {sorted(unknown)}")
    kind = _kind(table, where)
    if table.get("base_url") is not None:
        check_base_url(table["base_url"], where)
    key_env = table.get("key_env")
    if key_env is not None and (not isinstance(key_env, str) or not _ENV_NAME.fullmatch(key_env)):
        raise ConfigError(f"{where} key_env must name an environment variable, got {key_env!r}")
    numbers = {key: _positive(table, key, where) for key in ("rpm", "input_tpm", "output_tpm", "tpm",
                                                               "timeout", "total_timeout")}
    numbers["max_retry_after"] = _positive(table, "max_retry_after", where, allow_zero=True)
    for key in ("max_concurrency", "max_attempts"):
        numbers[key] = _positive(table, key, where, integer=True)
    concurrency = numbers["max_concurrency"]
    if concurrency is not None and concurrency > 100_000:
        raise ConfigError(f"{where} max_concurrency must be at most 100000, got {concurrency!r}")
    unset = EndpointSpec(name=name, kind=kind.name)  # its defaults

    def number(key: str, default: float) -> float:
        value = numbers[key]
        return default if value is None else value

    return EndpointSpec(
        name=name, kind=kind.name, base_url=_text(table, "base_url"), key_env=_text(table, "key_env"),
        max_concurrency=int(number("max_concurrency", unset.max_concurrency)), rpm=numbers["rpm"],
        input_tpm=numbers["input_tpm"], output_tpm=numbers["output_tpm"], tpm=numbers["tpm"], timeout=number("timeout", unset.timeout),
        total_timeout=numbers["total_timeout"], max_attempts=int(number("max_attempts", unset.max_attempts)),
        max_retry_after=number("max_retry_after", unset.max_retry_after), free=_flag(table, "free", where),
        options=_check_options(table.get("options"), kind, where))


def _text(table: Mapping[str, object], key: str) -> str | None:
    value = table.get(key)
    return value if isinstance(value, str) else None


def _alias(name: str, table: Mapping[str, object], endpoints: Mapping[str, EndpointSpec], source: str) -> ModelAlias:
    where = _where(source, "models", name)
    unknown = set(table) - _MODEL_FIELDS
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {sorted(unknown)}")
    names = _alias_endpoints(table, endpoints, where)
    if "model" not in table:
        raise ConfigError(f"{where} needs model (the provider's model name)")
    if not isinstance(table["model"], str) or not table["model"].strip():
        raise ConfigError(f"{where} model must be a non-empty string, got {table['model']!r}")
    params = _params(table.get("params", {}), where)
    prices = _check_prices(table, where)
    context = _positive(table, "context_tokens", where, integer=True)
    for key in ("reasoning", "system_prompt"):
        _flag(table, key, where)
    long_tokens = _positive(table, "long_prompt_tokens", where, integer=True)
    return ModelAlias(name=name, endpoints=names, model=table["model"], params=params,
                      reasoning=bool(table.get("reasoning", False)), price_cache_write_1h=prices["price_cache_write_1h"],
                      context_tokens=None if context is None else int(context), price_in=prices["price_in"],
                      price_out=prices["price_out"], price_cached_in=prices["price_cached_in"],
                      price_cache_write=prices["price_cache_write"], batch_discount=_discount(table, where),
                      system_prompt=bool(table.get("system_prompt", True)), token_param=_token_param(table, where),
                      long_prompt_tokens=None if long_tokens is None else int(long_tokens),
                      long_prompt_model=_optional_str(table, "long_prompt_model", where),
                      retired=_date(table, "retired", where), shutdown=_date(table, "shutdown", where),
                      replacement=_optional_str(table, "replacement", where),
                      checked=_date(table, "checked", where), prices=_bands(table.get("prices"), where),
                      free=_flag(table, "free", where), legacy=_flag(table, "legacy", where))


def _flag(table: Mapping[str, object], key: str, where: str) -> bool:
    """A true/false key (false when unset)."""
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where} {key} must be true or false, got {value!r}")
    return value


def _bands(value: object, where: str) -> tuple[PriceBand, ...]:
    """The `prices` list of an alias: tables of a band each (engine/prices.py), checked."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{where} prices must be a list of tables {{above, since, until, price_in, ...}}, "
                          f"got {value!r}")
    bands = []
    for i, table in enumerate(value):
        at = f"{where} prices[{i}]"
        if not isinstance(table, Mapping):
            raise ConfigError(f"{at} must be a table, got {table!r}")
        unknown = set(table) - set(BAND_KEYS)
        if unknown:
            raise ConfigError(f"{at} has unknown key(s) {sorted(unknown)} (known: {', '.join(BAND_KEYS)})")
        _check_prices(table, at)
        above = table.get("above", 0)
        if type(above) is not int or above < 0:
            raise ConfigError(f"{at} above must be a whole number of prompt tokens >= 0, got {above!r}")
        since, until = _date(table, "since", at), _date(table, "until", at)
        if since and until and since > until:
            raise ConfigError(f"{at} since {since} is after until {until}")
        if not any(key in table for key in PRICE_FIELDS):
            raise ConfigError(f"{at} sets no price (price_in, price_out, ...)")
        bands.append(band_of({**table, "since": since, "until": until}))
    return tuple(bands)


def _check_long_prompt_route(alias: ModelAlias, models: Mapping[str, ModelAlias], source: str) -> None:
    where = _where(source, "models", alias.name)
    if (alias.long_prompt_tokens is None) != (alias.long_prompt_model is None):
        raise ConfigError(f"{where} needs both long_prompt_tokens and long_prompt_model, or neither")
    target = alias.long_prompt_model
    if target is not None and (target not in models or target == alias.name):
        raise ConfigError(f"{where} long_prompt_model names {target!r}, which is not another declared alias")


def _token_param(table: Mapping[str, object], where: str) -> str | None:
    value = table.get("token_param")
    if value is not None and value not in TOKEN_PARAMS:
        raise ConfigError(f"{where} token_param must be one of {', '.join(TOKEN_PARAMS)}, got {value!r}")
    return None if value is None else str(value)


def _optional_str(table: Mapping[str, object], key: str, where: str) -> str | None:
    value = table.get(key)
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigError(f"{where} {key} must be a non-empty string, got {value!r}")
    return value


def _date(table: Mapping[str, object], key: str, where: str) -> str | None:
    """A YYYY-MM-DD date (TOML may give it as a date or a string)."""
    value = table.get(key)
    if value is None:
        return None
    text = value.isoformat() if isinstance(value, datetime.date) else value
    if not isinstance(text, str) or not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        raise ConfigError(f"{where} {key} must be a date YYYY-MM-DD, got {value!r}")
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{where} {key} is not a calendar date: {text!r}") from None
    return text


def _alias_endpoints(table: Mapping[str, object], endpoints: Mapping[str, EndpointSpec], where: str) -> tuple[str, ...]:
    names = table.get("endpoints") or ([table["endpoint"]] if "endpoint" in table else [])
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list):
        raise ConfigError(f"{where} endpoints must be a list of endpoint names, got {names!r}")
    if not names:
        raise ConfigError(f"{where} needs endpoint or endpoints")
    for e in names:
        if not isinstance(e, str):
            raise ConfigError(f"{where} endpoints must be endpoint names (strings), got {e!r}")
        if e not in endpoints:
            raise ConfigError(f"{where} names unknown endpoint {e!r}")
    return tuple(names)


def _params(params: object, where: str) -> dict[str, object]:
    if not isinstance(params, dict):
        raise ConfigError(f"{where} params must be a table, got {params!r}")
    for key, value in params.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where} params.{key} must be finite, got {value!r}")
    temperature = params.get("temperature")
    if temperature is not None and (not _is_number(temperature) or temperature < 0):
        raise ConfigError(f"{where} params.temperature must be a number >= 0, got {temperature!r}")
    for key in ("max_tokens", "max_completion_tokens"):
        value = params.get(key)
        if value is not None and (type(value) is not int or value < 1):
            raise ConfigError(f"{where} params.{key} must be a whole number >= 1, got {value!r}")
    return dict(params)


def _check_prices(table: Mapping[str, object], where: str) -> dict[str, float | None]:
    """The alias's prices, checked."""
    return {key: _positive(table, key, where, allow_zero=True)
            for key in ("price_in", "price_out", "price_cached_in", "price_cache_write", "price_cache_write_1h")}


def _discount(table: Mapping[str, object], where: str) -> float:
    discount = table.get("batch_discount", 0.5)
    if not _is_number(discount) or not isinstance(discount, int | float) or not 0 < discount <= 1:
        raise ConfigError(f"{where} batch_discount must be a number in (0, 1] (the share of the price a batch "
                          f"call costs: 0.5 is half price), got {discount!r}")
    return float(discount)
