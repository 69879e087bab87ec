"""Judge agreement: the same answers judged by two judges.

Two runs of the same book and (model, mode) with different `--judge` (the
answers come from the cache, so they are the same answers) are paired by
question. Per pair of judges: the figures of scores.agreement (Pearson,
Spearman, mean absolute difference of F1, share of identical F1) plus the
share of identical item sets (the judges identified the same items), a
scatter plot, and the questions where the F1 differ most.

Used by `tulving agreement RUN_A RUN_B` and as a section of `tulving report`
when its runs hold the same configuration under two judges.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from engine.benchmark.evaluation import figures as F
from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.evaluation.runset import RunKey, RunSet
from engine.benchmark.evaluation.scores import agreement
from engine.benchmark.evaluation.tables import Table

TOP_DISAGREEMENTS = 20


@dataclass(slots=True)
class JudgePair:
    a: RunKey
    b: RunKey
    figures: dict[str, float | int | None]               # scores.agreement + identical_items
    pairs: list[tuple[ResultRecord, ResultRecord]]   # questions judged by both (answers equal or not)
    different_answers: int                   # questions whose answers differ between the runs

    @property
    def name(self) -> str:
        return f"{self.a.model} / {self.a.mode}: {self.a.judge} vs {self.b.judge}"


def judge_pairs(runset: RunSet) -> list[tuple[RunKey, RunKey]]:
    """Configurations present under two judges (same book, model, mode)."""
    by_config: dict[tuple[str, str, str], list[RunKey]] = {}
    for key in runset.groups:
        by_config.setdefault((key.book, key.model, key.mode), []).append(key)
    return [(a, b) for keys in by_config.values() for a, b in combinations(sorted(keys), 2)]


def _items(r: ResultRecord) -> frozenset[str]:
    return frozenset(str(i).strip().lower() for i in (r.identified_items or []))


def compare_judges(runset: RunSet, a: RunKey, b: RunKey) -> JudgePair:
    by_q = {r.q_idx: r for r in runset.groups[b]}
    pairs = [(r, by_q[r.q_idx]) for r in runset.groups[a] if r.q_idx in by_q]
    figures = agreement({ra.q_idx: ra.f1 for ra, _ in pairs}, {rb.q_idx: rb.f1 for _, rb in pairs})
    judged = [(ra, rb) for ra, rb in pairs if ra.f1 is not None and rb.f1 is not None]
    figures["identical_items"] = (sum(_items(ra) == _items(rb) for ra, rb in judged) / len(judged)) if judged else None
    different = sum(1 for ra, rb in pairs if ra.answer != rb.answer)
    return JudgePair(a=a, b=b, figures=figures, pairs=pairs, different_answers=different)


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def summary_table(results: Sequence[JudgePair]) -> Table:
    rows = []
    for p in results:
        f = p.figures
        rows.append([p.a.book, p.a.model, p.a.mode, p.a.judge, p.b.judge, str(f["n"]), _num(f["pearson"]),
                     _num(f["spearman"]), _num(f["mean_abs_diff"]), _num(f["identical"]),
                     _num(f["identical_items"]), _num(f["mean_a"]), _num(f["mean_b"]), str(p.different_answers)])
    return Table(key="judge_agreement", title="Judge agreement (F1 per question)",
                 head=["Book", "Model", "Memory", "judge A", "judge B", "questions", "Pearson", "Spearman",
                       "mean |F1 A - F1 B|", "identical F1", "identical item sets", "mean F1 A", "mean F1 B",
                       "answers differ"],
                 rows=rows, label_columns=5,
                 note="Questions judged by both judges (judge failures left out). 'answers differ' should be 0: "
                      "the runs should answer from the same cache.")


def disagreement_table(results: Sequence[JudgePair], top: int = TOP_DISAGREEMENTS) -> Table:
    rows = []
    for p in results:
        judged = [(ra, rb, fa, fb) for ra, rb in p.pairs if (fa := ra.f1) is not None and (fb := rb.f1) is not None]
        judged.sort(key=lambda t: (-abs(t[2] - t[3]), t[0].q_idx))
        for ra, rb, fa, fb in judged[:top]:
            if abs(fa - fb) < 1e-9:
                break
            rows.append([p.a.model, p.a.mode, p.a.judge, p.b.judge, str(ra.q_idx), ra.question,
                         "; ".join(map(str, ra.correct_answer or [])), ra.answer,
                         "; ".join(map(str, ra.identified_items or [])), "; ".join(map(str, rb.identified_items or [])),
                         f"{fa:.3f}", f"{fb:.3f}"])
    return Table(key="judge_disagreements", title="Where the judges disagree most",
                 head=["Model", "Memory", "judge A", "judge B", "q", "question", "ground truth", "answer",
                       "items (A)", "items (B)", "F1 A", "F1 B"], rows=rows, label_columns=4,
                 note=f"Up to {top} questions per pair of judges, largest |F1 A - F1 B| first.")


def agreement_results(runset: RunSet) -> list[JudgePair]:
    return [compare_judges(runset, a, b) for a, b in judge_pairs(runset)]


def agreement_figures(results: Sequence[JudgePair], folder: Path) -> list[F.Figure]:
    out = []
    for i, p in enumerate(results):
        judged = [(ra.f1, rb.f1) for ra, rb in p.pairs if ra.f1 is not None and rb.f1 is not None]
        if judged:
            fig = F.agreement_scatter(folder, [x for x, _ in judged], [y for _, y in judged],
                                      (p.a.judge, p.b.judge), name=f"judge_agreement_{i + 1}" if len(results) > 1
                                      else "judge_agreement", subtitle=f"{p.a.model} / {p.a.mode}")
            out.append(fig)
    return out
