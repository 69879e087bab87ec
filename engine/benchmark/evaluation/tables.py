"""The paper's tables for a set of runs, as data, and their Markdown and CSV.

`build_tables(runset)` gives, in report order, `Table`s:
- f1_by_bin_{all,latest,chronological}: F1 mean±sd per bin (0, 1, 2, 3-5,
  6+) for each configuration (the paper's main tables);
- f1_by_cue_bin, f1_by_trace_bin, f1_by_cue_trace, f1_by_cue_items_bin: the
  'all' questions broken down by cue type, retrieval type (trace), both,
  and the number of items the cue fixes;
- latest, chronological: Latest per bin and score; exact matches and
  Kendall's tau over the chronological questions with >= 2 ground-truth items;
- leaderboard: Simple Recall and Chronological Awareness, with the published
  rows beside the user's when the book is a published one;
- published_f1_by_bin: the paper's F1-by-bin rows for a published book;
- execution: calls (cached ones among them), spending and wall time of each configuration.

Every table that holds scores has "judge failures" (questions left out of the
scores) and "notes" (sampled jobs) columns, so neither is ever hidden.

A cell is a str or a `Stat` (mean, sd, n): Markdown and HTML show "0.84±0.37",
CSV gives each Stat column as three numeric columns (mean, sd, n).
"""
from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.benchmark.datadir import data_dir
from engine.benchmark.evaluation.intervals import NOTE as INTERVALS_NOTE
from engine.benchmark.evaluation.intervals import score_intervals
from engine.benchmark.evaluation.report import BASELINE_NOTES, SPENDING_HEAD, SPENDING_NOTE, spending_rows
from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.evaluation.runset import RunKey, RunSet, job_of
from engine.benchmark.evaluation.scores import BINS, LATEST_BINS, chronological_awareness, simple_recall
from engine.benchmark.evaluation.templates import RETRIEVAL_TYPES, cue_parts

# The published figures (leaderboard: long book, in-context) and which of
# the paper's F1-by-bin lists belongs to which published book.
PUBLISHED_BOOKS = {"synaptic-echoes": "long_book", "synaptic-echoes-short": "short_book"}
LEADERBOARD_BOOK = "synaptic-echoes"


@dataclass(frozen=True, slots=True)
class Stat:
    mean: float | None
    sd: float | None
    n: int

    def text(self) -> str:
        if self.mean is None:
            return "-"
        return f"{self.mean:.2f}±{self.sd:.2f}" if self.sd is not None else f"{self.mean:.2f}"


@dataclass(frozen=True, slots=True)
class Score:
    """A leaderboard score with its 95% interval: "0.718 [0.661, 0.768]"
    (None: not asked, "-"; nan: asked but undefined); CSV gives the value and
    the interval's two ends as columns of their own."""
    value: float | None
    ci: Sequence[float] | None = None

    def text(self) -> str:
        if self.value is None:
            return "-"
        if math.isnan(self.value):
            return "undefined"
        return f"{self.value:.3f}" + (f" [{self.ci[0]:.3f}, {self.ci[1]:.3f}]" if self.ci else "")


Cell = str | Stat | Score
NUMERIC = (Stat, Score)  # cells shown right-aligned, never wrapped


@dataclass(slots=True)
class Table:
    key: str                 # file stem: tables/<key>.md, tables/<key>.csv
    title: str
    head: list[str]
    rows: Sequence[Sequence[Cell]]
    note: str = ""
    # Columns that hold the configuration (the drill-down filters match on them).
    label_columns: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


# -- statistics of a set of records --------------------------------------------------

def f1_stat(records: Iterable[ResultRecord]) -> Stat:
    values = [float(r.f1) for r in records if r.f1 is not None]
    if not values:
        return Stat(None, None, 0)
    arr = np.asarray(values)
    sd = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
    return Stat(float(arr.mean()), sd, len(arr))


def _failures(records: Sequence[ResultRecord]) -> int:
    return sum(1 for r in records if r.judge_failed)


def _errors(records: Sequence[ResultRecord]) -> int:
    return sum(1 for r in records if r.answer_error)


def _notes(runset: RunSet, key: RunKey, records: Sequence[ResultRecord]) -> str:
    notes = []
    if key.model in BASELINE_NOTES:
        notes.append(BASELINE_NOTES[key.model])
    sample = runset.samples.get(key)
    if sample:
        total = runset.runs[(key.book, key.judge)].get("questions") or "?"
        notes.append(f"sample of {sample}/{total} questions")
    errors = _errors(records)
    if errors:
        notes.append(f"{errors} answer error(s)")
    return "; ".join(notes)


def cue_items(cue: str) -> int:
    """How many of (time, space, entity, content) the cue fixes: 1 to 4."""
    return sum(p != "*" for p in cue_parts(cue))


# -- the tables ------------------------------------------------------------------------

def _label_head(runset: RunSet) -> list[str]:
    books, judges = runset.varying()
    return ["Model", "Memory"] + (["Book"] if books else []) + (["Judge"] if judges else [])


def _label_cells(runset: RunSet, key: RunKey) -> list[Cell]:
    books, judges = runset.varying()
    cells: list[Cell] = [key.model, key.mode]
    return cells + ([key.book] if books else []) + ([key.judge] if judges else [])


def _bins_of(records: Iterable[ResultRecord], bins: Sequence[str] = BINS) -> list[str]:
    present = {r.bin for r in records}
    return [b for b in bins if b in present]


def _bin_head(records: Sequence[ResultRecord], bins: Sequence[str]) -> list[str]:
    """Bin columns with their question count, as the paper's header shows it."""
    heads = []
    for b in bins:
        per_config: dict[tuple[str, str, str], int] = {}
        for r in records:
            if r.bin == b:
                per_config[(r.model, r.mode, r.judge)] = per_config.get((r.model, r.mode, r.judge), 0) + 1
        heads.append(f"{b} ({max(per_config.values(), default=0)})")
    return heads


def _parts(recs: list[ResultRecord], dim: Callable[[ResultRecord], object] | None,
           dim_order: Sequence[object] | None) -> list[tuple[object, list[ResultRecord]]]:
    """(value of `dim`, its records) in order, values without records left out; no `dim`: (None, all)."""
    if not recs:
        return []
    if dim is None:
        return [(None, recs)]
    values = [v for v in (dim_order or sorted({dim(r) for r in recs}, key=str)) if any(dim(r) == v for r in recs)]
    return [(value, [r for r in recs if dim(r) == value]) for value in values]


def _breakdown(runset: RunSet, key: str, title: str, get: str, dim_name: str | None,
               dim: Callable[[ResultRecord], object] | None, dim_order: Sequence[object] | None, note: str) -> Table:
    """F1 mean±sd by bin for each configuration (and each value of `dim`)."""
    selected = {k: [r for r in recs if r.get == get] for k, recs in runset.groups.items()}
    everything = [r for recs in selected.values() for r in recs]
    bins = _bins_of(everything)
    head = _label_head(runset) + ([dim_name] if dim_name else []) + _bin_head(everything, bins) + \
        ["all bins", "scored", "judge failures", "notes"]
    rows = []
    for k, recs in selected.items():
        for value, part in _parts(recs, dim, dim_order):
            cells: list[Cell] = _label_cells(runset, k) + ([str(value)] if dim is not None else [])
            cells += [f1_stat(r for r in part if r.bin == b) if any(r.bin == b for r in part) else "" for b in bins]
            cells += [f1_stat(part), f"{sum(r.f1 is not None for r in part)}/{len(part)}",
                      str(_failures(part)), _notes(runset, k, part)]
            rows.append(cells)
    return Table(key=key, title=title, head=head, rows=rows, note=note,
                 label_columns=len(_label_head(runset)) + (1 if dim_name else 0))


_F1_NOTE = ("Lenient F1, mean±sd over the questions of each bin (bins: number of chapters matching the cue; "
            "question count in the header). Judge failures are left out of the means and counted.")


def f1_by_bin_tables(runset: RunSet) -> list[Table]:
    out = []
    for get in ("all", "latest", "chronological"):
        if any(r.get == get for r in runset.records):
            out.append(_breakdown(runset, f"f1_by_bin_{get}", f"F1 by number of matching events: '{get}' questions",
                                  get, None, None, None, _F1_NOTE))
    return out


def breakdown_tables(runset: RunSet) -> list[Table]:
    cues = sorted({r.cue for r in runset.records if r.cue}, key=lambda c: (cue_items(c), c))
    traces = [t for t in RETRIEVAL_TYPES if any(r.retrieval_type == t for r in runset.records)]
    note = "'all' questions only. " + _F1_NOTE
    tables = [
        _breakdown(runset, "f1_by_cue_bin", "F1 by cue type and bin", "all", "Cue", lambda r: r.cue, cues, note),
        _breakdown(runset, "f1_by_trace_bin", "F1 by retrieval type (trace) and bin", "all", "Trace",
                   lambda r: r.retrieval_type, traces, note),
        _breakdown(runset, "f1_by_cue_items_bin", "F1 by number of items in the cue and bin", "all",
                   "Cue items", lambda r: cue_items(r.cue) if r.cue is not None else 0, [1, 2, 3, 4], note),
        cue_trace_table(runset, cues, traces),
    ]
    return tables


def cue_trace_table(runset: RunSet, cues: Sequence[str], traces: Sequence[str]) -> Table:
    head = _label_head(runset) + ["Cue"] + list(traces) + ["judge failures", "notes"]
    rows = []
    for k, recs in runset.groups.items():
        recs = [r for r in recs if r.get == "all"]
        for cue in cues:
            part = [r for r in recs if r.cue == cue]
            if not part:
                continue
            cells: list[Cell] = _label_cells(runset, k) + [cue]
            for t in traces:
                sub = [r for r in part if r.retrieval_type == t]
                cells.append(f1_stat(sub) if sub else "")
            cells += [str(_failures(part)), _notes(runset, k, part)]
            rows.append(cells)
    return Table(key="f1_by_cue_trace", title="F1 by cue type and retrieval type (trace)", head=head, rows=rows,
                 note="'all' questions, all bins together; an empty cell: no question of that kind.",
                 label_columns=len(_label_head(runset)) + 1)


def latest_table(runset: RunSet) -> Table:
    head = _label_head(runset) + [f"{b}" for b in LATEST_BINS] + ["Latest", "exact matches", "judge failures",
                                                                   "notes"]
    rows = []
    for k, recs in runset.groups.items():
        part = [r for r in recs if r.get == "latest"]
        if not part:
            continue
        _, parts = chronological_awareness(recs)
        cells: list[Cell] = _label_cells(runset, k)
        cells += [f1_stat(r for r in part if r.bin == b) if any(r.bin == b for r in part) else "" for b in LATEST_BINS]
        exact = sum(1 for r in part if r.f1 is not None and r.f1 >= 1.0 - 1e-9)
        cells += [f"{parts.latest:.2f}", f"{exact}/{sum(r.f1 is not None for r in part)}", str(_failures(part)),
                  _notes(runset, k, part)]
        rows.append(cells)
    return Table(key="latest", title="Latest-state questions", head=head, rows=rows,
                 note="F1 of 'latest' questions per bin (bins 2, 3-5, 6+ count in the score); Latest: their "
                      "count-weighted mean; exact matches: answers with F1 = 1.")


def chronological_table(runset: RunSet) -> Table:
    head = _label_head(runset) + ["considered", "exact matches", "All (share)", "tau (exact matches)",
                                  "tau (all with >= 2 matched)", "Order", "judge failures", "notes"]
    rows = []
    for k, recs in runset.groups.items():
        part = [r for r in recs if r.get == "chronological"]
        if not part:
            continue
        _, parts = chronological_awareness(recs)
        considered = [r for r in part if len(r.correct_answer or []) >= 2 and r.exact_match is not None]
        taus = [float(r.tau) for r in considered if r.tau is not None]
        cells: list[Cell] = _label_cells(runset, k)
        cells += [str(parts.considered), str(parts.exact_matches), f"{parts.all:.2f}", f"{parts.tau:.2f}",
                  Stat(float(np.mean(taus)), float(np.std(taus, ddof=1)) if len(taus) > 1 else 0.0, len(taus))
                  if taus else "-", f"{parts.order:.2f}", str(_failures(part)), _notes(runset, k, part)]
        rows.append(cells)
    return Table(key="chronological", title="Chronological questions", head=head, rows=rows,
                 note="Over the chronological questions with two or more ground-truth items: exact matches "
                      "(every item found), Kendall's tau-b of the answer's order (mean over exact matches, as "
                      "the score uses it; and over every answer with two or more matched items). "
                      "Order = max(0, All x tau).")


def _load_published(name: str) -> dict[str, Any] | None:
    try:
        path = data_dir() / "published" / name
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return None


def leaderboard_table(runset: RunSet) -> Table:
    books, judges = runset.varying()
    head = ["#", "source"] + _label_head(runset) + ["Simple Recall", "Chronological Awareness", "scored",
                                                    "judge failures", "notes"]
    entries = []
    for k, recs in runset.groups.items():
        sr, _ = simple_recall(recs)
        any_chrono = any(r.get in ("latest", "chronological") for r in recs)
        ca = chronological_awareness(recs)[0] if any_chrono else None
        ci = score_intervals(recs)
        smoke = bool(job_of(runset.runs[(k.book, k.judge)], k).get("smoke"))
        notes = "; ".join(n for n in ("smoke check, not ranked" if smoke else "", _notes(runset, k, recs)) if n)
        entries.append((k.book, runset.samples.get(k) is not None, "this report", _label_cells(runset, k),
                        None if math.isnan(sr) else sr, ca, f"{sum(r.f1 is not None for r in recs)}/{len(recs)}",
                        str(_failures(recs)), notes, k.judge, smoke,
                        (ci.simple_recall, ci.chronological_awareness)))
    published_note = ""
    if LEADERBOARD_BOOK in {k.book for k in runset.groups}:
        board = _load_published("leaderboard.json")
        if board:
            published_note = f" Published rows: {board.get('source')}; judge {board.get('judge')}."
            for row in board.get("rows", []):
                cells = [row["model"], board.get("memory", "in-context")] + \
                    ([LEADERBOARD_BOOK] if books else []) + (["published"] if judges else [])
                entries.append((LEADERBOARD_BOOK, False, "published", cells, row.get("simple_recall"),
                                row.get("chronological_awareness"), "", "", "", str(board.get("judge")), False,
                                (None, None)))
    # By book and judge, each ranked on its own; samples last, smoke checks after them; then by Simple
    # Recall, Chronological Awareness.
    entries.sort(key=lambda e: (e[0], e[9], e[10], e[1], -(e[4] if e[4] is not None else -1), -_sortable(e[5])))
    rows = [[rank, e[2], *e[3], Score(e[4], e[11][0]), Score(e[5], e[11][1] if e[5] is not None else None),
             e[6], e[7], e[8]] for rank, e in zip(_ranks(entries), entries)]
    return Table(key="leaderboard", title="Leaderboard", head=head, rows=rows, label_columns=2 + len(_label_head(runset)),
                 note="Simple Recall: mean over bins of the mean F1 of 'all' questions. Chronological Awareness: "
                      f"mean of Latest and Order. {INTERVALS_NOTE}. Ranked within each book and judge (rows of "
                      "different books or judges are not comparable); sampled jobs are listed last, smoke checks "
                      "(a question or two, to show a model runs) after them, not ranked." + published_note)


def _ranks(entries: Sequence[tuple[object, ...]]) -> list[str]:
    """1, 2, ... within each (book, judge) of the sorted entries (e[0], e[9]): rows
    of different books or judges are not comparable; a row without a score, or
    a smoke check (e[10]), has no rank."""
    ranks, group, n = [], None, 0
    for e in entries:
        if (e[0], e[9]) != group:
            group, n = (e[0], e[9]), 0
        if e[4] is None or e[10]:
            ranks.append("-")
            continue
        n += 1
        ranks.append(str(n))
    return ranks


def _sortable(x: float | None) -> float:
    return 0.0 if x is None or math.isnan(x) else x


def published_f1_table(runset: RunSet) -> Table | None:
    lists = [PUBLISHED_BOOKS[b] for b in sorted({k.book for k in runset.groups}) if b in PUBLISHED_BOOKS]
    if not lists:
        return None
    data = _load_published("paper_f1_by_bin.json")
    if not data:
        return None
    rows = []
    for name in lists:
        for row in data.get(name, []):
            rows.append([row["model"], row["memory"], name.replace("_", " ")] +
                        [Stat(c["mean"], c["sd"], 0) if (c := row["bins"].get(b)) else "" for b in BINS])
    return Table(key="published_f1_by_bin", title="Published: F1 by number of matching events ('all' questions)",
                 head=["Model", "Memory", "Book"] + list(BINS), rows=rows, label_columns=3,
                 note=f"{data.get('source')}; the paper's figures, beside which to read the tables above.")


def execution_table(runset: RunSet) -> Table:
    """What each configuration's execution took (run.json): not scores, so
    it differs between two executions of the same run (shards, reruns)."""
    head = _label_head(runset) + ["questions", "calls", "cached", "answers from cache", "spent (USD)",
                                  "cost at prices (USD)", "wall (s)", "shards"]
    rows = []
    for k, recs in runset.groups.items():
        run = runset.runs[(k.book, k.judge)]
        job = job_of(run, k)
        cached = runset.cached_answers.get(k)
        rows.append(_label_cells(runset, k) + [
            str(len(recs)), str(job.get("calls", "-")), str(job.get("cache_hits", "-")),
            "-" if cached is None else str(len(cached)),
            "-" if "spent_usd" not in job else f"{job['spent_usd']:.4f}",
            f"{sum(r.cost + r.judge_cost for r in recs):.4f}",
            "-" if "wall_seconds" not in job else f"{job['wall_seconds']:.1f}",
            ", ".join(run.get("shards", [])) or "-"])
    return Table(key="execution", title="Execution: calls, cache, cost, time", head=head, rows=rows,
                 note="From run.json (merged over shards: calls, cached calls and spending added, the longest "
                      "wall time). Calls: the answers and judgments asked, cached ones among them (answered "
                      "without sending anything). Cost at prices: the answers' and judgments' cost at the "
                      "aliases' prices, cached or not. These figures belong to one execution, not to the scores.")


def spending_table(runset: RunSet) -> Table:
    """Cost and tokens by model and role (answer, judge, embed), summed over
    the run folders of each book and judge (run.json's `spending`)."""
    books, judges = runset.varying()
    head = (["book"] if books else []) + (["judge"] if judges else []) + SPENDING_HEAD
    rows: list[list[Cell]] = []
    for (book, judge), run in runset.runs.items():
        if isinstance(run.get("spending"), list):  # already merged over the run's folders (runset)
            label: list[Cell] = [*([book] if books else []), *([judge] if judges else [])]
            rows += [[*label, *cells] for cells in spending_rows(run["spending"])]
    return Table(key="cost", title="Cost by model and role", head=head, rows=rows, note=SPENDING_NOTE,
                 label_columns=2 + books + judges)


def build_tables(runset: RunSet) -> list[Table]:
    tables = [leaderboard_table(runset)] + f1_by_bin_tables(runset)
    published = published_f1_table(runset)
    if published is not None:
        tables.append(published)
    tables += breakdown_tables(runset)
    tables += [t for t in (latest_table(runset), chronological_table(runset)) if t.rows]
    tables.append(execution_table(runset))
    cost = spending_table(runset)
    if cost.rows:
        tables.append(cost)
    return tables


# -- rendering ---------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def visible_controls(text: str) -> str:
    """Control characters (NUL, ESC of ANSI sequences, ...) as their \\xNN text."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def cell_text(cell: Cell) -> str:
    return cell.text() if isinstance(cell, NUMERIC) else str(cell)


def md_cell(cell: Cell) -> str:
    """A cell safe inside a Markdown table row: pipes escaped, one line, no control characters."""
    text = visible_controls(cell_text(cell).replace("\\", "\\\\").replace("|", "\\|"))
    return re.sub(r"[\r\n\t]+", " ", text)


def to_markdown(table: Table) -> str:
    lines = [f"## {md_cell(table.title)}", ""]
    if table.note:
        lines += [table.note, ""]
    lines.append("| " + " | ".join(md_cell(h) for h in table.head) + " |")
    lines.append("|" + "|".join("---" for _ in table.head) + "|")
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    """CSV with each Stat column given as `<col> mean`, `<col> sd`, `<col> n`."""
    stat_cols = [i for i in range(len(table.head)) if any(isinstance(r[i], Stat) for r in table.rows)]
    score_cols = [i for i in range(len(table.head)) if any(isinstance(r[i], Score) for r in table.rows)]
    head = []
    for i, h in enumerate(table.head):
        if i in stat_cols:
            head += [f"{h} mean", f"{h} sd", f"{h} n"]
        elif i in score_cols:
            head += [h, f"{h} 95% CI low", f"{h} 95% CI high"]
        else:
            head.append(h)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(head)
    for row in table.rows:
        out: list[str | int] = []
        for i, cell in enumerate(row):
            if i in stat_cols:
                out += [_num(cell.mean), _num(cell.sd), cell.n] if isinstance(cell, Stat) else ["", "", ""]
            elif i in score_cols:
                out += _score_csv(cell)
            else:
                out.append(visible_controls(str(cell)))
        writer.writerow(out)
    return buf.getvalue()


def _score_csv(cell: Cell) -> list[str | int]:
    """A Score's value (as the table shows it: "-", "undefined", "0.718") and its interval's ends."""
    if not isinstance(cell, Score):
        return [cell_text(cell), "", ""]
    value = Score(cell.value).text()
    return [value, *([f"{cell.ci[0]:.3f}", f"{cell.ci[1]:.3f}"] if cell.ci and value[0].isdigit() else ["", ""])]


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.6g}"
