"""Why a run made fewer (or more) calls than it planned: the line `tulving run`
prints after the progress line's total when the two differ.

The plan (pipeline.expected_calls) counts, per question of every job, an
answer, a judgment and, for a chronological question with a ground truth,
the chronological judgment. Some of those are never needed: a failed answer
is not judged; a chronological judgment is asked only of an answer in which
the judge found items to order. Unparsable judge replies are drawn again, on
top of the plan. The counts use the run's vocabulary (docs/reports.md, "What
the counts mean").
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from engine.benchmark.evaluation.results import ResultRecord


def _chronological(r: ResultRecord) -> bool:
    """Whether the plan counted a chronological judgment for this result."""
    return r.get == "chronological" and bool(r.correct_answer)


def _main_judgment_failed(r: ResultRecord) -> bool:
    error = r.judge_error or ""
    return r.judge_failed and not error.startswith(("chronological", "unparsable chronological"))


def not_needed(records: Iterable[ResultRecord]) -> dict[str, int]:
    """The planned calls the run did not need, by why."""
    why: dict[str, int] = {}

    def add(reason: str, n: int) -> None:
        if n:
            why[reason] = why.get(reason, 0) + n

    for r in records:
        if r.answer_error:
            add("judgments of answers that failed", 1 + _chronological(r))
        elif _main_judgment_failed(r):
            add("chronological judgments after a failed judgment", int(_chronological(r)))
        elif _chronological(r) and not r.identified_items:
            add("chronological judgments of answers that named no event to order", 1)
    return why


def planned_line(planned: int, records: Sequence[ResultRecord], spending: Iterable[Mapping[str, object]]) -> str:
    """"of the 1,889 calls planned, 7 were not needed (...)", or "" when the
    run made exactly what it planned. `planned`: the answers and judgments
    planned; the memory systems' calls (embeddings, extraction: planned as
    their streams opened) are added from `spending`, so the figures are those
    of the progress line's total."""
    rows = list(spending)
    embeds = sum(int(str(row.get("calls", 0))) for row in rows
                 if row.get("role") == "embed" or str(row.get("role", "")).startswith("memory "))
    made = sum(int(str(row.get("calls", 0))) + int(str(row.get("not_sent", 0) or 0)) for row in rows)
    planned += embeds
    if made == planned:
        return ""
    parts = []
    skipped = not_needed(records)
    if skipped:
        parts.append(f"{sum(skipped.values()):,} were not needed: "
                     + "; ".join(f"{n:,} {reason}" for reason, n in skipped.items()))
    redraws = sum(max(0, r.judge_draws - 1) for r in records)
    if redraws:
        parts.append(f"{redraws:,} re-draws of unparsable judge replies came on top")
    return f"of the {planned:,} calls planned, " + ("; ".join(parts) if parts else f"{made:,} were made")


def cached_line(spending: Iterable[Mapping[str, object]]) -> str:
    """What "cached" counts, said once under the totals when some calls were
    cached: a brand-new cache has hits too, when the run asks the same thing
    twice (one judgment of the same answer to the same question, asked by two
    memory modes or by two questions of the same text)."""
    cached = sum(int(str(row.get("cached", 0) or 0)) for row in spending)
    if not cached:
        return ""
    return (f"cached: {cached:,} calls answered by Tulving's cache, or by an identical call of this run (the same "
            f"prompt to the same model, e.g. one judgment of an answer given twice): nothing sent, nothing paid")
