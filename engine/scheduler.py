"""PLACEHOLDER (to be replaced by the real scheduler): the public API of the engine.

    async with Engine(config, cache_path="runs/cache.sqlite") as engine:
        async for outcome in engine.stream(requests):   # any (async) iterable
            ...                                          # outcomes in completion order
        outcomes = await engine.run(requests)            # list, in input order

This stand-in calls providers one at a time, without cache or limits, so the
benchmark steps can be written and tested against the final interface.
"""
from __future__ import annotations

from typing import Any, AsyncIterable, AsyncIterator, Iterable

from engine.config import Config
from engine.requests import ChatRequest, EmbedRequest, Outcome, Request
from providers import make_provider
from providers.base import ProviderError


class Engine:
    def __init__(self, config: Config, *, cache_path: str | None = None, progress: bool = False,
                 max_cost: float | None = None, label: str = ""):
        self.config = config
        self._providers: dict[str, Any] = {}

    async def __aenter__(self) -> "Engine":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        for p in self._providers.values():
            await p.aclose()

    def _provider(self, endpoint):
        if endpoint.name not in self._providers:
            self._providers[endpoint.name] = make_provider(endpoint, self.config.api_key(endpoint))
        return self._providers[endpoint.name]

    async def stream(self, requests: Iterable[Request] | AsyncIterable[Request], *,
                     label: str = "") -> AsyncIterator[Outcome]:
        if hasattr(requests, "__aiter__"):
            items = [r async for r in requests]  # type: ignore[union-attr]
        else:
            items = list(requests)
        for req in items:
            alias = self.config.alias(req.model)
            endpoint = self.config.endpoints_of(alias)[0]
            provider = self._provider(endpoint)
            try:
                if isinstance(req, EmbedRequest):
                    res = await provider.embed(alias.model, req.texts, timeout=endpoint.timeout)
                else:
                    params = {**alias.params, **{k: v for k, v in (("temperature", req.temperature),
                              ("max_tokens", req.max_tokens), ("seed", req.seed), ("stop", req.stop)) if v is not None}}
                    res = await provider.chat(alias.model, req.messages, params=params, timeout=endpoint.timeout)
                yield Outcome(request=req, result=res, attempts=1, endpoint=endpoint.name)
            except ProviderError as err:
                yield Outcome(request=req, error=err, attempts=1, endpoint=endpoint.name)

    async def run(self, requests: Iterable[Request] | AsyncIterable[Request], *, label: str = "") -> list[Outcome]:
        return [o async for o in self.stream(requests, label=label)]
