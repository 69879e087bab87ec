"""Scores of the benchmark, as pure functions (protocol.md, "Judging and scores").

Per question:
- `lenient_f1(identified, ground_truth, scores)`: the paper's lenient F1.
- `chrono_match(indices, n_ground_truth)`: from the chronological judge's
  indices to the kept indices, Kendall's tau-b and exact match. The
  chronological judge sees the *distinct* ground-truth items (`distinct`):
  `n_ground_truth` is their number.

Per run (rows = one per question):
- `simple_recall(rows)`: the Simple Recall Score and its per-bin means.
- `chronological_awareness(rows)`: the Chronological Awareness Score and its parts.
- `agreement(a, b)`: how far two judges' F1 agree (built-in vs LLM judge).

A row is a mapping or an object with these fields (results.jsonl lines and
`ResultRecord` both fit):
    get            "all" | "latest" | "chronological"
    bin            "0" | "1" | "2" | "3-5" | "6+"
    f1             float at full precision, or None when the judgment failed (left out)
    correct_answer list of ground-truth items (chronological rows: the number
                   of distinct items decides whether the question is considered)
    tau            float or None (chronological rows)
    exact_match    bool, or None when the chronological judgment failed (left out)
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

_H = TypeVar("_H", bound=Hashable)

BINS = ("0", "1", "2", "3-5", "6+")
LATEST_BINS = ("2", "3-5", "6+")


def _round_like_pandas(x: float, decimals: int) -> float:
    """The published tables rounded their final scores with pandas (numpy:
    scale, then round half to even), which differs from Python's `round` on
    halves such as 0.9075 (numpy 0.908, Python 0.907)."""
    return float(np.round(x, decimals))


# -- one question ------------------------------------------------------------------------
def lenient_f1(identified: Sequence[str], ground_truth: Sequence[str], scores: Sequence[float]) -> float:
    """Lenient F1 of one judged answer.

    Ground truth and identified items are de-duplicated (first occurrence of a
    repeated ground-truth item keeps its score); S = sum of the scores;
    #pred = min(#identified, #gt) if #gt > 0 else #identified; P = S/#pred,
    R = S/#gt. F1 = 2PR/(P+R); 0 if P = R = 0; 1 if both are undefined (no
    ground truth and nothing identified); 0 if only one is undefined.
    """
    if len(scores) != len(ground_truth):
        raise ValueError(f"{len(scores)} scores for {len(ground_truth)} ground-truth items")
    first: dict[str, float] = {}
    for item, score in zip(ground_truth, scores):
        first.setdefault(item, float(score))
    n_gt = len(first)
    n_identified = len(dict.fromkeys(identified))
    total = sum(first.values())
    n_pred = min(n_identified, n_gt) if n_gt > 0 else n_identified
    precision = total / n_pred if n_pred > 0 else None
    recall = total / n_gt if n_gt > 0 else None
    if precision is None and recall is None:
        return 1.0
    if precision is None or recall is None:
        return 0.0
    if precision == 0 and recall == 0:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def kendall_tau(kept: Sequence[int]) -> float | None:
    """Kendall's tau-b (scipy's default) between the order in which the
    answer gives the matched ground-truth indices and their true order;
    None with fewer than 2 indices."""
    # Computed here as scipy.stats.kendalltau does it, to the last bit (the
    # answer order has no ties; `kept` may): scipy.stats costs ~40 MB of
    # memory to import, during the run, for this one number.
    n = len(kept)
    if n < 2:
        return None
    discordant = ties = 0
    for i, a in enumerate(kept):
        for b in kept[i + 1:]:
            if a > b:
                discordant += 1
            elif a == b:
                ties += 1
    pairs = n * (n - 1) // 2
    if ties == pairs:
        return None  # every index the same: undefined (scipy's NaN)
    tau = (pairs - ties - 2 * discordant) / math.sqrt(pairs) / math.sqrt(pairs - ties)
    return min(1.0, max(-1.0, tau))


@dataclass(frozen=True, slots=True)
class ChronoMatch:
    kept: list[int]          # matched ground-truth indices, answer order, -1 and repeats dropped
    tau: float | None        # Kendall tau-b over `kept` (None with fewer than 2)
    exact_match: bool        # every ground-truth index was found
    considered: bool         # at least 2 (distinct) ground-truth items: an order to judge


def chrono_match(indices: Sequence[int], n_ground_truth: int) -> ChronoMatch:
    """From the chronological judge's index per identified item."""
    seen: set[int] = set()
    kept = []
    for i in indices:
        if 0 <= i < n_ground_truth and i not in seen:
            seen.add(i)
            kept.append(i)
    return ChronoMatch(kept=kept, tau=kendall_tau(kept), exact_match=len(seen) == n_ground_truth,
                       considered=n_ground_truth >= 2)


# -- a run -----------------------------------------------------------------------------------
def _get(row: object, name: str, default: object = None) -> Any:
    if isinstance(row, Mapping):
        return row.get(name, default)
    return getattr(row, name, default)


def bin_mean(values: Sequence[float]) -> float:
    """One bin's mean F1 as the published tables hold it: pandas' group mean
    (a compensated sum; `math.fsum` gives the same float) printed with
    `'%.2f'` and read back. Per-question F1 must come at full precision: an
    exact mean of x.xx5 may round either way, exactly as the reference's did,
    and F1 rounded beforehand can move it across."""
    return float("%.2f" % (math.fsum(values) / len(values)))


def _bin_means(rows: Iterable[object], get: str, bins: Sequence[str]) -> dict[str, tuple[float, int]]:
    """Per bin: (mean F1 as `bin_mean` gives it, number of questions)."""
    values: dict[str, list[float]] = {b: [] for b in bins}
    for row in rows:
        f1 = _get(row, "f1")
        if _get(row, "get") == get and _get(row, "bin") in values and f1 is not None:
            values[_get(row, "bin")].append(float(f1))
    return {b: (bin_mean(v), len(v)) for b, v in values.items() if v}


def simple_recall(rows: Iterable[object]) -> tuple[float, dict[str, float]]:
    """Simple Recall Score: the mean F1 of 'all' questions per bin (`bin_mean`:
    2 decimals), then the mean of those bin means rounded to 3 decimals (bins
    without questions are left out: 4 bins on the short book; the final
    rounding is pandas', see `_round_like_pandas`).
    Returns (score, {bin: rounded mean}); score is nan without any row."""
    means = _bin_means(rows, "all", BINS)
    bin_means = {b: m for b, (m, _) in means.items()}
    if not bin_means:
        return float("nan"), {}
    return _round_like_pandas(float(np.mean(list(bin_means.values()))), 3), bin_means


def distinct(items: Iterable[_H]) -> list[_H]:
    """Items without repeats, first occurrence kept, order kept (the
    reference's default `remove_duplicates` policy)."""
    return list(dict.fromkeys(items))


def is_considered(ground_truth: Sequence[str]) -> bool:
    """A chronological question has an order to judge: two or more distinct
    ground-truth items (a repeated item counts once)."""
    return len(distinct(ground_truth)) >= 2


UNDEFINED = float("nan")


@dataclass(frozen=True, slots=True)
class ChronoParts:
    latest: float                 # count-weighted mean of the latest bin means (bins 2, 3-5, 6+), kept
                                  # as the reference keeps it (a percentage with 2 decimals: 4 decimals);
                                  # nan (undefined) when no 'latest' question falls in bins 2+
    latest_bins: dict[str, float]
    latest_counts: dict[str, int]
    considered: int               # chronological questions with >= 2 distinct ground-truth items (judged)
    exact_matches: int
    all: float                    # exact_matches / considered, 4 decimals (nan when none is considered)
    tau: float                    # mean tau over exact matches, 2 decimals (0 if none; nan when none considered)
    order: float                  # max(0, all * tau) (nan when no question is considered)


def _percent_2(numerator: float, denominator: float) -> float:
    """A share as the reference's tables hold it: `round(x * 100, 2)` written
    with '%' and read back (unchanged) divided by 100. The operations are the
    reference's, in its order: a last-bit difference can move a tie."""
    return round(numerator / denominator * 100, 2) / 100


def _latest_score(means: Mapping[str, tuple[float, int]]) -> float:
    """Latest: the count-weighted mean of the per-bin means (nan without a question)."""
    counted = sum(n for _, n in means.values())
    if not counted:
        return UNDEFINED
    weighted = 0.0
    for m, n in means.values():
        weighted += m * n
    # reference: round(100*(mean*count).sum()/count.sum(), 2), as '%', read back / 100
    return round(100 * weighted / counted, 2) / 100


def _order_score(considered: list[object], exact: list[object]) -> tuple[float, float, float]:
    """(All, tau, Order) of the considered chronological questions (all nan without one)."""
    if not considered:
        return UNDEFINED, UNDEFINED, UNDEFINED
    share = _percent_2(len(exact), len(considered))
    taus = [float(_get(r, "tau")) for r in exact if _get(r, "tau") is not None]
    tau = round(float(np.mean(taus)), 2) if taus else 0.0
    order = 0.0 if share == 0 or tau == 0 else max(0.0, share * tau)
    return share, tau, order


def chronological_awareness(rows: Iterable[object]) -> tuple[float, ChronoParts]:
    """Chronological Awareness Score (protocol.md, Judging and scores): the
    mean of (a) Latest, the count-weighted mean of the per-bin mean F1 of
    'latest' questions over bins 2, 3-5, 6+ (4 decimals), and (b) Order =
    max(0, All x tau), with All the share of exact matches among the
    considered chronological questions (4 decimals) and tau the mean Kendall
    tau over the exact matches (2 decimals; 0 if none); the result rounded
    to 3 decimals.

    Undefined parts are nan, never 0: without a 'latest' question in bins 2+
    the score is Order alone (the reference's NaN-skipping mean); without a
    considered chronological question Order is undefined, and so is the score
    (the reference has no figure for it: it divides by zero)."""
    rows = list(rows)
    means = _bin_means(rows, "latest", LATEST_BINS)
    latest = _latest_score(means)
    considered = [r for r in rows if _get(r, "get") == "chronological"
                  and is_considered(_get(r, "correct_answer") or []) and _get(r, "exact_match") is not None]
    exact = [r for r in considered if _get(r, "exact_match")]
    share, tau, order = _order_score(considered, exact)
    parts = ChronoParts(latest=latest, latest_bins={b: m for b, (m, _) in means.items()},
                        latest_counts={b: n for b, (_, n) in means.items()}, considered=len(considered),
                        exact_matches=len(exact), all=share, tau=tau, order=order)
    if math.isnan(order):
        return UNDEFINED, parts
    if math.isnan(latest):
        return _round_like_pandas(order, 3), parts
    return _round_like_pandas((latest + order) / 2, 3), parts


# -- judge agreement ---------------------------------------------------------------------------
def _f1(value: object) -> float | None:
    if value is None or isinstance(value, (int, float)):
        return None if value is None else float(value)
    f1 = _get(value, "f1")  # a row
    return None if f1 is None else float(f1)


# One judge's verdicts: F1 values by position (None: no verdict), question -> F1, or rows with q_idx and f1.
Verdicts = Sequence[object] | Mapping[Hashable, object]


def _f1_by_key(verdicts: Verdicts) -> dict[Hashable, float | None]:
    if isinstance(verdicts, Mapping):
        return {k: _f1(v) for k, v in verdicts.items()}
    out: dict[Hashable, float | None] = {}
    for i, v in enumerate(verdicts):
        key = i if v is None or isinstance(v, (int, float)) else _get(v, "q_idx", i)  # rows: by question
        out[key] = _f1(v)
    return out


def agreement(verdicts_a: Verdicts, verdicts_b: Verdicts) -> dict[str, float | int | None]:
    """How two judges' per-question F1 agree. Each side is a sequence of F1
    values (None: no verdict), a mapping question -> F1, or rows with q_idx
    and f1. Questions judged by both are compared: count, mean absolute
    difference, share of identical F1 (within 1e-9), share within 0.25,
    Pearson and Spearman correlations (None when undefined), both means."""
    a, b = _f1_by_key(verdicts_a), _f1_by_key(verdicts_b)
    keys = [k for k in a if k in b and a[k] is not None and b[k] is not None]
    x = np.array([a[k] for k in keys], dtype=float)
    y = np.array([b[k] for k in keys], dtype=float)
    out: dict[str, float | int | None] = {"n": len(keys), "mean_abs_diff": None, "identical": None, "within_0.25": None,
                           "pearson": None, "spearman": None, "mean_a": None, "mean_b": None}
    if not keys:
        return out
    diff = np.abs(x - y)
    out.update(mean_abs_diff=float(diff.mean()), identical=float((diff < 1e-9).mean()),
               **{"within_0.25": float((diff <= 0.25 + 1e-12).mean())},
               mean_a=float(x.mean()), mean_b=float(y.mean()))
    if len(keys) >= 2 and x.std() > 0 and y.std() > 0:
        from scipy import stats  # here: a second's import and ~40 MB that a run itself does not need

        out["pearson"] = float(stats.pearsonr(x, y).statistic)
        out["spearman"] = float(stats.spearmanr(x, y).statistic)
    return out
