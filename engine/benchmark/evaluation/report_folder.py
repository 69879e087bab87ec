"""`tulving report RUN_DIR... --out DIR`: the report folder of a set of runs.

`write_report(run_dirs, out)` reads the runs (runset.py: shards merged, runs
side by side), and writes into `out`:
- index.html    the browsable, self-contained report (html_report.py);
- report.md     every table in Markdown, the rankings, links to the figures;
- tables/       each table as <key>.md and <key>.csv (tables.py);
- figures/      each figure as <name>.png and <name>.svg (figures.py);
- a judge agreement section when the runs hold a configuration under two
  judges (agreement.py);
- the realism ablation (realism.py) of each book whose chapters are rated
  (`realism`, the --realism FILE of a one-book report, else realism.json in
  the book folder a run recorded), as in the single-run report;
- scores.json   report.summarize over the merged records: for one book and
                judge the same content as an unsplit run's scores.json, else
                {"groups": [one summary per (book, judge)]}.

Figures need matplotlib (the `plots` extra); without it the report has the
tables and says which figures are missing.
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.benchmark.evaluation import figures as F
from engine.benchmark.evaluation.agreement import (
    agreement_figures,
    agreement_results,
    disagreement_table,
    summary_table,
)
from engine.benchmark.evaluation.html_report import CUE_NOTE, DrillRow, Section, render_html
from engine.benchmark.evaluation.memory_report import MEMORY_HEAD, budget_note, memory_table, memory_usd
from engine.benchmark.evaluation.realism import (
    REALISM_TITLE,
    TEST_HEAD,
    RealismSplit,
    find_ratings,
    realism_intro,
    realism_rows,
    realism_split,
    realism_test_rows,
)
from engine.benchmark.evaluation.report import RunRow, Scores
from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.evaluation.runset import RunKey, RunSet, load_runs
from engine.benchmark.evaluation.scores import BINS
from engine.benchmark.evaluation.statistics import BootstrapResult, average_ranks, format_p, paired_bootstrap
from engine.benchmark.evaluation.tables import (
    PUBLISHED_BOOKS,
    Table,
    _load_published,
    build_tables,
    f1_stat,
    to_csv,
    to_markdown,
)
from engine.benchmark.generation.published import load_book
from providers.base import TulvingError


@dataclass(frozen=True, slots=True)
class ReportFiles:
    out: Path
    tables: int
    figures: int
    questions: int        # the books' questions the runs answered
    results: int          # drill-down rows: one per configuration and question
    seconds: float
    notes: list[str]


def _status(r: ResultRecord) -> str:
    if r.answer_error:
        return "answer error"
    if r.judge_failed:
        return "judge failure"
    return "ok"


def _items(r: ResultRecord) -> str:
    scores = list(r.matching_scores or [])
    items = [str(i) for i in (r.identified_items or [])]
    text = "; ".join(items) if items else "(none)"
    if scores:
        text += "  [scores per ground-truth item: " + ", ".join(f"{float(s):g}" for s in scores) + "]"
    if r.judge_error:
        text += f"  [{r.judge_error}]"
    return text


def _evidence(r: ResultRecord) -> str:
    """The memory's evidence for the question: its chapters, how well they
    cover the ground truth, and (outside systems) the passages themselves."""
    if r.evidence_chapters is None:
        return "-"
    chapters = ", ".join("?" if c is None else str(c) for c in r.evidence_chapters) or "(none)"
    text = f"chapters {chapters}"
    if r.retrieval_recall is not None:
        text += f"; recall {r.retrieval_recall:.2f}"
    if r.evidence_cut:
        text += f"; {r.evidence_cut} passage(s) cut by the budget"
    for passage in r.evidence or []:
        where = "?" if passage.get("chapter") is None else passage["chapter"]
        text += f"\n[chapter {where}] {passage.get('text', '')}"
    return text


def drill_rows(runset: RunSet) -> list[DrillRow]:
    rows = []
    for key, records in runset.groups.items():
        cached = runset.cached_answers.get(key)
        for r in records:
            status = _status(r)
            from_cache = "?" if cached is None else ("yes" if r.q_idx in cached else "no")
            rows.append(DrillRow(
                data={"model": key.model, "mode": key.mode, "book": key.book, "judge": key.judge, "get": r.get,
                      "bin": r.bin, "cue": str(r.cue or ""), "trace": r.retrieval_type},
                status=status,
                cells=[key.model, key.mode, key.book, key.judge, r.q_idx, r.get, r.bin, r.cue or "",
                       r.retrieval_type, r.question, "; ".join(map(str, r.correct_answer or [])),
                       _evidence(r), r.answer if not r.answer_error else f"[{r.answer_error}]", _items(r),
                       "-" if r.f1 is None else f"{r.f1:.2f}", "-" if r.tau is None else f"{r.tau:.2f}",
                       f"{r.input_tokens:,}/{r.output_tokens:,}", f"{r.latency:.2f}", f"{r.cost + r.judge_cost:.4f}",
                       from_cache, status]))
    return rows


def _figures(runset: RunSet, summaries: Sequence[Scores], folder: Path, notes: list[str]
             ) -> dict[str, list[F.Figure]]:
    """Figures by section id; empty when matplotlib is missing (said in `notes`)."""
    try:
        F._plt()
    except ImportError:
        notes.append("figures left out: matplotlib is not installed (pip install 'tulving-bench[plots]')")
        return {}
    labels = {k: runset.label(k) for k in runset.groups}
    present = [b for b in BINS if any(r.bin == b and r.get == "all" for r in runset.records)]
    series = _f1_series(runset, labels, present)
    out: dict[str, list[F.Figure]] = {"recall": [], "breakdowns": [], "ranking": [], "book": []}
    if series:
        out["recall"].append(F.f1_by_bin(folder, series, present, title="F1 by number of matching events "
                                                                       "('all' questions)",
                                         published=_published_series(runset)))
    cues = sorted({r.cue for r in runset.records if r.cue and r.get == "all"},
                  key=lambda c: (sum(p != "*" for p in c.strip("()").split(",")), c))
    if cues and series:
        out["breakdowns"].append(F.cue_heatmaps(folder, _cue_cells(runset, labels, present, cues), cues,
                                                list(labels.values())))
    out["ranking"] = _ranking_figures(runset, summaries, folder)
    costs = [(f"{row['model']} / {row['mode']}", _usd_per_question(row, summary), row["simple_recall"])
             for summary in summaries for row in summary["runs"]
             if row.get("memory") and row["simple_recall"] is not None and row["questions"]]
    out["memory"] = [F.accuracy_against_cost(folder, costs)] if costs else []
    out["book"] = _book_figures(runset, folder, notes)
    return out


def _usd_per_question(row: RunRow, summary: Scores) -> float:
    system = (summary.get("memory") or {}).get(row["mode"])
    return (float(row["cost_usd"]) + memory_usd(system)) / max(1, row["questions"])


def _memory_table(summaries: Sequence[Scores]) -> Table | None:
    rows = [cells for summary in summaries for cells in memory_table(summary["runs"], summary.get("memory") or {})]
    if not rows:
        return None
    notes = [n for n in (budget_note(s["runs"]) for s in summaries) if n]
    return Table("memory_systems", "Memory systems: evidence, retrieval of the ground-truth chapters, cost and "
                 "latency of each phase", MEMORY_HEAD, rows, note=" ".join(notes), label_columns=2)


def _f1_series(runset: RunSet, labels: dict[RunKey, str], present: list[str]
               ) -> dict[str, dict[str, tuple[float, float]]]:
    """Run label -> bin -> (mean F1, sd) of the 'all' questions."""
    series = {}
    for k, recs in runset.groups.items():
        per_bin = {}
        for b in present:
            stat = f1_stat(r for r in recs if r.get == "all" and r.bin == b)
            if stat.mean is not None:
                per_bin[b] = (stat.mean, stat.sd or 0.0)
        if per_bin:
            series[labels[k]] = per_bin
    return series


def _cue_cells(runset: RunSet, labels: dict[RunKey, str], present: list[str], cues: list[str]
               ) -> dict[str, dict[tuple[str, str], float]]:
    """Bin -> (cue, run label) -> mean F1 of the 'all' questions."""
    cells: dict[str, dict[tuple[str, str], float]] = {}
    for b in present:
        cells[b] = {}
        for k, recs in runset.groups.items():
            for cue in cues:
                stat = f1_stat(r for r in recs if r.get == "all" and r.bin == b and r.cue == cue)
                if stat.mean is not None:
                    cells[b][(cue, labels[k])] = stat.mean
    return cells


def _ranking_figures(runset: RunSet, summaries: Sequence[Scores], folder: Path) -> list[F.Figure]:
    """The bootstrap forests, then the critical difference diagrams."""
    several = len(summaries) > 1
    out = []
    for i, (group, best, results) in enumerate(bootstrap_vs_best(runset)):
        out.append(F.bootstrap_forest(
            folder, [(n, r.mean_difference, r.ci_low, r.ci_high) for n, r in results], best,
            f"{group}; {BOOTSTRAP_RESAMPLES} paired resamples, seed {BOOTSTRAP_SEED}, 95% percentile CI",
            name=f"bootstrap_vs_best_{i + 1}" if several else "bootstrap_vs_best"))
    for i, summary in enumerate(summaries):
        ranking = summary.get("ranking")
        if ranking:
            out.append(F.cd_diagram(
                folder, ranking["average_ranks"], ranking["cliques"], ranking["n_questions"],
                name=f"cd_diagram_{i + 1}" if several else "cd_diagram",
                subtitle=f" ({summary.get('book')}, judge {summary.get('judge')})" if several else ""))
    return out


def _book_figures(runset: RunSet, folder: Path, notes: list[str]) -> list[F.Figure]:
    """Item positions and entity track of each book the runs answered."""
    books = sorted({k.book for k in runset.groups})
    out: list[F.Figure] = []
    for book_name in books:
        # A book folder recorded by the run (book_path), else a published book by name.
        where = next((r.get("book_path") for (b, _), r in runset.runs.items() if b == book_name and r.get("book_path")),
                     None)
        try:
            book = load_book(where or book_name, verify=False)
        except Exception as exc:  # a book that is not published or not found: no book figures
            notes.append(f"book figures left out for {book_name}: {exc}")
            continue
        pos, track = F.item_positions(folder, book), F.entity_track(folder, book)
        if len(books) > 1:  # several books: keep both books' files
            pos, track = (_renamed(folder, fig, f"_{book_name}") for fig in (pos, track))
        out += [pos, track]
    return out


def _renamed(folder: Path, fig: F.Figure, suffix: str) -> F.Figure:
    for ext in ("png", "svg"):
        (folder / f"{fig.name}.{ext}").rename(folder / f"{fig.name}{suffix}.{ext}")
    return F.Figure(fig.name + suffix, fig.title, fig.png)


def _published_series(runset: RunSet) -> dict[str, dict[str, float]] | None:
    """The paper's F1-by-bin rows ("model / memory" -> bin -> mean) when the
    runs are all on one published book."""
    books = {k.book for k in runset.groups}
    if len(books) != 1 or next(iter(books)) not in PUBLISHED_BOOKS:
        return None
    data = _load_published("paper_f1_by_bin.json") or {}
    rows = data.get(PUBLISHED_BOOKS[next(iter(books))], [])
    return {f"{r['model']} / {r['memory']}": {b: c["mean"] for b, c in r["bins"].items()} for r in rows} or None


BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def bootstrap_vs_best(runset: RunSet) -> list[tuple[str, str, list[tuple[str, BootstrapResult]]]]:
    """Per (book, judge) with two full runs or more: the paired bootstrap of
    each full run's F1 minus the best-ranked run's, on the questions all of
    them scored (as the ranking). [(group label, best run, [(run, result)])]."""
    out = []
    for (book, judge) in runset.runs:
        full = [k for k in runset.groups if (k.book, k.judge) == (book, judge) and runset.samples.get(k) is None]
        if len(full) < 2:
            continue
        f1 = {k: {r.q_idx: r.f1 for r in runset.groups[k] if r.f1 is not None} for k in full}
        common = sorted(set.intersection(*(set(v) for v in f1.values())))
        if len(common) < 2:
            continue
        names = {f"{k.model} / {k.mode}": k for k in full}
        ranks = average_ranks({n: [f1[k][q] for q in common] for n, k in names.items()})
        best = next(iter(ranks))
        results = [(n, paired_bootstrap([f1[names[best]][q] for q in common], [f1[names[n]][q] for q in common],
                                        n_resamples=BOOTSTRAP_RESAMPLES, seed=BOOTSTRAP_SEED))
                   for n in list(ranks)[1:]]
        out.append((f"{book}, judge {judge}", best, results))
    return out


def _bootstrap_table(boot: Sequence[tuple[str, str, list[tuple[str, BootstrapResult]]]]) -> Table | None:
    rows = [[group, best, name, str(r.n), f"{r.mean_difference:+.4f}", f"{r.ci_low:+.4f}", f"{r.ci_high:+.4f}",
             str(r.n_resamples), str(r.seed)] for group, best, results in boot for name, r in results]
    if not rows:
        return None
    return Table(key="bootstrap_vs_best", title="Paired bootstrap: each run minus the best-ranked run",
                 head=["Book, judge", "best-ranked run", "run", "questions", "mean F1 difference", "95% CI low",
                       "95% CI high", "resamples", "seed"], rows=rows, label_columns=3,
                 note="Percentile bootstrap over the questions every full run scored (pairs kept); a CI that "
                      "excludes 0: the run scores differently from the best-ranked one.")


def _ranking_table(summaries: Sequence[Scores]) -> Table | None:
    rows = []
    for s in summaries:
        for p in s["ranking"]["pairs"] if "ranking" in s else []:
            rows.append([str(s.get("book")), str(s.get("judge")), p["a"], p["b"], format_p(p["p"]),
                         format_p(p["p_holm"]), "yes" if p["significant"] else "no"])
    if not rows:
        return None
    return Table(key="pairwise_wilcoxon", title="Pairwise Wilcoxon signed-rank tests (Holm-adjusted)",
                 head=["Book", "Judge", "A", "B", "p", "p (Holm)", "significant (0.05)"], rows=rows, label_columns=4,
                 note="zero_method 'pratt', on the questions every full (not sampled) run scored.")


def _ranking_text(summaries: Sequence[Scores]) -> str:
    parts = []
    for s in summaries:
        if s.get("ranking"):
            parts.append(f"{s.get('book')}, judge {s.get('judge')}:\n{s['ranking']['text']}")
    return "\n\n".join(parts) or "Fewer than two full runs of the same book and judge: no ranking."


def realism_splits(runset: RunSet, realism: str | Path | None = None
                    ) -> dict[tuple[str, str], dict[str, RealismSplit]]:
    """(book, judge) -> run label -> its realism split, for the groups whose
    chapters are rated (`realism`, else the book folder's realism.json)."""
    if realism is not None and len({k.book for k in runset.groups}) > 1:
        raise TulvingError("--realism rates the chapters of one book, and these runs are on several: report "
                           "each book alone, or put realism.json in each book folder")
    out = {}
    for (book, judge), run in runset.runs.items():
        ratings = find_ratings(realism, run)
        if ratings is not None:
            out[(book, judge)] = {runset.label(k): realism_split(recs, ratings) for k, recs in runset.groups.items()
                                  if (k.book, k.judge) == (book, judge)}
    return out


def _realism_section(splits: dict[tuple[str, str], dict[str, RealismSplit]]) -> Section | None:
    """The paper's table per rated (book, judge), then the test of every configuration."""
    several = len(splits) > 1
    tables, tests = [], []
    for i, ((book, judge), group) in enumerate(splits.items()):
        head, rows = realism_rows(group)
        where = f" ({book}, judge {judge})" if several else ""
        tables.append(Table(key=f"realism_{i + 1}" if several else "realism", title=f"F1 by realism class{where}",
                            head=head, rows=rows, label_columns=2))
        tests += realism_test_rows(group)
    if not tables:
        return None
    tables.append(Table(key="realism_tests", title="Non-realistic vs realistic: Mann-Whitney U", head=TEST_HEAD,
                        rows=tests, note="Over every bin, on the questions of each class; one-sided: the "
                                         "paper's finding on its long book (non-realistic higher)."))
    return Section("realism", REALISM_TITLE, text=realism_intro(), tables=tables)


def write_report(run_dirs: Sequence[str | Path], out: str | Path, *, extra_sections: Sequence[Section] = (),
                 realism: str | Path | None = None, figures: bool = True) -> ReportFiles:
    """The report of the runs in `run_dirs`, written to `out`; without `figures`
    (--no-figures) matplotlib is not used and the report says so."""
    started = time.perf_counter()
    out = Path(out)
    runset = load_runs(run_dirs)
    notes: list[str] = []
    if runset.duplicates:
        notes.append(f"{runset.duplicates} (model, mode, question) results found in more than one folder: "
                     "the first folder's were kept")
    tables = build_tables(runset)
    summaries = runset.summaries()
    memory = _memory_table(summaries)
    if memory is not None:
        tables = tables + [memory]
    realism_split_of = realism_splits(runset, realism)
    for group, summary in zip(runset.runs, summaries, strict=True):
        if group in realism_split_of:
            summary["realism"] = realism_split_of[group]
    realism_section = _realism_section(realism_split_of)
    if realism_section is not None:
        extra_sections = [realism_section, *extra_sections]
        tables = tables + realism_section.tables
    ranking_tables = [t for t in (_ranking_table(summaries), _bootstrap_table(bootstrap_vs_best(runset)))
                      if t is not None]
    judged = agreement_results(runset)
    agreement_tables = [summary_table(judged), disagreement_table(judged)] if judged else []
    (out / "tables").mkdir(parents=True, exist_ok=True)
    drawn: dict[str, list[F.Figure]] = {}
    if figures:
        drawn = _figures(runset, summaries, out / "figures", notes)
    else:
        notes.append("figures left out: --no-figures")
    if judged and drawn:
        drawn["agreement"] = agreement_figures(judged, out / "figures")
    all_tables = tables + ranking_tables + agreement_tables
    for t in all_tables:
        (out / "tables" / f"{t.key}.md").write_text(to_markdown(t))
        (out / "tables" / f"{t.key}.csv").write_text(to_csv(t))
    scores = summaries[0] if len(summaries) == 1 else {"groups": summaries}
    (out / "scores.json").write_text(json.dumps(scores, indent=1) + "\n")
    sections = _sections(tables, ranking_tables, agreement_tables, drawn, _ranking_text(summaries),
                         extra_sections)
    drill = drill_rows(runset)
    folders = ", ".join(str(f) for f in runset.folders)
    questions = len({(k.book, r.q_idx) for k, recs in runset.groups.items() for r in recs})
    intro = (f"Runs: {folders}. {len(runset.groups)} configurations over {questions} questions: {len(drill)} "
             f"results (one per configuration and question). " + " ".join(notes))
    title = "Episodic Memory Benchmark report"
    (out / "index.html").write_text(render_html(title, intro, sections, drill), encoding="utf-8")
    (out / "report.md").write_text(_markdown(title, intro, sections))
    n_figures = sum(len(v) for v in drawn.values()) + sum(len(s.figures) for s in extra_sections)
    return ReportFiles(out=out, tables=len(all_tables), figures=n_figures, questions=questions, results=len(drill),
                       seconds=time.perf_counter() - started, notes=notes)


def _sections(tables: list[Table], ranking_tables: list[Table], agreement_tables: list[Table],
              figures: dict[str, list[F.Figure]], ranking_text: str, extra_sections: Sequence[Section]
              ) -> list[Section]:
    """The report's sections, in order: each picks its tables and figures."""
    by_key = {t.key: t for t in tables}

    def pick(*keys: str) -> list[Table]:
        return [by_key[k] for k in keys if k in by_key]

    sections = [
        Section("leaderboard", "Leaderboard", tables=pick("leaderboard", "execution", "cost")),
        Section("recall", "F1 by number of matching events",
                tables=pick("f1_by_bin_all", "f1_by_bin_latest", "f1_by_bin_chronological", "published_f1_by_bin"),
                figures=figures.get("recall", [])),
        Section("breakdowns", "By cue, retrieval type and cue size", text=CUE_NOTE,
                tables=pick("f1_by_cue_bin", "f1_by_trace_bin", "f1_by_cue_items_bin", "f1_by_cue_trace"),
                figures=figures.get("breakdowns", [])),
        Section("chronology", "Latest state and chronological order", tables=pick("latest", "chronological")),
        Section("memory", "Memory systems", text="Each memory system read the book once and gave every answering "
                "model the same evidence per question, within the run's evidence budget. Chapter recall and "
                "precision: the ground-truth chapters against the chapters the evidence came from.",
                tables=pick("memory_systems"), figures=figures.get("memory", [])),
        Section("ranking", "Overall comparison (critical difference)", pre=ranking_text,
                tables=ranking_tables, figures=figures.get("ranking", [])),
        *extra_sections,
    ]
    if agreement_tables:
        sections.append(Section("agreement", "Judge agreement", text="The same answers judged by two judges.",
                                tables=agreement_tables, figures=figures.get("agreement", [])))
    if figures.get("book"):
        sections.append(Section("book", "The book", text="Where the items of each chapter appear, and the "
                                "track of the entity that appears in most chapters.", figures=figures["book"]))
    return sections


def _markdown(title: str, intro: str, sections: list[Section]) -> str:
    """report.md: every section's text, tables and links to its figures."""
    md = [f"# {title}\n\n{intro}\n"]
    for s in sections:
        md.append(f"# {s.title}\n")
        if s.text:
            md.append(s.text + "\n")
        if s.pre:
            md.append("```\n" + s.pre + "\n```\n")
        md += [to_markdown(t) for t in s.tables]
        md += [f"![{f.title}](figures/{f.name}.png)\n" for f in s.figures]
    return "\n".join(md)
