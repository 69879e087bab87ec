"""What the scores and reports say of the memory systems: per configuration
(model, memory), the evidence and its budget, retrieval recall and precision
of the ground-truth chapters, and the cost and latency of each phase.

    row["memory"] = memory_figures(records, run["memory"].get(mode))   # scores.json
    memory_table(summary)        # report.md and index.html: one row per configuration
    budget_note(summary)         # one line when ranked rows had different budgets

Retrieval recall and precision are means over the questions that define
them (records' `retrieval_recall` / `retrieval_precision`, budget.coverage).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from engine.benchmark.evaluation.results import ResultRecord


class MemoryFigures(TypedDict, total=False):
    budget: str                       # "12 passages / 2,176 tokens", "whole book", "none (weights)"
    answers: bool                     # the system answered itself (agent style)
    evidence_tokens: float | None     # mean over answered questions
    retrieval_recall: float | None
    retrieval_precision: float | None
    cut_questions: int                # questions whose evidence the budget cut
    ingest_seconds: float | None
    ingest_calls: int | None
    memory_usd: float | None          # the system's own model calls, every phase
    recall_p50: float | None          # seconds
    recall_p95: float | None
    recall_p99: float | None
    failure: str | None


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def budget_label(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return "not stated"
    budget = entry.get("budget")
    if budget is None:
        return "none (weights)" if entry.get("prompt") == "finetuned" else "whole book"
    parts = [f"{budget['passages']} passages" if budget.get("passages") is not None else "",
             f"{budget['tokens']:,} tokens" if budget.get("tokens") is not None else ""]
    return " / ".join(p for p in parts if p) or "no limit"


def memory_figures(records: Sequence[ResultRecord], entry: Mapping[str, Any] | None) -> MemoryFigures:
    """One configuration's memory figures: from its records, and from
    run.json's entry of its memory system (None: a run without one)."""
    with_evidence = [r for r in records if r.evidence_tokens is not None]
    figures: MemoryFigures = {
        "budget": budget_label(entry),
        "evidence_tokens": _mean([float(r.evidence_tokens or 0) for r in with_evidence]),
        "retrieval_recall": _mean([r.retrieval_recall for r in records if r.retrieval_recall is not None]),
        "retrieval_precision": _mean([r.retrieval_precision for r in records if r.retrieval_precision is not None]),
        "cut_questions": sum(1 for r in records if r.evidence_cut),
    }
    if entry is not None:
        phases = entry.get("phases") or {}
        ingest = phases.get("ingest") or {}
        latency = entry.get("recall_latency") or {}
        figures.update({"answers": bool(entry.get("answers")), "ingest_seconds": ingest.get("seconds"),
                        "ingest_calls": ingest.get("calls"),
                        "memory_usd": round(sum(float(p.get("spent_usd") or 0) for p in phases.values()), 6),
                        "recall_p50": latency.get("p50"), "recall_p95": latency.get("p95"),
                        "recall_p99": latency.get("p99"), "failure": entry.get("failure")})
    return figures


def _ms(seconds: object) -> str:
    return "-" if not isinstance(seconds, int | float) else f"{seconds * 1000:.0f}"


def _num(x: object, digits: int = 2) -> str:
    return "-" if not isinstance(x, int | float) else f"{x:.{digits}f}"


MEMORY_HEAD = ["model", "memory", "budget", "evidence tokens", "chapter recall", "chapter precision", "cut",
               "ingest s", "ingest calls", "memory $", "recall p50/p95/p99 ms"]


def memory_table(runs: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """One row per configuration with memory figures (scores.json rows)."""
    rows = []
    for run in runs:
        m = run.get("memory")
        if not m:
            continue
        latency = "/".join(_ms(m.get(k)) for k in ("recall_p50", "recall_p95", "recall_p99"))
        rows.append([str(run["model"]), str(run["mode"]), m.get("budget", "-"), _num(m.get("evidence_tokens"), 0),
                     _num(m.get("retrieval_recall")), _num(m.get("retrieval_precision")),
                     str(m.get("cut_questions", 0)), _num(m.get("ingest_seconds")),
                     str(m.get("ingest_calls", "-") if m.get("ingest_calls") is not None else "-"),
                     _num(m.get("memory_usd"), 4), latency if latency != "-/-/-" else "-"])
    return rows


def budget_note(runs: Sequence[Mapping[str, Any]]) -> str | None:
    """One line when the rows had different evidence budgets: their scores
    do not compare like for like."""
    by_budget: dict[str, list[str]] = {}
    for run in runs:
        label = (run.get("memory") or {}).get("budget")
        if label:
            by_budget.setdefault(label, []).append(str(run["mode"]))
    if len(by_budget) < 2:
        return None
    parts = "; ".join(f"{label}: {', '.join(dict.fromkeys(modes))}" for label, modes in by_budget.items())
    return f"note: these rows had different evidence budgets ({parts}): compare rows within a budget"
