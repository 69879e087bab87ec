"""What the scores and reports say of the memory systems: per configuration
(model, memory), the evidence and its budget, retrieval recall and precision
of the ground-truth chapters, and the cost and latency of each phase.

    row["memory"] = memory_figures(records, run["memory"].get(mode), model)   # scores.json
    memory_table(summary)        # report.md and index.html: one row per configuration
    budget_note(summary)         # one line when ranked rows had different budgets

Retrieval recall and precision are means over the questions that define
them (records' `retrieval_recall` / `retrieval_precision`, budget.coverage).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import NotRequired, TypedDict

from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.memory.contract import Budget
from engine.benchmark.memory.meter import Percentiles, PhaseRecord
from engine.tokens import CL100K_BASE


class BudgetRecord(TypedDict):
    passages: int | None
    tokens: int | None
    tokenizer: NotRequired[str]   # what the tokens are counted in (absent in older runs: cl100k_base)


class EvidenceRecord(TypedDict):
    """The evidence a memory system gave over the run's questions."""
    questions: int
    failed: int
    tokens: Percentiles
    passages: Percentiles
    cut_questions: int
    cut_passages: int
    cut_tokens: int


class MemoryEntry(TypedDict):
    """One memory system in run.json's "memory"."""
    origin: str | None
    prompt: str                   # rag | book | finetuned
    answers: bool                 # agent style: the system answered itself
    budget: BudgetRecord | None   # the budget it was handed; None: the whole book, or the weights
    budgets: NotRequired[dict[str, BudgetRecord]]  # each answering model's, in its tokenizer (its rows' cut)
    phases: dict[str, PhaseRecord]
    recall_latency: Percentiles
    evidence: EvidenceRecord
    failure: str | None


class MemoryFigures(TypedDict, total=False):
    """A configuration's memory figures in scores.json: what its results
    say (the same for every execution of the run). Each system's time,
    calls, dollars and latency are in scores.json's "memory" (run.json's)."""
    budget: str                       # "12 passages / 2,176 tokens (cl100k_base)", "whole book", "none (weights)"
    answers: bool                     # the system answered itself (agent style)
    evidence_tokens: float | None     # mean over answered questions
    retrieval_recall: float | None
    retrieval_precision: float | None
    cut_questions: int                # questions whose evidence the budget cut
    failure: str | None


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def budget_label(entry: MemoryEntry | None, model: str | None = None) -> str:
    """The budget of `model`'s rows (its own, in its tokenizer; else the one
    the system was handed), as the reports show it."""
    if entry is None:
        return "not stated"
    budget = (entry.get("budgets") or {}).get(model or "") or entry.get("budget")
    if budget is None:
        return "none (weights)" if entry.get("prompt") == "finetuned" else "whole book"
    return Budget(passages=budget.get("passages"), tokens=budget.get("tokens"),
                  tokenizer=budget.get("tokenizer", CL100K_BASE)).label()


def memory_figures(records: Sequence[ResultRecord], entry: MemoryEntry | None, model: str | None = None
                   ) -> MemoryFigures:
    """One configuration's memory figures: from its records, and from
    run.json's entry of its memory system (None: a run without one);
    `model`: the configuration's answering model, whose budget it had."""
    with_evidence = [r for r in records if r.evidence_tokens is not None]
    figures: MemoryFigures = {
        "budget": budget_label(entry, model),
        "evidence_tokens": _mean([float(r.evidence_tokens or 0) for r in with_evidence]),
        "retrieval_recall": _mean([r.retrieval_recall for r in records if r.retrieval_recall is not None]),
        "retrieval_precision": _mean([r.retrieval_precision for r in records if r.retrieval_precision is not None]),
        "cut_questions": sum(1 for r in records if r.evidence_cut),
    }
    if entry is not None:
        figures.update({"answers": bool(entry.get("answers")), "failure": entry.get("failure")})
    return figures


def memory_usd(entry: MemoryEntry | None) -> float:
    """What the system's own model calls cost, every phase."""
    if entry is None:
        return 0.0
    return round(sum(float(p["spent_usd"] or 0) for p in entry["phases"].values()), 6)


def _ms(seconds: object) -> str:
    return "-" if not isinstance(seconds, int | float) else f"{seconds * 1000:.0f}"


def _num(x: object, digits: int = 2) -> str:
    return "-" if not isinstance(x, int | float) else f"{x:.{digits}f}"


MEMORY_HEAD = ["model", "memory", "budget", "evidence tokens", "chapter recall", "chapter precision", "cut",
               "ingest s", "ingest calls", "memory $", "recall p50/p95/p99 ms"]


def memory_table(runs: Sequence[Mapping[str, object]], systems: Mapping[str, MemoryEntry]) -> list[list[str]]:
    """One row per configuration with memory figures (scores.json's rows),
    with its system's phases (scores.json's "memory")."""
    rows = []
    for run in runs:
        m = run.get("memory")
        if not isinstance(m, dict):
            continue
        entry = systems.get(str(run["mode"]))
        ingest = entry["phases"].get("ingest") if entry else None
        latency = entry["recall_latency"] if entry else None
        timing = "/".join(_ms(latency[k]) for k in ("p50", "p95", "p99")) if latency else "-"
        rows.append([str(run["model"]), str(run["mode"]), m.get("budget", "-"), _num(m.get("evidence_tokens"), 0),
                     _num(m.get("retrieval_recall")), _num(m.get("retrieval_precision")),
                     str(m.get("cut_questions", 0)), _num(ingest["seconds"] if ingest else None),
                     str(ingest["calls"]) if ingest else "-", _num(memory_usd(entry) if entry else None, 4),
                     timing if timing != "-/-/-" else "-"])
    return rows


_LABEL = re.compile(r"^(?:(?P<passages>\d[\d,]*) passages)?(?: / )?(?:[\d,]+ tokens \((?P<tokenizer>[\w.-]+)\))?$")


def _same_budget(a: str, b: str) -> bool:
    """Two budget labels are the run's one budget counted in two readers'
    tokenizers: the same passages, tokens each in its own tokenizer."""
    found_a, found_b = _LABEL.match(a), _LABEL.match(b)
    if found_a is None or found_b is None or None in (found_a["tokenizer"], found_b["tokenizer"]):
        return a == b
    return found_a["passages"] == found_b["passages"] and found_a["tokenizer"] != found_b["tokenizer"]


def budget_note(runs: Sequence[Mapping[str, object]]) -> str | None:
    """One line when the rows had different evidence budgets: their scores
    do not compare like for like. Rows whose budgets differ only in their
    answering models' tokenizers (the same passages, the tokens each in its
    reader's tokenizer) had the run's one budget: they are not set apart."""
    by_budget: dict[str, list[str]] = {}
    for run in runs:
        memory = run.get("memory")
        label = memory.get("budget") if isinstance(memory, dict) else None
        if isinstance(label, str):
            by_budget.setdefault(label, []).append(str(run["mode"]))
    if all(_same_budget(a, b) for a, b in combinations(by_budget, 2)):
        return None
    parts = "; ".join(f"{label}: {', '.join(dict.fromkeys(modes))}" for label, modes in by_budget.items())
    return f"note: these rows had different evidence budgets ({parts}): compare rows within a budget"


def _no_percentiles(count: int) -> Percentiles:
    return {"count": count, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}


def _merged_phases(entries: Sequence[MemoryEntry]) -> dict[str, PhaseRecord]:
    phases: dict[str, PhaseRecord] = {}
    for entry in entries:
        for name, p in entry["phases"].items():
            acc = phases.setdefault(name, {"seconds": 0.0, "calls": 0, "cached": 0, "failed": 0, "input_tokens": 0,
                                           "output_tokens": 0, "spent_usd": 0.0, "list_usd": 0.0})
            acc["seconds"] = max(acc["seconds"], p["seconds"])  # shards run side by side
            for key in ("calls", "cached", "failed", "input_tokens", "output_tokens"):
                acc[key] += p[key]
            acc["spent_usd"] = round(acc["spent_usd"] + p["spent_usd"], 6)
            acc["list_usd"] = round(acc["list_usd"] + p["list_usd"], 6)
    return phases


def merge_memory_entries(entries: Sequence[MemoryEntry]) -> MemoryEntry:
    """One system's entry over several executions (the shards of a run):
    each prepared the system, so calls and dollars add up and a phase took
    the longest one's time; percentiles cannot be merged from percentiles,
    so the merged entry keeps only their counts."""
    if len(entries) == 1:
        return entries[0]
    first = entries[0]
    evidence: EvidenceRecord = {
        "questions": sum(e["evidence"]["questions"] for e in entries),
        "failed": sum(e["evidence"]["failed"] for e in entries),
        "tokens": _no_percentiles(sum(e["evidence"]["tokens"]["count"] for e in entries)),
        "passages": _no_percentiles(sum(e["evidence"]["passages"]["count"] for e in entries)),
        "cut_questions": sum(e["evidence"]["cut_questions"] for e in entries),
        "cut_passages": sum(e["evidence"]["cut_passages"] for e in entries),
        "cut_tokens": sum(e["evidence"]["cut_tokens"] for e in entries)}
    failures = [e["failure"] for e in entries if e["failure"]]
    return {**first, "phases": _merged_phases(entries),
            "recall_latency": _no_percentiles(sum(e["recall_latency"]["count"] for e in entries)),
            "evidence": evidence, "failure": failures[0] if failures else None}
