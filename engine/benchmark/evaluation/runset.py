"""Run folders read together: one run, many runs, or the shards of one run.

`load_runs(paths)` reads each folder's `results.jsonl` and `run.json` and
groups the records by configuration: (book, judge, model, mode), the mode
labelled with what else tells two folders' runs apart (embedding model,
params: "rag-paragraph [embed local:minilm]"). Folders of
the same book and judge are merged: the shards of one evaluation
(`tulving run --shard i/n`) become the run they split, and different runs
of the same book side by side become one multi-model run. A (model, mode,
question) found in two folders of the same configuration is kept once and
counted in `duplicates` when the folders agree on it; when they disagree
(answer or F1), loading stops with one line.

`RunSet.summaries()` gives per (book, judge) the content of `scores.json`
(report.summarize over the merged records and the merged run.json), so the
scores of three shards equal those of the unsplit run; only the execution
figures differ (wall_seconds, and calls/cache hits when the caches differed).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.benchmark.evaluation.memory_report import MemoryEntry, merge_memory_entries
from engine.benchmark.evaluation.report import Scores, summarize
from engine.benchmark.evaluation.results import RESULTS_FILE, ResultRecord, load_results
from engine.spending import merge_rows
from providers.base import TulvingError

_SUMMED = ("questions", "calls", "cache_hits")


@dataclass(frozen=True, slots=True, order=True)
class RunKey:
    """One configuration of the report: a model in a memory mode on a book, judged by a judge."""

    book: str
    judge: str
    model: str
    mode: str


@dataclass(slots=True)
class RunSet:
    folders: list[Path]
    groups: dict[RunKey, list[ResultRecord]]          # records of each configuration, by q_idx
    runs: dict[tuple[str, str], dict[str, Any]]       # (book, judge) -> merged run.json
    samples: dict[RunKey, int | None] = field(default_factory=dict)
    duplicates: int = 0
    # q_idx whose answer this execution took from the cache (None: not recorded)
    cached_answers: dict[RunKey, set[int] | None] = field(default_factory=dict)

    @property
    def keys(self) -> list[RunKey]:
        return list(self.groups)

    @property
    def records(self) -> list[ResultRecord]:
        return [r for recs in self.groups.values() for r in recs]

    def varying(self) -> tuple[bool, bool]:
        """(several books?, several judges?): whether labels must name them."""
        return len({k.book for k in self.groups}) > 1, len({k.judge for k in self.groups}) > 1

    def label(self, key: RunKey) -> str:
        """"model / mode", plus the book and the judge when the set holds several."""
        books, judges = self.varying()
        parts = [key.model, key.mode] + ([key.book] if books else []) + ([f"judge {key.judge}"] if judges else [])
        return " / ".join(parts)

    def summaries(self) -> list[Scores]:
        """scores.json content per (book, judge), in key order."""
        out = []
        for (book, judge), run in self.runs.items():
            recs = [r for k, v in self.groups.items() if (k.book, k.judge) == (book, judge) for r in v]
            out.append(summarize(recs, run))
        return out


def _read_run_json(folder: Path) -> dict[str, Any] | None:
    path = folder / "run.json"
    if not path.is_file():
        return None
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except json.JSONDecodeError as exc:
        raise TulvingError(f"{path}: not JSON ({exc})") from None


# run.json keys of one execution, not carried into a merged record as they are.
_PER_EXECUTION = ("jobs", "shard", "engine", "retrieval", "spending", "provenance", "configuration", "invocations",
                  "spending_this_invocation", "repeats", "memory")


def _merge_provenance(merged: dict[str, Any], runs: Sequence[Mapping[str, Any]]) -> None:
    """Each execution's own provenance (who ran what, when, with which versions)."""
    provenances = [r["provenance"] for r in runs if isinstance(r.get("provenance"), dict)]
    if provenances:
        merged["provenance"] = provenances[0] if len(runs) == 1 else {"runs": provenances}


def _merged_memory(runs: Sequence[Mapping[str, object]]) -> dict[str, MemoryEntry]:
    """Each memory system's entry over the runs (each execution prepared it)."""
    systems: dict[str, list[MemoryEntry]] = {}
    for run in runs:
        entries = run.get("memory")
        for name, entry in (entries if isinstance(entries, dict) else {}).items():
            systems.setdefault(name, []).append(entry)
    return {name: merge_memory_entries(entries) for name, entries in systems.items()}


def merge_run_records(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One run.json from several of the same book and judge (shards, or runs
    of different models): jobs of the same (model, mode) add their questions,
    calls, cache hits and spending; wall times are the longest (shards run
    side by side)."""
    first = runs[0]
    merged: dict[str, Any] = {k: v for k, v in first.items() if k not in _PER_EXECUTION}
    _merge_provenance(merged, runs)
    jobs: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs:
        for job in run.get("jobs", []):
            key = (job["model"], job["mode"])
            if key not in jobs:
                jobs[key] = dict(job)
                continue
            acc = jobs[key]
            for name in _SUMMED:
                if name in job:
                    acc[name] = acc.get(name, 0) + job[name]
            if "spent_usd" in job:
                acc["spent_usd"] = round(acc.get("spent_usd", 0.0) + job["spent_usd"], 6)
            if "wall_seconds" in job:
                acc["wall_seconds"] = max(acc.get("wall_seconds", 0.0), job["wall_seconds"])
            if "cached_answers" in job:
                acc["cached_answers"] = sorted(set(acc.get("cached_answers", [])) | set(job["cached_answers"]))
    merged["jobs"] = list(jobs.values())
    spending = [r["spending"] for r in runs if isinstance(r.get("spending"), list)]
    if spending:
        merged["spending"] = merge_rows(spending)
    merged["wall_seconds"] = max((r.get("wall_seconds", 0.0) for r in runs), default=0.0)
    memory = _merged_memory(runs)
    if memory:
        merged["memory"] = memory
    shards = [r["shard"] for r in runs if r.get("shard")]
    if shards:
        merged["shards"] = shards
    return merged


def _add_records(groups: dict[RunKey, dict[int, ResultRecord]], records: Iterable[ResultRecord], book: str,
                 folder: Path) -> int:
    """File a folder's records by configuration; a question already filed is
    kept when both folders agree on it (return how many were), refused when
    they disagree: those are not the same configuration's results."""
    duplicates = 0
    for r in records:
        key = RunKey(book=book, judge=r.judge, model=r.model, mode=r.mode)
        bucket = groups.setdefault(key, {})
        if r.q_idx in bucket:
            kept = bucket[r.q_idx]
            if (kept.answer, kept.f1) != (r.answer, r.f1):
                raise TulvingError(f"{folder}: {r.model} / {r.mode} question {r.q_idx} disagrees with the same "
                                   f"configuration's result in an earlier folder (answer or F1 differ): report "
                                   f"them apart, or record what distinguishes them (--embed-model, --temperature)")
            duplicates += 1
            continue
        bucket[r.q_idx] = r
    return duplicates


Loaded = tuple[Path, list[ResultRecord], "dict[str, Any] | None"]  # a folder, its records, its run.json


# What distinguishes two runs of the same (book, judge, model, mode) besides shards and samples.
def _variant(run: Mapping[str, object] | None, model: str, mode: str) -> dict[str, object]:
    run = run or {}
    raw = run.get("configuration")
    conf: Mapping[str, object] = raw if isinstance(raw, dict) else {}
    variant: dict[str, object] = {}
    if mode.startswith("rag") and run.get("embed_model"):
        variant["embed"] = run["embed_model"]
    every = conf.get("resolved")
    resolved = every.get(model) if isinstance(every, dict) else None
    if isinstance(resolved, dict):
        variant["model id"] = resolved.get("model")
        variant.update({k: v for k, v in (resolved.get("params") or {}).items()})
    return variant


def _relabel(loaded: list[Loaded]) -> list[Loaded]:
    """Folders holding the same (model, mode) with different settings (an
    embedding model, params...) get those settings in their mode's label, so
    the report keeps them apart instead of dropping one."""
    seen: dict[tuple[str, str, str], list[dict[str, object]]] = {}
    for _, records, run in loaded:
        for model, mode in {(r.model, r.mode) for r in records}:
            seen.setdefault((r_book(run), model, mode), []).append(_variant(run, model, mode))
    out = []
    for folder, records, run in loaded:
        renamed: dict[tuple[str, str], str] = {}
        for model, mode in {(r.model, r.mode) for r in records}:
            variants = seen[(r_book(run), model, mode)]
            mine = _variant(run, model, mode)
            differ = sorted({k for v in variants for k in set(v) | set(mine) if v.get(k) != mine.get(k)})
            if differ:
                renamed[(model, mode)] = f"{mode} [{', '.join(f'{k} {mine.get(k)}' for k in differ)}]"
        if renamed:
            records = [dataclasses.replace(r, mode=renamed.get((r.model, r.mode), r.mode)) for r in records]
            if run is not None:
                run = {**run, "jobs": [{**j, "mode": renamed.get((j["model"], j["mode"]), j["mode"])}
                                       for j in run.get("jobs", [])]}
        out.append((folder, records, run))
    return out


def r_book(run: Mapping[str, object] | None) -> str:
    return str((run or {}).get("book") or "")


def job_of(run: Mapping[str, Any], key: RunKey) -> dict[str, Any]:
    """The run.json job of a configuration ({} when the run does not list it)."""
    return next((j for j in run.get("jobs", []) if (j["model"], j["mode"]) == (key.model, key.mode)), {})


def load_runs(paths: Iterable[str | Path]) -> RunSet:
    """Read run folders (each holding results.jsonl, and usually run.json)."""
    folders = [Path(p) for p in paths]
    if not folders:
        raise TulvingError("no run folder given")
    per_group_runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    groups: dict[RunKey, dict[int, ResultRecord]] = {}
    duplicates = 0
    loaded = []
    for folder in folders:
        if not (folder / RESULTS_FILE).is_file():
            raise TulvingError(f"{folder}: no {RESULTS_FILE} (not a run folder)")
        loaded.append((folder, load_results(folder), _read_run_json(folder)))
    for folder, records, run in _relabel(loaded):
        book = str((run or {}).get("book") or folder.name)
        judges = sorted({r.judge for r in records}) or [str((run or {}).get("judge") or "")]
        for judge in judges:
            per_group_runs.setdefault((book, judge), []).append(
                run if run is not None else {"book": book, "judge": judge, "jobs": []})
        duplicates += _add_records(groups, records, book, folder)
    runs = {}
    for (book, judge), found in sorted(per_group_runs.items()):
        merged = merge_run_records(found)
        merged["judge"] = judge
        runs[(book, judge)] = merged
    ordered = {k: [v[q] for q in sorted(v)] for k, v in sorted(groups.items())}
    samples, cached = {}, {}
    for key in ordered:
        job = job_of(runs[(key.book, key.judge)], key)
        samples[key] = job.get("sample")
        cached[key] = set(job["cached_answers"]) if "cached_answers" in job else None
    return RunSet(folders=folders, groups=ordered, runs=runs, samples=samples, duplicates=duplicates,
                  cached_answers=cached)
