"""The services Tulving lends a memory system (contract.MemoryServices):
its model calls made through the run's engine and counted in its meter.

A call that fails raises `TulvingError` with the provider's error: the
system may catch it; if it does not, the phase fails with one line.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engine.benchmark.evaluation.rag import EMBED_BATCH
from engine.benchmark.memory.contract import Budget
from engine.benchmark.memory.meter import PhaseMeter
from engine.config import Config
from engine.requests import ChatRequest, EmbedRequest, Outcome, Request
from providers.base import ChatResult, EmbedResult, TulvingError

if TYPE_CHECKING:
    from engine.scheduler import Engine


@dataclass(slots=True)
class EngineServices:
    """MemoryServices over a running Engine, for one memory system."""

    engine: Engine
    config: Config
    meter: PhaseMeter
    workdir: Path
    chat_model: str | None = None
    embed_model: str | None = None
    openai_base_url: str | None = None
    openai_api_key: str | None = None
    models: Sequence[str] = field(default_factory=tuple)
    budget: Budget | None = None  # the run's evidence budget (None: the system's evidence is not budgeted)

    def _model(self, asked: str | None, default: str | None, what: str) -> str:
        name = asked or default
        if name is None:
            raise TulvingError(f"memory system {self.meter.system!r} asked for a {what} call, but the run gives it "
                               f"no {what} model (--memory-model / --embed-model)")
        if name not in self.models:
            raise TulvingError(f"memory system {self.meter.system!r} asked for model {name!r}, which the run does "
                               f"not lend it (it may use: {', '.join(self.models) or 'none'})")
        return name

    async def _run(self, requests: Sequence[Request], model: str) -> list[Outcome]:
        outcomes = await self.engine.run(requests, label=f"memory {self.meter.system} ({self.meter.current})")
        alias = self.config.alias(model)
        for outcome in outcomes:
            self.meter.add(alias, outcome)
        for outcome in outcomes:
            if not outcome.ok:
                raise TulvingError(f"{model}: {outcome.error}")
        return outcomes

    async def chat(self, messages: Sequence[Mapping[str, str]], *, model: str | None = None,
                   temperature: float | None = None, max_tokens: int | None = None,
                   response_format: Mapping[str, object] | None = None) -> str:
        name = self._model(model, self.chat_model, "chat")
        extra = {"response_format": dict(response_format)} if response_format else None
        request = ChatRequest(model=name, messages=[dict(m) for m in messages], temperature=temperature,
                              max_tokens=max_tokens, extra=extra)
        [outcome] = await self._run([request], name)
        result = outcome.result
        assert isinstance(result, ChatResult)
        return result.text

    async def embed(self, texts: Sequence[str], *, model: str | None = None) -> np.ndarray:
        """One row per text. Sent in batches of EMBED_BATCH texts, as the
        paper's RAG embedded its chunks (the same requests: the same cache entries)."""
        name = self._model(model, self.embed_model, "embedding")
        if not texts:
            return np.zeros((0, 0))
        requests = [EmbedRequest(model=name, texts=list(texts[i:i + EMBED_BATCH]), tag=i)
                    for i in range(0, len(texts), EMBED_BATCH)]
        rows: list[list[float]] = []
        for outcome in await self._run(requests, name):
            result, request = outcome.result, outcome.request
            assert isinstance(result, EmbedResult) and isinstance(request, EmbedRequest)
            if len(result.vectors) != len(request.texts):
                raise TulvingError(f"{name} returned {len(result.vectors)} vectors for {len(request.texts)} texts")
            rows.extend(result.vectors)
        return np.asarray(rows, dtype=np.float64)
