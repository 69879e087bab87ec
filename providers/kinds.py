"""Provider kinds: one `ProviderKind` per endpoint kind, read from the Python
entry point group `tulving.providers` (the convention of `llm` plugins).

A kind names its provider class and its batch API as "module:Class" (imported
when first used, so a missing optional dependency such as llama-cpp-python
only matters to the endpoints that need it), its capabilities, the schema of
its endpoint options, and the default endpoints / model aliases it brings.
Built-in kinds are declared in pyproject.toml exactly as a third-party
distribution declares its own:

    [project.entry-points."tulving.providers"]
    mykind = "mypackage.kind:KIND"         # a ProviderKind named "mykind"

The registry is read on first use, never at import: importing a module does
not change which kinds exist. The config validates every endpoint's options
against its kind's schema once, at load (`validate_options`); providers, batch
APIs and the batch dispatcher then read them typed (`opt_bool`, `opt_float`, ...).
"""
from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from providers.base import CONFIG, EndpointSpec, Provider, ProviderError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from providers.batch_api import BatchApi

GROUP = "tulving.providers"

# The value types an option may have, as the reference names them.
BOOL, INT, NUMBER, STRING, STRINGS, TABLE = "bool", "int", "number", "string", "list of strings", "table of strings"
AUTO_BOOL = 'bool or "auto"'  # true, false, or "auto": Tulving finds out (the batch option)


class OptionError(ValueError):
    """An endpoint option breaks its kind's schema; the message is one line."""


@dataclass(frozen=True, slots=True)
class Option:
    """One endpoint option of a kind: `options.<name>` in the config."""

    name: str
    type: str                       # BOOL | AUTO_BOOL | INT | NUMBER | STRING | STRINGS | TABLE
    doc: str                        # one line, for the configuration reference
    default: object = None          # None: unset (the consumer's own behaviour)
    minimum: float | None = None    # numbers: lowest allowed value
    above_minimum: bool = False     # True: the minimum itself is not allowed (> instead of >=)
    choices: tuple[str, ...] = ()   # strings: the allowed values
    unit: str = ""                  # what a number counts ("seconds"), for messages and the reference
    check: Callable[[object], None] | None = None  # further check; raises OptionError

    def describe_range(self) -> str:
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.minimum is None:
            return ""
        return f"{'>' if self.above_minimum else '>='} {self.minimum:g}"

    def validate(self, value: object) -> object:
        """The value, normalised (a NUMBER is a float); OptionError when it breaks the schema."""
        problem = _type_problem(self.type, value) or self._range_problem(value)
        if problem is not None:
            raise OptionError(f"options.{self.name} {problem}, got {value!r}")
        if self.check is not None:
            self.check(value)
        if self.type == NUMBER and isinstance(value, int | float):
            return float(value)
        return value

    def _range_problem(self, value: object) -> str | None:
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}"
        if self.minimum is None or not isinstance(value, int | float):
            return None
        if value > self.minimum or (value == self.minimum and not self.above_minimum):
            return None
        what = "whole number" if self.type == INT else "number"
        of = f" of {self.unit}" if self.unit else ""
        if self.minimum == 0 and self.above_minimum:
            return f"must be a positive {what}{of}"
        return f"must be a {what}{of} {self.describe_range()}"


def _type_problem(kind: str, value: object) -> str | None:
    if kind == BOOL:
        ok = isinstance(value, bool)
    elif kind == AUTO_BOOL:
        ok = isinstance(value, bool) or value == "auto"
    elif kind == INT:
        ok = type(value) is int
    elif kind == NUMBER:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    elif kind == STRING:
        ok = isinstance(value, str)
    elif kind == STRINGS:
        ok = isinstance(value, list) and all(isinstance(x, str) for x in value)
    else:
        ok = isinstance(value, Mapping)
    if ok:
        return None
    return {BOOL: "must be true or false", AUTO_BOOL: 'must be true, false or "auto"', INT: "must be a whole number", NUMBER: "must be a finite number",
            STRING: "must be a string", STRINGS: "must be a list of strings",
            TABLE: "must be a table of strings"}[kind]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What endpoints of a kind can do; the engine asks these, never a kind's name."""

    chat: bool = True
    embeddings: bool = False
    stream: bool = False            # chat(stream=True) streams and times the reply
    prompt_cache: bool = False      # the server caches prompt prefixes (option prompt_cache turns it off)
    cache_read_step: int = 1        # prompt-cache reads come in steps of this many tokens
    charges_cache_writes: bool = True  # writing the prompt cache is priced (price_cache_write)
    list_models: bool = False       # the API lists its models (GET /models)
    rate_limit_headers: bool = False  # replies report the account's rate limits (`tulving models --probe`)
    fine_tuning: bool = False       # the API fine-tunes models (the OpenAI fine-tuning jobs API)
    seeded_draws: bool = False      # a request's `seed` picks its draw: re-draws of one prompt carry seed=draw


@dataclass(frozen=True, slots=True)
class ProviderKind:
    """Everything Tulving knows of one endpoint kind."""

    name: str
    provider: str                          # "module:Class" of its Provider
    doc: str                               # one line, for the reference
    batch_api: str | None = None           # "module:Class" of its BatchApi, or None
    capabilities: Capabilities = field(default_factory=Capabilities)
    options: tuple[Option, ...] = ()
    default_endpoints: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    default_models: Mapping[str, Mapping[str, object]] = field(default_factory=dict)

    @property
    def can_batch(self) -> bool:
        return self.batch_api is not None

    def option(self, name: str) -> Option | None:
        return next((o for o in self.options if o.name == name), None)

    def provider_class(self) -> type[Provider]:
        cls = _load(self.provider)
        if not (isinstance(cls, type) and issubclass(cls, Provider)):
            raise ProviderError(CONFIG, f"kind {self.name!r}: {self.provider} is not a Provider class")
        return cls

    def batch_api_class(self) -> type[BatchApi] | None:
        if self.batch_api is None:
            return None
        from providers.batch_api import BatchApi

        cls = _load(self.batch_api)
        if not (isinstance(cls, type) and issubclass(cls, BatchApi)):
            raise ProviderError(CONFIG, f"kind {self.name!r}: {self.batch_api} is not a BatchApi class")
        return cls


def _load(target: str) -> object:
    """The object `target` ("module:attribute") names, its module imported now."""
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)


class KindRegistry:
    """The known kinds, by name."""

    def __init__(self, kinds: Iterable[ProviderKind]):
        self._kinds = {kind.name: kind for kind in kinds}

    @classmethod
    def from_entry_points(cls, found: Iterable[EntryPoint]) -> KindRegistry:
        kinds = []
        for ep in found:
            kind = ep.load()
            if not isinstance(kind, ProviderKind) or kind.name != ep.name:
                raise ProviderError(CONFIG, f"entry point {ep.name} = {ep.value!r} of group {GROUP} is not "
                                            f"a ProviderKind named {ep.name!r}")
            kinds.append(kind)
        if not kinds:
            raise ProviderError(CONFIG, f"no provider kinds found (entry point group {GROUP}): the package "
                                        f"metadata is missing; run `pip install -e .` in the source folder")
        return cls(kinds)

    def with_kinds(self, *extra: ProviderKind) -> KindRegistry:
        """This registry plus `extra` (tests and benchmarks with providers of their own)."""
        return KindRegistry([*self._kinds.values(), *extra])

    def names(self) -> list[str]:
        return sorted(self._kinds)

    def all(self) -> list[ProviderKind]:
        return [self._kinds[name] for name in self.names()]

    def get(self, name: str) -> ProviderKind:
        try:
            return self._kinds[name]
        except KeyError:
            raise ProviderError(CONFIG, f"unknown endpoint kind {name!r} (known: {', '.join(self.names())})") from None

    def __contains__(self, name: object) -> bool:
        return name in self._kinds


_registry: KindRegistry | None = None


def registry() -> KindRegistry:
    """The kinds installed (entry point group `tulving.providers`), read once."""
    global _registry
    if _registry is None:
        from importlib.metadata import entry_points  # here: `tulving --help` reads no distribution metadata

        _registry = KindRegistry.from_entry_points(entry_points(group=GROUP))
    return _registry


def set_registry(new: KindRegistry | None) -> KindRegistry | None:
    """Use `new` from now on (None: read the entry points again); returns the
    one in use before. For tests and benchmarks that serve a kind of their own."""
    global _registry
    previous, _registry = _registry, new
    return previous


def kind_of(spec: EndpointSpec) -> ProviderKind:
    return registry().get(spec.kind)


def make_provider(spec: EndpointSpec, api_key: str | None) -> Provider:
    """The provider serving `spec` (its kind's class, imported now)."""
    return kind_of(spec).provider_class()(spec, api_key)


def batch_capable(spec: EndpointSpec) -> bool:
    """Whether `--batch` sends this endpoint's chat calls by batch: its kind has
    a batch API and the endpoint does not set `options.batch = false`
    ("auto": by batch when its server answers the batch API, which the run
    checks at start: engine.batching_mode.check_batch_apis)."""
    if not kind_of(spec).can_batch:
        return False
    value = _value(spec, "batch")
    if value not in (True, False, "auto"):
        raise _wrong(spec, "batch", value, 'true, false or "auto"')
    return value is not False


def batch_auto(spec: EndpointSpec) -> bool:
    """`options.batch = "auto"`: direct calls when the server has no batch API."""
    return _value(spec, "batch") == "auto"


def batch_api_for(spec: EndpointSpec, api_key: str | None) -> BatchApi | None:
    """The batch API of `spec`; None when its kind has none or the endpoint
    sets `options.batch = false`."""
    return open_batch_api(spec, api_key) if batch_capable(spec) else None


def open_batch_api(spec: EndpointSpec, api_key: str | None) -> BatchApi:
    """The batch API of the endpoint's kind whatever `options.batch` says (to
    poll or cancel batches sent earlier); ProviderError when the kind has none."""
    cls = kind_of(spec).batch_api_class()
    if cls is None:
        raise ProviderError(CONFIG, f"endpoint {spec.name!r}: kind {spec.kind!r} has no batch API")
    return cls(spec, api_key)


# -- validation (once, at config load) and typed reads ------------------------------

def validate_options(kind: ProviderKind, options: object) -> dict[str, object]:
    """`options` checked against the kind's schema and normalised; OptionError
    (one line) on an unknown option, a wrong type, a value out of range or an
    option the kind does not support."""
    if not isinstance(options, Mapping):
        raise OptionError(f"options must be a table, got {options!r}")
    checked: dict[str, object] = {}
    for name, value in options.items():
        option = kind.option(str(name))
        if option is None:
            raise OptionError(_unsupported(kind, str(name)))
        checked[str(name)] = option.validate(value)
    return checked


def _unsupported(kind: ProviderKind, name: str) -> str:
    others = [k.name for k in registry().all() if k.option(name) is not None]
    if name == "stream" and others:
        return f"options.stream: {kind.name} endpoints cannot stream (only {', '.join(others)} endpoints do)"
    if others:
        return f"options.{name} is not an option of {kind.name} endpoints (only of {', '.join(others)})"
    known = ", ".join(o.name for o in kind.options) or "none"
    return f"unknown option options.{name} for {kind.name} endpoints (known: {known})"


def _value(spec: EndpointSpec, name: str) -> object:
    if name in spec.options:
        return spec.options[name]
    option = kind_of(spec).option(name)
    return None if option is None else option.default


def _wrong(spec: EndpointSpec, name: str, value: object, what: str) -> ProviderError:
    return ProviderError(CONFIG, f"endpoint {spec.name!r}: options.{name} must be {what}, got {value!r}")


def opt_bool(spec: EndpointSpec, name: str) -> bool:
    value = _value(spec, name)
    if not isinstance(value, bool):
        raise _wrong(spec, name, value, "true or false")
    return value


def opt_float(spec: EndpointSpec, name: str) -> float | None:
    value = _value(spec, name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _wrong(spec, name, value, "a number")
    return float(value)


def opt_int(spec: EndpointSpec, name: str) -> int | None:
    value = _value(spec, name)
    if value is not None and type(value) is not int:
        raise _wrong(spec, name, value, "a whole number")
    return value


def opt_str(spec: EndpointSpec, name: str) -> str | None:
    value = _value(spec, name)
    if value is not None and not isinstance(value, str):
        raise _wrong(spec, name, value, "a string")
    return value


def opt_strings(spec: EndpointSpec, name: str) -> tuple[str, ...]:
    value = _value(spec, name)
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(x, str) for x in value):
        raise _wrong(spec, name, value, "a list of strings")
    return tuple(value)


def opt_table(spec: EndpointSpec, name: str) -> dict[str, str]:
    value = _value(spec, name)
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise _wrong(spec, name, value, "a table of strings")
    return {str(k): v for k, v in value.items()}
