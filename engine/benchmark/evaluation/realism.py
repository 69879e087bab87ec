"""The paper's realism ablation (appendix "Comparative evaluation between
realistic and non-realistic events"): F1 of the questions on realistic
chapters against those on non-realistic ones.

`tulving book realism` rates each chapter 1 (impossible or absurd) to 5
(entirely ordinary) in realism.json. As in the paper, chapters fall in two
classes: R (realistic, moderately realistic: ratings 4 and 5) and N
(somewhat realistic, non-realistic, impossible: 1 to 3). A question on
chapters of one class only is "realistic" or "non-realistic"; one on chapters
of both is "mixed" and one on no chapter "empty" (both left out, as in the
paper). Per bin and class: the count and the mean±sd F1 of 'all' questions
(the paper's table), and over every bin a Mann-Whitney U test of the
difference: two-sided, and one-sided "non-realistic higher" (the paper's
finding on its long book).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict

import numpy as np

from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.evaluation.statistics import format_p, p_is
from providers.base import TulvingError

REALISM_FILE = "realism.json"
REALISTIC_FROM = 4   # ratings 4 and 5: class R
CLASSES = ("non-realistic", "realistic")
TABLE_BINS = ("1", "2", "3-5", "6+")


class RealismCell(TypedDict):
    count: int
    mean: float | None
    sd: float | None


class RealismSplit(TypedDict):
    """One configuration's split (scores.json's `realism`, per "model / mode")."""
    bins: dict[str, dict[str, RealismCell]]     # bin -> class -> cell
    n: dict[str, int]                           # class -> questions scored, every bin
    mean: dict[str, float | None]
    p_two_sided: float | None                   # Mann-Whitney U, N vs R
    p_non_realistic_higher: float | None        # one-sided, the paper's direction


def load_ratings(path: str | Path) -> dict[int, int]:
    """chapter -> realism rating (1-5) of a realism.json; unrated chapters left out."""
    try:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TulvingError(f"{path}: not a readable realism file ({exc})") from None
    if not isinstance(rows, list):
        raise TulvingError(f"{path}: not a realism file (expected the list `tulving book realism` writes)")
    return {int(r["chapter"]): int(r["realism"]) for r in rows
            if isinstance(r, dict) and isinstance(r.get("realism"), int) and "chapter" in r}


def find_ratings(explicit: str | Path | None, run: Mapping[str, object] | None) -> dict[int, int] | None:
    """The chapter ratings of `explicit` (--realism FILE), else of the
    realism.json in the run's book folder (run.json's `book_path`), else None."""
    if explicit is not None:
        return load_ratings(explicit)
    book_path = run.get("book_path") if run else None
    if isinstance(book_path, str) and (Path(book_path) / REALISM_FILE).is_file():
        return load_ratings(Path(book_path) / REALISM_FILE)
    return None


def question_class(chapters: Sequence[int], ratings: Mapping[int, int]) -> str | None:
    """"realistic", "non-realistic", or None (empty, mixed, or a chapter unrated)."""
    if not chapters or any(c not in ratings for c in chapters):
        return None
    classes = {"realistic" if ratings[c] >= REALISTIC_FROM else "non-realistic" for c in chapters}
    return classes.pop() if len(classes) == 1 else None


def _cell(values: list[float]) -> RealismCell:
    arr = np.asarray(values, dtype=float)
    return {"count": len(values), "mean": round(float(arr.mean()), 2) if len(arr) else None,
            "sd": round(float(arr.std(ddof=1)), 2) if len(arr) > 1 else (0.0 if len(arr) else None)}


def realism_split(records: Sequence[ResultRecord], ratings: Mapping[int, int], get: str = "all") -> RealismSplit:
    """The split of the `get` questions ('all' as the paper; "any": every kind)."""
    from scipy import stats  # here: scipy (~1.4 s, ~40 MB) is loaded only when a test is computed
    by_class: dict[str, list[float]] = {c: [] for c in CLASSES}
    by_bin: dict[str, dict[str, list[float]]] = {b: {c: [] for c in CLASSES} for b in TABLE_BINS}
    for r in records:
        cls = question_class(r.chapters, ratings)
        if (get != "any" and r.get != get) or r.f1 is None or cls is None or r.bin not in by_bin:
            continue
        by_class[cls].append(r.f1)
        by_bin[r.bin][cls].append(r.f1)
    n, r_ = by_class["non-realistic"], by_class["realistic"]
    testable = len(n) > 0 and len(r_) > 0
    return {"bins": {b: {c: _cell(v) for c, v in cells.items()} for b, cells in by_bin.items()
                     if any(cells.values())},
            "n": {c: len(v) for c, v in by_class.items()},
            "mean": {c: round(float(np.mean(v)), 3) if v else None for c, v in by_class.items()},
            "p_two_sided": float(stats.mannwhitneyu(n, r_, alternative="two-sided").pvalue) if testable else None,
            "p_non_realistic_higher": float(stats.mannwhitneyu(n, r_, alternative="greater").pvalue)
            if testable else None}


def _cells(splits: Mapping[str, RealismSplit], b: str, c: str) -> list[RealismCell | None]:
    return [splits[name]["bins"].get(b, {}).get(c) for name in splits]


def realism_rows(splits: Mapping[str, RealismSplit]) -> tuple[list[str], list[list[str]]]:
    """The paper's table (bin x class: count, mean±sd per configuration) as
    (head, rows). Configurations on different question sets (two books) give
    each cell its own count."""
    names = list(splits)
    counts = {tuple((cell or {"count": 0})["count"] for cell in _cells(splits, b, c))
              for b in TABLE_BINS for c in CLASSES}
    shared = all(len(set(row)) == 1 for row in counts)
    head = ["Bin", "Realism", *(["Count"] if shared else []), *names]
    rows = []
    for b in TABLE_BINS:
        for c in CLASSES:
            cells = _cells(splits, b, c)
            if not any(cell and cell["count"] for cell in cells):
                continue
            shown = [_mean_sd(cell, with_count=not shared) for cell in cells]
            rows.append([b, c, *([str((cells[0] or {"count": 0})["count"])] if shared else []), *shown])
    return head, rows


def realism_tests(splits: Mapping[str, RealismSplit]) -> list[str]:
    """One sentence per configuration: the class means and the Mann-Whitney U tests."""
    tests = []
    for name, s in splits.items():
        if s["p_two_sided"] is None:
            tests.append(f"{name}: not testable (a class without scored questions)")
            continue
        tests.append(f"{name}: non-realistic {s['mean']['non-realistic']:.3f} (n={s['n']['non-realistic']}) vs "
                     f"realistic {s['mean']['realistic']:.3f} (n={s['n']['realistic']}); Mann-Whitney U "
                     f"two-sided {p_is(s['p_two_sided'])}, one-sided 'non-realistic higher' "
                     f"{p_is(s['p_non_realistic_higher'] if s['p_non_realistic_higher'] is not None else 1.0)}")
    return tests


TEST_HEAD = ["Configuration", "non-realistic: n", "non-realistic: mean F1", "realistic: n", "realistic: mean F1",
             "Mann-Whitney U p (two-sided)", "p (one-sided, non-realistic higher)"]


def realism_test_rows(splits: Mapping[str, RealismSplit]) -> list[list[str]]:
    """The tests of `realism_tests` as table rows (TEST_HEAD); "-" where a class has no scored question."""
    def p(value: float | None) -> str:
        return "-" if value is None else format_p(value)

    def mean(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    return [[name, str(s["n"]["non-realistic"]), mean(s["mean"]["non-realistic"]), str(s["n"]["realistic"]),
             mean(s["mean"]["realistic"]), p(s["p_two_sided"]), p(s["p_non_realistic_higher"])]
            for name, s in splits.items()]


REALISM_TITLE = "Realistic vs non-realistic events (the paper's realism ablation)"


def realism_intro(get: str = "all") -> str:
    return ("Questions on chapters rated 4-5 only (realistic) or 1-3 only (non-realistic) in realism.json; "
            f"questions on both classes or on no chapter are left out. F1 of '{get}' questions, mean±sd.")


def realism_markdown(splits: Mapping[str, RealismSplit], get: str = "all") -> str:
    """The paper's table and the tests, as a Markdown section."""
    head, rows = realism_rows(splits)
    table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    tests = [f"- {line}" for line in realism_tests(splits)]
    return (f"## {REALISM_TITLE}\n\n{realism_intro(get)}\n\n"
            + "\n".join(table) + "\n\n" + "\n".join(tests))


def _mean_sd(cell: RealismCell | None, *, with_count: bool) -> str:
    if not cell or cell["mean"] is None:
        return "-"
    text = f"{cell['mean']:.2f}±{cell['sd'] or 0.0:.2f}"
    return f"{text} (n={cell['count']})" if with_count else text
