"""Batch mode of one engine (`Engine(batch=True)`, `tulving run --batch`):
which endpoints send their chat calls by batch, with which options, and the
`BatchingProvider` (engine/batching.py) that does it for each of them.

    batching = Batching(cache_path, host=engine)
    provider = batching.provider(make_provider(spec, key), spec, key)  # direct, or by batch
    ...
    job = Job(..., holder=batching.holder(provider))   # a call the provider holds (a batch), or None
    batching.room()       # (requests, prompt chars) the pull window may hold beyond its own
    batching.counters()   # {"batches": ..., "batches_resumed": ..., "batched_calls": ...}
    batching.close()      # after the providers' aclose()
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from cache.backend import open_ledger
from engine.batching import POLL_FIRST, POLL_MAX, BatchHost, BatchingProvider, BatchOptions, Parking
from engine.call import CallHolder
from engine.config import Config, ConfigError
from engine.resolve import Resolved
from providers.base import EndpointSpec, Provider
from providers.kinds import batch_api_for, batch_auto, batch_capable, opt_float, opt_int


def batch_options(spec: EndpointSpec) -> BatchOptions:
    """The endpoint's batch options (the one place they are read; the config
    checked them against its kind's schema at load)."""
    first = opt_float(spec, "batch_poll") or POLL_FIRST
    return BatchOptions(first, max(first, opt_float(spec, "batch_poll_max") or POLL_MAX),
                        opt_int(spec, "batch_queue_requests"), opt_int(spec, "batch_queue_tokens"))


def batch_endpoint(r: Resolved) -> str | None:
    """The endpoint whose batch API a resolved call goes through in batch
    mode, or None when it goes direct (embeddings, other endpoint kinds,
    `options.batch = false`). What `--dry-run` counts."""
    if r.messages is None:
        return None
    return next((spec.name for spec in r.endpoints if batch_capable(spec)), None)


async def check_batch_apis(config: Config, models: Iterable[str]) -> list[str]:
    """Before a `--batch` run's first call: ask each batch-capable endpoint of
    `models` whether its server has a batch API (an OpenAI-compatible vLLM or
    llama.cpp server has none: every batched call would fail). One without
    stops the run (ConfigError, one line naming the option), unless it says
    `batch = "auto"`: its calls then go direct, switched in `config`, and the
    returned notes say so."""
    notes = []
    names = {e for m in models if m for e in config.alias(m).endpoints}
    for spec in [config.endpoints[n] for n in sorted(names)]:
        api = batch_api_for(spec, config.api_key(spec))
        if api is None:
            continue
        try:
            why = await api.missing()
        finally:
            await api.aclose()
        if why is None:
            continue
        where = f"endpoint {spec.name!r} ({spec.base_url or spec.kind})"
        if not batch_auto(spec):
            raise ConfigError(f"--batch: {where} has no batch API ({why}): set options.batch = false (or "
                              f'"auto") under [endpoints.{spec.name}] for direct calls, or run without --batch')
        config.endpoints[spec.name] = dataclasses.replace(spec, options={**spec.options, "batch": False})
        notes.append(f"{where} has no batch API ({why}): its calls go direct (options.batch = \"auto\")")
    return notes


class Batching:
    """Batch mode of one engine: the ledger in its cache file, and a
    batching provider for each endpoint whose kind has a batch API."""

    def __init__(self, cache_path: str | None, host: BatchHost):
        self.host = host
        self.ledger = open_ledger(cache_path) if cache_path is not None else None
        self.providers: list[BatchingProvider] = []
        self.parking = Parking()  # requests waiting on the calls these providers hold, engine-wide
        if self.ledger is None:
            host.notice("batch mode without a cache: the batches are not recorded, a killed run cannot resume "
                        "them", key=("batch-no-cache",))

    def provider(self, direct: Provider, spec: EndpointSpec, api_key: str | None) -> Provider:
        """The provider the endpoint's calls go through: `direct`, or the
        batching provider wrapping it."""
        api = batch_api_for(spec, api_key)
        if api is None:
            return direct
        batching = BatchingProvider(direct, api, batch_options(spec), self.ledger, self.host)
        self.providers.append(batching)
        return batching

    def holder(self, provider: Provider) -> CallHolder | None:
        """Who keeps count of the requests waiting on a call `provider` is
        given (engine/call.py `Job.holder`): the parking when the provider
        holds its calls in a queue of its own (a batching provider), else None."""
        return self.parking if provider.holds_calls else None

    def room(self) -> tuple[int, int]:
        """(requests, prompt characters) the engine's pull window may hold
        beyond its own: those waiting on held calls (engine/batching.py `Parking`)."""
        return self.parking.room()

    def counters(self) -> dict[str, int]:
        """Batches submitted and resumed, and calls sent in them (EngineStats)."""
        return {"batches": sum(p.submitted for p in self.providers),
                "batches_resumed": sum(p.waiting.resumed for p in self.providers),
                "batched_calls": sum(p.batched for p in self.providers)}

    def close(self) -> None:
        """After the providers' aclose()."""
        if self.ledger is not None:
            self.ledger.close()
