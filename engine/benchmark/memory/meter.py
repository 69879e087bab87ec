"""The cost and latency of one memory system's phases.

    meter = PhaseMeter("mem0")
    with meter.phase("ingest"):          # wall time of the phase
        ...                              # every model call the system makes:
        meter.add(alias, outcome)        #   counted in the phase it was made in
    meter.recalled(0.042)                # one recall's latency (seconds)
    meter.to_json()                      # run.json's "memory" part of the system

Model calls come from the services Tulving lends the system (services.py)
and from its OpenAI-compatible endpoint on loopback (proxy.py): both count
here, and into the run's spending under the role "memory NAME: PHASE".
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from engine.config import ModelAlias
from engine.requests import Outcome
from engine.spending import Spending


@dataclass(slots=True)
class PhaseFigures:
    seconds: float = 0.0
    calls: int = 0
    cached: int = 0
    failed: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    spent_usd: float = 0.0
    list_usd: float = 0.0


class Percentiles(TypedDict):
    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    p99: float | None
    max: float | None


class PhaseRecord(TypedDict):
    seconds: float
    calls: int
    cached: int
    failed: int
    input_tokens: int
    output_tokens: int
    spent_usd: float
    list_usd: float


class MeterRecord(TypedDict):
    phases: dict[str, PhaseRecord]
    recall_latency: Percentiles


def percentiles(values: Sequence[float]) -> Percentiles:
    """count, mean, p50, p95, p99 and max of `values` (seconds), None when empty."""
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}
    array = np.asarray(values, dtype=float)
    p50, p95, p99 = (float(x) for x in np.percentile(array, [50, 95, 99]))
    return {"count": len(values), "mean": round(float(array.mean()), 6), "p50": round(p50, 6),
            "p95": round(p95, 6), "p99": round(p99, 6), "max": round(float(array.max()), 6)}


@dataclass(slots=True)
class PhaseMeter:
    """One memory system's figures, phase by phase."""

    system: str
    spending: Spending = field(default_factory=Spending)
    phases: dict[str, PhaseFigures] = field(default_factory=dict)
    current: str = "open"
    recall_latencies: list[float] = field(default_factory=list)

    def figures(self, name: str) -> PhaseFigures:
        found = self.phases.get(name)
        if found is None:
            found = self.phases[name] = PhaseFigures()
        return found

    @contextmanager
    def phase(self, name: str) -> Iterator[PhaseFigures]:
        """Time a phase; calls made meanwhile are counted in it."""
        previous, self.current = self.current, name
        figures = self.figures(name)
        start = time.perf_counter()
        try:
            yield figures
        finally:
            figures.seconds += time.perf_counter() - start
            self.current = previous

    def role(self, phase: str | None = None) -> str:
        return f"memory {self.system}: {phase or self.current}"

    def add(self, alias: ModelAlias, outcome: Outcome) -> None:
        """One model call of the system, in the current phase."""
        self.spending.add(self.role(), alias, outcome)
        figures = self.figures(self.current)
        figures.calls += 1
        if outcome.cached or outcome.joined:
            figures.cached += 1
        result = outcome.result
        if result is None:
            figures.failed += outcome.error is not None
            return
        figures.spent_usd += outcome.cost or 0.0
        if outcome.cached or outcome.joined:
            return
        output = int(getattr(result, "output_tokens", 0) or 0)
        figures.input_tokens += result.input_tokens
        figures.output_tokens += output
        figures.list_usd += alias.cost(result.input_tokens, output)

    def recalled(self, seconds: float) -> None:
        self.recall_latencies.append(seconds)

    def to_json(self) -> MeterRecord:
        phases: dict[str, PhaseRecord] = {name: {"seconds": round(f.seconds, 6), "calls": f.calls, "cached": f.cached, "failed": f.failed,
                         "input_tokens": f.input_tokens, "output_tokens": f.output_tokens,
                         "spent_usd": round(f.spent_usd, 6), "list_usd": round(f.list_usd, 6)}
                  for name, f in self.phases.items()}
        return {"phases": phases, "recall_latency": percentiles(self.recall_latencies)}
