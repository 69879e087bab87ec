"""Scores of a run per (model, mode), and the leaderboard and tables made from them.

`summarize(records, run)` gives the content of `scores.json`; `render_markdown`
the `report.md` (leaderboard + the paper's F1-by-bin table + details);
`leaderboard_text` the plain table printed at the end of `tulving run`.

`run` is the content of `run.json` (written by command.py): the book, judge,
jobs (with their sample size), calls and cache hits of this run. Without it
(`tulving report` on a bare results.jsonl) those figures are left out.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NotRequired, TypedDict

import numpy as np

from engine.benchmark.evaluation.formats import current as current_version
from engine.benchmark.evaluation.intervals import NOTE as INTERVALS_NOTE
from engine.benchmark.evaluation.intervals import score_intervals
from engine.benchmark.evaluation.memory_report import (
    MEMORY_HEAD,
    MemoryEntry,
    MemoryFigures,
    budget_note,
    memory_figures,
    memory_table,
)
from engine.benchmark.evaluation.realism import RealismSplit, realism_markdown, realism_split
from engine.benchmark.evaluation.repeats import RepeatSpread, spread_markdown
from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.evaluation.scores import BINS, bin_mean, chronological_awareness, simple_recall
from engine.benchmark.evaluation.statistics import format_ranking, rank_runs
from engine.errors import printable
from engine.progress import duration
from providers.base import BUDGET


# -- scores.json ------------------------------------------------------------------
class BinCell(TypedDict):
    mean: float | None        # as the scores use it (bin_mean); None: no question scored
    sd: float | None
    count: int                # questions scored
    asked: int


class LatestPart(TypedDict):
    score: float | None
    bins: dict[str, float]
    counts: dict[str, int]


class OrderPart(TypedDict):
    considered: int
    exact_matches: int
    all: float | None
    tau: float | None
    score: float | None


class Execution(TypedDict):
    """How a configuration's calls went."""
    scored: int
    answer_errors: int
    incomplete: int           # results missing because a call failed (answer or judge)
    not_sent: int             # of those: calls --max-cost refused before sending
    judge_failures: int
    judge_redraws: int
    cost_usd: float


class JobFigures(TypedDict, total=False):
    """What run.json's job adds to a row."""
    calls: int
    cache_hits: int
    spent_usd: float
    wall_seconds: float
    smoke: bool               # a smoke check (the default run's local LLM on a question or two): never ranked
    answer_seconds: float     # a smoke check's mean answer latency (kept by the cache: a rerun's too)


class RunRow(Execution, JobFigures):
    """One configuration (model, mode) of scores.json."""
    model: str
    mode: str
    questions: int
    sample: int | None
    simple_recall: float | None
    chronological_awareness: float | None
    chronological_asked: bool
    bins: dict[str, BinCell]
    latest: LatestPart
    order: OrderPart
    # 95% bootstrap intervals over questions ([low, high]; None: undefined), see statistics.score_interval
    simple_recall_ci: list[float] | None
    chronological_awareness_ci: list[float] | None
    no_valid_judgments: bool  # every judgment failed: the row has no score and is never ranked
    memory: NotRequired[MemoryFigures]  # the memory system's evidence, budget, phases (memory_report.py)


class RankedPair(TypedDict):
    a: str
    b: str
    p: float
    p_holm: float
    significant: bool


class Ranking(TypedDict):
    n_questions: int
    average_ranks: dict[str, float]
    cliques: list[list[str]]
    friedman_p: float | None
    pairs: list[RankedPair]
    text: str


class Scores(TypedDict):
    """scores.json of one book and judge (schemas/scores.schema.json)."""
    scores_version: NotRequired[str]              # formats.py: "MAJOR.MINOR"
    book: str | None
    judge: str
    questions: int
    runs: list[RunRow]
    embed_model: NotRequired[str]
    spending: NotRequired[list[dict[str, Any]]]   # engine.spending's rows
    ranking: NotRequired[Ranking]
    provenance: NotRequired[dict[str, Any]]       # run.json's: version, commit, command, models, times
    intervals: NotRequired[str]                   # how the intervals were computed
    realism: NotRequired[dict[str, RealismSplit]]  # "model / mode" -> the realism ablation (realism.py)
    repeats: NotRequired[dict[str, RepeatSpread]]  # "model / mode" -> run-to-run spread (--repeats, repeats.py)
    partial: NotRequired[str]                     # why these scores cover part of the run (a shard's, "1/3")
    memory: NotRequired[dict[str, MemoryEntry]]   # run.json's: each memory system's phases, latency, evidence


BASELINE_NOTES = {
    "builtin:reader": "lexical baseline (string matching, not an LLM)",
}


def _nan_to_none(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def _bin_table(records: Sequence[ResultRecord], get: str) -> dict[str, BinCell]:
    out: dict[str, BinCell] = {}
    for b in BINS:
        values = [r.f1 for r in records if r.get == get and r.bin == b and r.f1 is not None]
        asked = sum(1 for r in records if r.get == get and r.bin == b)
        if not asked:
            continue
        arr = np.asarray(values, dtype=float)
        out[b] = {"mean": bin_mean(values) if len(arr) else None,  # as the scores use it
                  "sd": round(float(arr.std(ddof=1)), 2) if len(arr) > 1 else (0.0 if len(arr) else None),
                  "count": len(values), "asked": asked}
    return out


def _execution(records: Sequence[ResultRecord]) -> Execution:
    """How the row's calls went: scored, errors, failures, re-draws, cost."""
    return {
        "scored": sum(1 for r in records if r.f1 is not None),
        "answer_errors": sum(1 for r in records if r.answer_error),
        # results missing because a call failed (answer or judge): the row is incomplete
        "incomplete": sum(1 for r in records
                          if r.answer_error or (r.judge_failed and "call failed" in (r.judge_error or ""))),
        "judge_failures": sum(1 for r in records if r.judge_failed),
        "not_sent": sum(1 for r in records if _not_sent(r)),
        "judge_redraws": sum(max(0, r.judge_draws - 1) for r in records),
        "cost_usd": round(sum(r.cost + r.judge_cost for r in records), 6),
    }


def _not_sent(r: ResultRecord) -> bool:
    """A result missing because --max-cost refused its call before sending it."""
    return (r.answer_error or "").startswith(f"{BUDGET}:") or (
        r.judge_failed and f"failed: {BUDGET}:" in (r.judge_error or ""))


def _add_job_figures(figures: RunRow, job: Mapping[str, Any]) -> None:
    """The calls, cache hits, spending and wall time run.json's job recorded (those it holds)."""
    if "calls" in job:
        figures["calls"] = job["calls"]
    if "cache_hits" in job:
        figures["cache_hits"] = job["cache_hits"]
    if "spent_usd" in job:
        figures["spent_usd"] = job["spent_usd"]
    if "wall_seconds" in job:
        figures["wall_seconds"] = job["wall_seconds"]
    if job.get("smoke"):
        figures["smoke"] = True


def summarize_run(model: str, mode: str, records: Sequence[ResultRecord],
                  job: Mapping[str, Any] | None = None, memory: MemoryEntry | None = None) -> RunRow:
    sr, _ = simple_recall(records)
    ca, parts = chronological_awareness(records)
    intervals = score_intervals(records)
    any_latest = any(r.get == "latest" for r in records)
    any_chrono = any(r.get == "chronological" for r in records)
    row: RunRow = {
        "model": model,
        "mode": mode,
        "questions": len(records),
        "sample": (job or {}).get("sample"),
        "simple_recall": _nan_to_none(sr),
        # undefined parts (nan) are null, never 0
        "chronological_awareness": _nan_to_none(ca) if (any_latest or any_chrono) else None,
        # asked but null: undefined (no considered chronological question), shown as such
        "chronological_asked": any_latest or any_chrono,
        "bins": _bin_table(records, "all"),
        "latest": {"score": _nan_to_none(round(parts.latest, 4)), "bins": parts.latest_bins,
                   "counts": parts.latest_counts},
        "order": {"considered": parts.considered, "exact_matches": parts.exact_matches,
                  "all": _nan_to_none(parts.all), "tau": _nan_to_none(parts.tau),
                  "score": _nan_to_none(round(parts.order, 4))},
        "simple_recall_ci": intervals.simple_recall if sr == sr else None,
        "chronological_awareness_ci": intervals.chronological_awareness if ca == ca else None,
        "no_valid_judgments": bool(records) and all(r.f1 is None for r in records),
        **_execution(records),  # type: ignore[typeddict-item]  # the job's figures follow
    }
    if job is not None:
        _add_job_figures(row, job)
    if memory is not None or any(r.evidence_tokens is not None for r in records):
        row["memory"] = memory_figures(records, memory, model)
    if row.get("smoke") and records:
        row["answer_seconds"] = round(sum(r.latency for r in records) / len(records), 1)
    return row


def _job_meta(run: Mapping[str, Any] | None) -> dict[tuple[str, str], Mapping[str, Any]]:
    return {(j["model"], j["mode"]): j for j in (run or {}).get("jobs", [])}


def summarize(records: Iterable[ResultRecord], run: Mapping[str, Any] | None = None) -> Scores:
    groups: dict[tuple[str, str], list[ResultRecord]] = {}
    for r in records:
        groups.setdefault((r.model, r.mode), []).append(r)
    meta = _job_meta(run)
    systems = (run or {}).get("memory") or {}
    rows = [summarize_run(model, mode, recs, meta.get((model, mode)), systems.get(mode))
            for (model, mode), recs in groups.items()]
    # Runs on a sample are not comparable: they are listed after the full runs.
    # Incomplete runs (calls failed) are not comparable either: listed last.
    # A row without a single valid judgment has no score at all: last, never ranked.
    # A smoke check is no score: after everything.
    rows.sort(key=lambda row: (bool(row.get("smoke")), row["no_valid_judgments"], row["incomplete"] > 0,
                               row["sample"] is not None,
                               -(row["simple_recall"] if row["simple_recall"] is not None else -1),
                               -(row["chronological_awareness"] or 0), row["model"], row["mode"]))
    judges = sorted({r.judge for recs in groups.values() for r in recs})
    out: Scores = {
        "scores_version": current_version("scores"),
        "book": (run or {}).get("book"),
        "judge": (run or {}).get("judge") or ", ".join(judges),
        "questions": (run or {}).get("questions") or max((len(v) for v in groups.values()), default=0),
        "runs": rows,
    }
    _copy_run_parts(out, run or {})
    out["intervals"] = INTERVALS_NOTE
    ranking = _ranking(groups, rows)
    if ranking is not None:
        out["ranking"] = ranking
    return out


def _copy_run_parts(out: Scores, run: Mapping[str, Any]) -> None:
    """What scores.json repeats of run.json: embedding model, spending (by
    model and role), provenance, run-to-run spread, the memory systems' phases."""
    if run.get("embed_model"):
        out["embed_model"] = run["embed_model"]
    if run.get("spending"):
        out["spending"] = list(run["spending"])
    if run.get("provenance"):
        out["provenance"] = dict(run["provenance"])
    if run.get("repeats"):
        out["repeats"] = dict(run["repeats"])
    if run.get("memory"):
        out["memory"] = dict(run["memory"])
    partial = _partial(run)
    if partial:
        out["partial"] = partial


def _partial(run: Mapping[str, Any]) -> str | None:
    """Why the scores cover part of the run: run.json's own `partial` (an
    answers file that leaves questions out), the shards missing from a
    sharded run's scores (one shard, or some merged), or None."""
    if isinstance(run.get("partial"), str):
        return str(run["partial"])
    shards = [run["shard"]] if run.get("shard") else list(run.get("shards") or [])
    if not shards:
        return None
    total = str(shards[0]).partition("/")[2]
    if not total.isdigit() or len(set(shards)) >= int(total):
        return None
    mine = sorted({str(s).partition("/")[0] for s in shards}, key=lambda i: int(i) if i.isdigit() else 0)
    return (f"PARTIAL: shard{'s' if len(mine) > 1 else ''} {', '.join(mine)} of {total} only; report the "
            f"{total} shards' folders together (tulving report DIR... --out REPORT) for the run's scores")


SPENDING_HEAD = ["model", "role", "calls", "cached", "tokens in", "prompt cache read", "prompt cache written",
                 "tokens out", "spent (USD)", "list price (USD)", "prompt caching saved (USD)"]
SPENDING_NOTE = ("Calls of this execution, cached ones among them (answered by Tulving's cache or by an identical "
                 "call of the run: nothing sent, free). List price: the same calls at the alias's prices without "
                 "prompt caching or batch; prompt caching saved: list price without caching minus with it, at the "
                 "price each call paid.")


def spending_rows(spending: Iterable[Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for r in spending:
        rows.append([str(r["model"]), str(r["role"]), str(r["calls"]), str(r["cached"]), f"{r['input_tokens']:,}",
                     f"{r['cache_read_tokens']:,}", f"{r['cache_write_tokens']:,}", f"{r['output_tokens']:,}",
                     f"{r['spent_usd']:.4f}", f"{r['list_usd']:.4f}", f"{r['caching_saved_usd']:.4f}"])
    if len(rows) > 1:
        rows.append(["total", "", str(sum(r["calls"] for r in spending)), str(sum(r["cached"] for r in spending)),
                     f"{sum(r['input_tokens'] for r in spending):,}", f"{sum(r['cache_read_tokens'] for r in spending):,}",
                     f"{sum(r['cache_write_tokens'] for r in spending):,}",
                     f"{sum(r['output_tokens'] for r in spending):,}", f"{sum(r['spent_usd'] for r in spending):.4f}",
                     f"{sum(r['list_usd'] for r in spending):.4f}",
                     f"{sum(r['caching_saved_usd'] for r in spending):.4f}"])
    return rows


def _ranking(groups: Mapping[tuple[str, str], Sequence[ResultRecord]],
             rows: Sequence[RunRow]) -> Ranking | None:
    """The paper's CD analysis over the full runs: average F1 rank per question,
    Holm-adjusted pairwise Wilcoxon tests, on the questions every run scored."""
    full = [(row["model"], row["mode"]) for row in rows if row["sample"] is None and not row["no_valid_judgments"]]
    if len(full) < 2:
        return None
    f1 = {key: {r.q_idx: r.f1 for r in groups[key] if r.f1 is not None} for key in full}
    common = sorted(set.intersection(*(set(v) for v in f1.values())))
    if len(common) < 2:
        return None
    scores = {f"{model} / {mode}": [f1[(model, mode)][q] for q in common] for model, mode in full}
    result = rank_runs(scores)
    return {"n_questions": result.n_questions, "average_ranks": result.average_ranks,
            "cliques": result.cliques, "friedman_p": result.friedman_p,
            "pairs": [{"a": t.a, "b": t.b, "p": t.p_value, "p_holm": t.p_holm, "significant": t.significant}
                      for t in result.pairs],
            "text": format_ranking(result)}


# -- rendering ---------------------------------------------------------------------

def _fmt(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _fmt_score(x: float | None, asked: bool) -> str:
    """A score: "undefined" when its questions were asked but it has no value
    (e.g. no chronological question with two or more distinct items), "-"
    when they were not asked."""
    if x is None:
        return "undefined" if asked else "-"
    return f"{x:.3f}"


def _notes(row: RunRow, total: int) -> str:
    notes = []
    if row.get("no_valid_judgments"):
        notes.append("NO VALID JUDGMENTS: every judgment failed, not ranked")
    unsent = row.get("not_sent", 0)
    if unsent:
        notes.append(f"NOT SENT: {unsent}/{row['questions']} results missing (not sent: --max-cost reached; "
                     "rerun with a higher --max-cost)")
    if row.get("incomplete", 0) > unsent:
        notes.append(f"INCOMPLETE: {row['incomplete'] - unsent}/{row['questions']} results missing (calls failed; "
                     "rerun to retry them)")
    if row["model"] in BASELINE_NOTES:
        notes.append(BASELINE_NOTES[row["model"]])
    if row.get("sample"):
        notes.append(f"sample of {row['sample']}/{total} questions (not comparable to full runs)")
    if row["judge_failures"]:
        notes.append(f"{row['judge_failures']} judge failure(s) left out")
    if row["answer_errors"]:
        notes.append(f"{row['answer_errors']} answer error(s) left out")
    return "; ".join(notes)


def _score_cell(row: RunRow, name: str, asked: bool) -> str:
    """A leaderboard score with its 95% interval: "0.512 [0.471, 0.553]"."""
    if row.get("no_valid_judgments"):
        return "no valid judgments"
    value: float | None = row[name]  # type: ignore[literal-required]
    text = _fmt_score(value, asked) if name != "simple_recall" else _fmt(value)
    ci: list[float] | None = row.get(f"{name}_ci")  # type: ignore[assignment]
    return f"{text} [{ci[0]:.3f}, {ci[1]:.3f}]" if value is not None and ci else text


def smoke_lines(summary: Scores) -> list[str]:
    """The smoke checks, set apart from the leaderboard: what they show (the
    model answers end to end) and what a score of it would take."""
    total = summary.get("questions") or 0
    lines = []
    for row in summary["runs"]:
        if not row.get("smoke"):
            continue
        model, mode = printable(row["model"]), printable(row["mode"])
        embed = f" --embed-model {summary['embed_model']}" if mode.startswith("rag") and summary.get("embed_model") \
            else ""
        each, n = row.get("answer_seconds"), row["questions"]
        pace = (f" (at this run's {each:.0f} s an answer, all {total} take about {duration(total * each)})"
                if each else "")
        lines.append(f"Smoke check, not ranked: {model} / {mode} answered {n} of the {total} questions (Simple "
                     f"Recall {_fmt(row['simple_recall'])} on {row['scored']} scored): a sign that it runs end to "
                     f"end, not a score. To score it: tulving run --models {model} --modes {mode}{embed}{pace}.")
    return lines


def leaderboard_rows(summary: Scores) -> list[list[str]]:
    """The leaderboard's rows (smoke checks apart: `smoke_lines`)."""
    total = summary.get("questions") or 0
    rows = []
    rank = 0
    for row in summary["runs"]:
        if row.get("smoke"):
            continue
        ranked = not row.get("incomplete") and not row.get("no_valid_judgments")
        rank += ranked  # an incomplete run, or one without a valid judgment, is listed, not ranked
        rows.append([str(rank) if ranked else "-", printable(row["model"]),
                     printable(row["mode"]), _score_cell(row, "simple_recall", True),
                     _score_cell(row, "chronological_awareness", row.get("chronological_asked", False)),
                     f"{row['scored']}/{row['questions']}",
                     str(row["judge_failures"]), _notes(row, total)])
    return rows


_LEADER_HEAD = ["#", "model", "mode", "Simple Recall [95% CI]", "Chronological Awareness [95% CI]", "scored", "judge failures",
                "notes"]


def _plain_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)] if rows else [len(h) for h in head]
    def line(cells: Sequence[object]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(head), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _md_cell(cell: object) -> str:
    """A markdown table cell: control characters escaped, `|` and line breaks
    unable to split the row."""
    return printable(cell).replace("\\", "\\\\").replace("|", "\\|")


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _title(summary: Scores) -> str:
    book = summary.get("book") or "book"
    return f"{book}, {summary.get('questions')} questions, judge {summary.get('judge')}"


def leaderboard_text(summary: Scores) -> str:
    partial = f"{summary['partial']}\n" if summary.get("partial") else ""
    note = budget_note([row for row in summary["runs"] if not row.get("smoke")])
    smoke = "".join(f"\n\n{line}" for line in smoke_lines(summary))
    return (f"Leaderboard ({_title(summary)})\n{partial}" + _plain_table(_LEADER_HEAD, leaderboard_rows(summary))
            + (f"\n{note}" if note else "") + smoke)


def _bins_present(summary: Scores) -> list[str]:
    present = {b for row in summary["runs"] for b in row["bins"]}
    return [b for b in BINS if b in present]


def bin_table_rows(summary: Scores) -> tuple[list[str], list[list[str]]]:
    bins = _bins_present(summary)
    counts = {}
    for b in bins:  # the paper's header shows each bin's question count
        counts[b] = max(((row["bins"][b]["asked"] if b in row["bins"] else 0) for row in summary["runs"]), default=0)
    head = ["Memory", "Model"] + [f"{b} ({counts[b]})" for b in bins]
    rows = []
    for row in sorted(summary["runs"], key=lambda r: (r["mode"], r["model"])):
        cells = [row["mode"], row["model"]]
        for b in bins:
            cell = row["bins"].get(b)
            if not cell or cell["mean"] is None:
                cells.append("-")
            else:
                cells.append(f"{cell['mean']:.2f}±{cell['sd']:.2f}")
        rows.append(cells)
    return head, rows


def render_markdown(summary: Scores) -> str:
    parts = [f"# Episodic Memory Benchmark report\n\n{_title(summary)}."]
    if summary.get("partial"):
        parts.append(f"**{summary['partial']}.**")
    if summary.get("embed_model"):
        parts.append(f"RAG embeddings: {summary['embed_model']}.")
    parts.append("## Leaderboard\n\nSimple Recall: mean over bins of the mean lenient F1 of 'all' questions. "
                 "Chronological Awareness: mean of Latest (F1 of 'latest' questions, bins 2+) and Order "
                 "(exact-match share x Kendall tau). Judge failures and answer errors are left out of the "
                 f"scores and counted. {INTERVALS_NOTE}.\n\n" + _md_table(_LEADER_HEAD, leaderboard_rows(summary)))
    note = budget_note([row for row in summary["runs"] if not row.get("smoke")])
    if note:
        parts.append(note[0].upper() + note[1:] + ".")
    memory_rows = memory_table(summary["runs"], summary.get("memory") or {})
    if memory_rows:
        parts.append("## Memory systems\n\nEach memory system read the book once and gave every answering model "
                     "the same evidence for a question, within the evidence budget (passages, and tokens in that "
                     "model's tokenizer: the budget column names it). "
                     "Chapter recall and precision: of the ground-truth chapters, by the chapters the evidence came "
                     "from. Ingest and recall: the system's own time, calls and dollars (docs/memory-systems.md)."
                     "\n\n" + _md_table(MEMORY_HEAD, memory_rows))
    if smoke_lines(summary):
        parts.append("## Smoke check (not ranked)\n\n" + "\n\n".join(smoke_lines(summary)))
    head, rows = bin_table_rows(summary)
    parts.append("## Simple recall: F1 by number of matching events\n\nMean±sd of the F1 of 'all' questions "
                 "per bin (question count in the header), as in the paper's tables.\n\n" + _md_table(head, rows))
    detail_head = ["Model", "Mode", "Latest", "Order: exact/considered", "Order: tau", "Order",
                   "judge re-draws", "calls", "cached", "cost (USD)"]
    detail_rows = []
    for row in summary["runs"]:
        detail_rows.append([row["model"], row["mode"], _fmt(row["latest"]["score"], 2),
                            f"{row['order']['exact_matches']}/{row['order']['considered']}",
                            _fmt(row["order"]["tau"], 2), _fmt(row["order"]["score"], 2),
                            str(row["judge_redraws"]), str(row.get("calls", "-")),
                            str(row.get("cache_hits", "-")), f"{row['cost_usd']:.4f}"])
    parts.append("## Chronological awareness and calls\n\n" + _md_table(detail_head, detail_rows))
    if summary.get("spending"):
        parts.append("## Cost by model and role\n\n" + SPENDING_NOTE + "\n\n"
                     + _md_table(SPENDING_HEAD, spending_rows(summary["spending"])))
    if summary.get("ranking"):
        parts.append("## Overall comparison (the paper's critical-difference analysis)\n\n```\n"
                     + summary["ranking"]["text"] + "\n```")
    if summary.get("repeats"):
        parts.append(spread_markdown(summary["repeats"]))
    if summary.get("realism"):
        parts.append(realism_markdown(summary["realism"]))
    if summary.get("provenance"):
        parts.append(provenance_markdown(summary["provenance"]))
    baselines = sorted({row["model"] for row in summary["runs"] if row["model"] in BASELINE_NOTES})
    if baselines:
        parts.append("## Notes\n\n" + "\n".join(f"- {m}: {BASELINE_NOTES[m]}; its scores measure how much of "
                                               "the benchmark a lexical shortcut solves." for m in baselines))
    return "\n\n".join(parts) + "\n"


def provenance_markdown(prov: Mapping[str, Any]) -> str:
    """report.md's "Provenance": what the run was made with (no secret is ever
    in it); merged runs (shards, several folders): each one's."""
    if isinstance(prov.get("runs"), list):
        return "\n\n".join(provenance_markdown(p).replace("## Provenance", f"## Provenance of run {i + 1}")
                             for i, p in enumerate(prov["runs"]))
    packages = ", ".join(f"{k} {v}" for k, v in (prov.get("packages") or {}).items())
    lines = [f"- Tulving {prov.get('tulving_version')}, commit {prov.get('git_commit') or 'unknown (not a checkout)'}",
             f"- command: `{' '.join(prov.get('command') or [])}`",
             f"- started {prov.get('started')}, ended {prov.get('ended')} (UTC)",
             f"- Python {prov.get('python')} on {prov.get('platform')}; {packages}",
             f"- config: {prov.get('config')}; cache: {prov.get('cache')}"]
    for name, m in (prov.get("models") or {}).items():
        endpoints = ", ".join(f"{e.get('name')} ({e.get('kind')}{', ' + e['base_url'] if e.get('base_url') else ''})"
                              for e in m.get("endpoints", []))
        lines.append(f"- model {name}: {m.get('model')} via {endpoints}; params {json.dumps(m.get('params'))}; "
                     f"prices {json.dumps(m.get('prices'))}")
    return "## Provenance\n\n" + "\n".join(printable(line) for line in lines)


def add_realism(summary: Scores, records: Iterable[ResultRecord], ratings: Mapping[int, int]) -> None:
    """The realism ablation of every configuration, from the book's chapter ratings."""
    groups: dict[str, list[ResultRecord]] = {}
    for r in records:
        groups.setdefault(f"{r.model} / {r.mode}", []).append(r)
    summary["realism"] = {name: realism_split(recs, ratings) for name, recs in groups.items()}
