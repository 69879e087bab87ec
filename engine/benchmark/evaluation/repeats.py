"""Run-to-run spread (`tulving run --repeats N`): each answer asked N times
as independent draws (ChatRequest.draw = the repeat, part of the cache key, so
a rerun replays every repeat exactly), each repeat judged and scored on its
own. Repeat 1 is the run itself (results.jsonl, the leaderboard); repeats 2..N
are kept beside it (results-repeat-K.jsonl) and summarised here: per
configuration, the scores of every repeat, their mean and standard deviation.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import TypedDict

from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.evaluation.scores import chronological_awareness, simple_recall


def repeat_file(k: int) -> str:
    """The results file of repeat k (1-based; repeat 1 is results.jsonl)."""
    return f"results-repeat-{k}.jsonl"


class ScoreSpread(TypedDict):
    values: list[float | None]   # one per repeat (None: undefined)
    mean: float | None
    sd: float | None             # sample standard deviation over the defined repeats (None below 2)


class RepeatSpread(TypedDict):
    repeats: int
    simple_recall: ScoreSpread
    chronological_awareness: ScoreSpread


def _spread(values: list[float | None]) -> ScoreSpread:
    defined = [v for v in values if v is not None]
    return {"values": values, "mean": round(statistics.fmean(defined), 4) if defined else None,
            "sd": round(statistics.stdev(defined), 4) if len(defined) > 1 else None}


def _defined(x: float) -> float | None:
    return None if math.isnan(x) else x


def repeat_spread(repeats: Sequence[Sequence[ResultRecord]]) -> dict[str, RepeatSpread]:
    """"model / mode" -> the spread of its scores over the repeats (each a run's records)."""
    per_config: dict[str, list[list[ResultRecord]]] = {}
    for k, records in enumerate(repeats):
        for r in records:
            runs = per_config.setdefault(f"{r.model} / {r.mode}", [[] for _ in repeats])
            runs[k].append(r)
    return {name: {"repeats": len(runs),
                   "simple_recall": _spread([_defined(simple_recall(rs)[0]) for rs in runs]),
                   "chronological_awareness": _spread([_defined(chronological_awareness(rs)[0]) for rs in runs])}
            for name, runs in per_config.items()}


def spread_markdown(spread: dict[str, RepeatSpread]) -> str:
    def cell(s: ScoreSpread) -> str:
        values = ", ".join("-" if v is None else f"{v:.3f}" for v in s["values"])
        if s["mean"] is None:
            return values
        return f"{s['mean']:.3f} ± {s['sd']:.3f} ({values})" if s["sd"] is not None else f"{s['mean']:.3f} ({values})"

    rows = [f"| {name} | {s['repeats']} | {cell(s['simple_recall'])} | {cell(s['chronological_awareness'])} |"
            for name, s in spread.items()]
    return ("## Run-to-run spread (--repeats)\n\nEach answer asked again as an independent draw and judged anew; "
            "mean ± sample sd over the repeats (each repeat's score in brackets).\n\n"
            "| configuration | repeats | Simple Recall | Chronological Awareness |\n|---|---|---|---|\n"
            + "\n".join(rows))
