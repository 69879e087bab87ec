"""The benchmark's figures, PNG and SVG, drawn as the report's are
(engine/benchmark/evaluation/figures.py: matplotlib's Agg backend, reproducible SVG).

- `latency_vs_load`: TTFT, TPOT, ITL and E2E against the load points (one
  panel each), the median solid and the highest percentile dashed, one colour
  per model;
- `throughput_vs_load`: output tokens/s and completed requests/s against the load;
- `ttft_cdf`: the empirical distribution of TTFT per model and load.
Load points sit at equal spacing, labelled by their rate / concurrency.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.benchmark.evaluation.figures import Figure, _plt, _save, _t
from engine.benchmark.latency.report import BenchRun


def _series(runs: Sequence[BenchRun]) -> tuple[list[str], list[str]]:
    loads = list(dict.fromkeys(r.point.label for r in runs))
    models = list(dict.fromkeys(r.model for r in runs))
    return loads, models


def latency_vs_load(folder: Path, runs: Sequence[BenchRun], percentile: float, name: str = "latency_vs_load"
                    ) -> Figure:
    plt = _plt()
    loads, models = _series(runs)
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    pname = f"p{percentile:g}"
    for ax, (key, title) in zip(axes.flat, (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"))):
        for color, model in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4, models):
            xs, med, high = [], [], []
            for r in runs:
                d = getattr(r.summary, key)
                if r.model == model and d is not None:
                    xs.append(loads.index(r.point.label))
                    med.append(d.median * 1000)
                    high.append(d.percentiles.get(pname, float("nan")) * 1000)
            if xs:
                ax.plot(xs, med, "o-", color=color, label=f"{_t(model)} median")
                ax.plot(xs, high, "s--", color=color, alpha=0.7, label=f"{_t(model)} {pname}")
        ax.set_title(title)
        ax.set_ylabel("ms")
        ax.set_xticks(range(len(loads)), loads)
        ax.grid(alpha=0.3)
    if axes.flat[0].has_data():
        axes.flat[0].legend(fontsize=7)
    elif axes.flat[3].has_data():
        axes.flat[3].legend(fontsize=7)
    fig.supxlabel("load")
    fig.tight_layout()
    return _save(fig, folder, name, f"Latency vs load (median and {pname})")


def throughput_vs_load(folder: Path, runs: Sequence[BenchRun], name: str = "throughput_vs_load") -> Figure:
    plt = _plt()
    loads, models = _series(runs)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for model in models:
        mine = [r for r in runs if r.model == model]
        xs = [loads.index(r.point.label) for r in mine]
        left.plot(xs, [r.summary.output_throughput for r in mine], "o-", label=_t(model))
        right.plot(xs, [r.summary.request_throughput for r in mine], "o-", label=_t(model))
    for ax, label in ((left, "output tokens/s"), (right, "completed requests/s")):
        ax.set_ylabel(label)
        ax.set_xticks(range(len(loads)), loads)
        ax.set_xlabel("load")
        ax.grid(alpha=0.3)
    left.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, folder, name, "Throughput vs load")


def ttft_cdf(folder: Path, runs: Sequence[BenchRun], name: str = "ttft_cdf") -> Figure:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        values = np.sort([rec.ttft * 1000 for rec in r.records if rec.ok and rec.ttft is not None])
        if values.size:
            ax.step(values, np.arange(1, values.size + 1) / values.size, where="post",
                    label=f"{_t(r.model)} {r.point.label}")
    ax.set_xlabel("time to first token (ms)")
    ax.set_ylabel("share of requests")
    ax.grid(alpha=0.3)
    if ax.has_data():
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, folder, name, "TTFT distribution")


def all_figures(folder: Path, runs: Sequence[BenchRun], percentile: float) -> list[Figure]:
    return [latency_vs_load(folder, runs, percentile), throughput_vs_load(folder, runs), ttft_cdf(folder, runs)]
