"""`tulving models --probe`: one minimal request per endpoint, and the rate
limits its reply's headers report.

Every endpoint whose kind reports rate limits in its replies, of the configured
models that has its key set, or needs none, gets one request: a one-token
chat (an embedding of one word where the endpoint serves only embedding
models), sent straight through its provider: no cache, no retry. The limits
are read as the engine reads them on every reply (providers/ratelimit_headers
.py, engine/limiter.EndpointLimits.learn): per minute, with what remained.
An error reply (a 429, a 400 for the probe's own parameters) still reports
its limits. Endpoints without a key are listed as not probed.
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

from engine.config import Config, ModelAlias
from engine.errors import printable
from engine.limiter import EndpointLimits
from providers import make_provider
from providers.base import RATE_LIMITED, EndpointSpec, ProviderError, RateLimitInfo, Result
from providers.kinds import kind_of

PROBE_TIMEOUT = 30.0
COLUMNS = (("requests", "requests/min"), ("tokens", "tokens/min"), ("input_tokens", "input tokens/min"),
           ("output_tokens", "output tokens/min"))


@dataclass
class Probe:
    spec: EndpointSpec
    alias: ModelAlias | None
    reply: str = ""                       # "ok", an error kind, or why it was not probed
    failed: bool = False
    info: RateLimitInfo | None = None


def _is_embedding(alias: ModelAlias) -> bool:
    return "embed" in alias.model.lower()


def plan(config: Config) -> list[Probe]:
    """One probe per remote endpoint of the configured models, with the alias
    to send it to (a chat model when the endpoint serves one)."""
    served: dict[str, list[ModelAlias]] = {}
    for name in sorted(config.models):
        alias = config.models[name]
        if alias.retired_on() is not None:  # a call to it would only be refused
            continue
        for endpoint in alias.endpoints:
            served.setdefault(endpoint, []).append(alias)
    probes = []
    for name in sorted(served):
        spec = config.endpoints[name]
        if not kind_of(spec).capabilities.rate_limit_headers:
            continue
        # cheapest to ask: a plain chat model, then a reasoning one, then an embedding model
        alias = min(served[name], key=lambda a: (_is_embedding(a), a.reasoning, a.shutdown is not None,
                                                 a.price_in or 0.0))
        probe = Probe(spec, alias)
        if spec.key_env and not os.environ.get(spec.key_env):
            probe.reply = f"not probed: {spec.key_env} not set"
            probe.alias = None
        probes.append(probe)
    return probes


async def _send(config: Config, probe: Probe) -> None:
    spec, alias = probe.spec, probe.alias
    assert alias is not None  # only planned probes are sent
    provider = make_provider(spec, config.api_key(spec))
    timeout = min(spec.timeout, PROBE_TIMEOUT)
    try:
        result: Result
        if _is_embedding(alias):
            result = await provider.embed(alias.model, ["probe"], timeout=timeout)
        else:
            # reasoning models spend tokens before answering; current OpenAI models refuse max_tokens
            params = ({"max_completion_tokens": 16} if alias.reasoning or alias.token_param == "max_completion_tokens"
                      else {"max_tokens": 1})
            result = await provider.chat(alias.model, [{"role": "user", "content": "Say OK."}],
                                         params=params, timeout=timeout)
        probe.reply, probe.info = "ok", result.rate_limits
    except ProviderError as exc:
        probe.reply = str(exc.kind) + (f" {exc.status}" if exc.status else "")
        probe.info = exc.rate_limits
        probe.failed = exc.kind != RATE_LIMITED  # a 429 answered, with its limits
        if probe.failed:
            probe.reply += f": {exc.message}"
    finally:
        await provider.aclose()


def _cells(probe: Probe) -> list[str]:
    if probe.info is None:
        return ["-"] * len(COLUMNS)
    limits = EndpointLimits(probe.spec, now=0.0)
    learned = limits.learn(probe.info, 0.0, probe.alias.model if probe.alias else "")
    cells = []
    for name, _ in COLUMNS:
        rate = learned.get(name)
        if rate is None:
            cells.append("-")
            continue
        remaining = getattr(probe.info, f"{name}_remaining")
        cell = f"{rate:,.0f}" + (f" ({remaining:,.0f} left)" if remaining is not None else "")
        configured = limits.configured_rate(name)
        if configured is not None:
            cell += f", configured {configured:,.0f}"
        cells.append(cell)
    return cells


async def probe_all(config: Config) -> int:
    """Probe, print the table, return the exit code (1 if a probe failed)."""
    probes = plan(config)
    started = time.perf_counter()
    await asyncio.gather(*(_send(config, p) for p in probes if p.alias is not None))
    rows = [("endpoint", "model", *(title for _, title in COLUMNS))]
    notes = []
    for p in probes:
        if p.alias is not None:
            rows.append((p.spec.name, p.alias.model, *_cells(p)))
        if p.reply != "ok":
            notes.append(f"{p.spec.name}: {printable(p.reply)}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    sent = sum(p.alias is not None for p in probes)
    print(f"\nrate limits reported by the providers ({sent} endpoints probed, {time.perf_counter() - started:.1f} s; "
          "per minute; the engine paces by the lower of the reported and the configured limit):")
    for row in rows:
        print("  ".join(printable(cell).ljust(w) for cell, w in zip(row, widths)).rstrip())
    for note in notes:
        print(note)
    if not probes:
        print("no remote endpoint to probe")
    return 1 if any(p.failed for p in probes) else 0
