"""The paper's statistics over per-question F1 scores.

- Average ranks and the critical-difference grouping behind the paper's CD
  plots: on every question the (model, mode) runs are ranked by F1 (rank 1 =
  best, ties share the mean rank), ranks are averaged over questions, the
  Friedman test says whether the runs differ at all (three runs or more), and
  each pair of runs is compared with a Wilcoxon signed-rank test on the paired
  F1s (zero_method 'pratt': questions where both runs score the same still
  count in the ranking of the differences), p-values adjusted by Holm's method
  (Benavoli et al., 2016).
- One-sided Mann-Whitney U tests between two samples of F1 (the paper's book
  ablations: Claude vs GPT book, ordered vs unordered book).

Pure functions over plain Python/numpy data; scipy does the tests.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np


@dataclass(frozen=True, slots=True)
class PairTest:
    a: str
    b: str
    p_value: float        # raw Wilcoxon p-value
    p_holm: float         # Holm-adjusted
    significant: bool     # p_holm < alpha


@dataclass(frozen=True, slots=True)
class RankingResult:
    average_ranks: dict[str, float]       # run -> mean rank, best (lowest) first
    pairs: list[PairTest]
    # Maximal sets of runs, adjacent in rank order, with no significant
    # difference between any two of them (the CD plot's horizontal bars).
    cliques: list[list[str]]
    n_questions: int
    friedman_p: float | None = None       # Friedman test over all runs (None: fewer than 3 runs)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjustment, monotone, capped at 1."""
    p = np.asarray(p_values, dtype=float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adjusted = np.empty(m)
    running = 0.0
    for i, idx in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[idx]))
        adjusted[idx] = running
    return adjusted.tolist()


def average_ranks(scores: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Mean rank of each run over questions (higher F1 = better = lower rank)."""
    from scipy import stats  # here: scipy (~1.4 s, ~40 MB) is loaded only when a test is computed
    names = list(scores)
    matrix = _matrix(scores)
    ranks = stats.rankdata(-matrix, axis=0)  # ties get the average rank
    means = ranks.mean(axis=1)
    return dict(sorted(zip(names, means.tolist()), key=lambda kv: kv[1]))


def wilcoxon_p(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value; 1.0 when the runs never differ."""
    from scipy import stats  # here: scipy (~1.4 s, ~40 MB) is loaded only when a test is computed
    diff = np.asarray(x, float) - np.asarray(y, float)
    if not np.any(diff != 0):
        return 1.0
    return float(stats.wilcoxon(x, y, zero_method="pratt").pvalue)


def friedman_p(scores: Mapping[str, Sequence[float]]) -> float | None:
    """Friedman test p-value over runs scored on the same questions; None
    with fewer than 3 runs (the test needs 3) or when no run ever differs."""
    from scipy import stats  # here: scipy (~1.4 s, ~40 MB) is loaded only when a test is computed
    matrix = _matrix(scores)
    if matrix.shape[0] < 3 or matrix.shape[1] < 2:
        return None
    if np.all(matrix == matrix[0]):
        return 1.0
    return float(stats.friedmanchisquare(*matrix).pvalue)


def rank_runs(scores: Mapping[str, Sequence[float]], alpha: float = 0.05) -> RankingResult:
    """Average ranks, Holm-adjusted pairwise Wilcoxon tests and CD cliques.

    `scores` maps a run name (e.g. "gpt-4o / in-context") to its per-question
    F1, all runs over the same questions in the same order.
    """
    _matrix(scores)  # validates shapes
    ranks = average_ranks(scores)
    order = list(ranks)
    pairs_raw = [(a, b, wilcoxon_p(scores[a], scores[b])) for a, b in combinations(order, 2)]
    adjusted = holm([p for _, _, p in pairs_raw]) if pairs_raw else []
    pairs = [PairTest(a, b, p, q, q < alpha) for (a, b, p), q in zip(pairs_raw, adjusted)]
    significant = {frozenset((t.a, t.b)) for t in pairs if t.significant}
    cliques: list[list[str]] = []
    for start in range(len(order)):
        end = start
        while end + 1 < len(order) and all(
                frozenset((order[i], order[end + 1])) not in significant for i in range(start, end + 1)):
            end += 1
        group = order[start:end + 1]
        if len(group) > 1 and not any(set(group) <= set(c) for c in cliques):
            cliques.append(group)
    return RankingResult(average_ranks=ranks, pairs=pairs, cliques=cliques,
                         n_questions=len(next(iter(scores.values()))) if scores else 0,
                         friedman_p=friedman_p(scores))


def mann_whitney_greater(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided Mann-Whitney U p-value for "x tends to be greater than y"."""
    from scipy import stats  # here: scipy (~1.4 s, ~40 MB) is loaded only when a test is computed
    if len(x) == 0 or len(y) == 0:
        raise ValueError("Mann-Whitney needs two non-empty samples")
    return float(stats.mannwhitneyu(x, y, alternative="greater").pvalue)


@dataclass(frozen=True, slots=True)
class BootstrapResult:
    mean_difference: float          # mean(b - a) over the paired questions
    ci_low: float
    ci_high: float
    confidence: float
    n_resamples: int
    seed: int
    n: int                          # paired questions
    distribution: list[float]       # the resampled mean differences


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, n_resamples: int = 10_000, seed: int = 0,
                     confidence: float = 0.95) -> BootstrapResult:
    """Percentile bootstrap CI of mean(b - a) over paired questions (scipy's
    `bootstrap` with paired=True: questions are resampled, pairs kept)."""
    from scipy import stats  # here: scipy (~1.4 s, ~40 MB) is loaded only when a test is computed
    x, y = np.asarray(a, float), np.asarray(b, float)
    if len(x) != len(y) or len(x) < 2:
        raise ValueError("the paired bootstrap needs two samples of the same length (>= 2)")
    diff = y - x
    if np.all(diff == diff[0]):  # no spread: every resample gives the same mean
        mean = float(diff[0])
        return BootstrapResult(mean, mean, mean, confidence, n_resamples, seed, len(x), [mean] * n_resamples)
    res = stats.bootstrap((x, y), lambda u, v, axis=-1: np.mean(v - u, axis=axis), paired=True,
                          vectorized=True, n_resamples=n_resamples, confidence_level=confidence,
                          method="percentile", random_state=np.random.default_rng(seed))
    return BootstrapResult(float(diff.mean()), float(res.confidence_interval.low),
                           float(res.confidence_interval.high), confidence, n_resamples, seed, len(x),
                           res.bootstrap_distribution.tolist())


def _matrix(scores: Mapping[str, Sequence[float]]) -> np.ndarray:
    if not scores:
        return np.empty((0, 0))
    lengths = {len(v) for v in scores.values()}
    if len(lengths) != 1:
        raise ValueError(f"every run must be scored on the same questions (lengths {sorted(lengths)})")
    return np.asarray([list(v) for v in scores.values()], dtype=float)


def format_ranking(result: RankingResult) -> str:
    """Plain-text rendering of a CD analysis (for report.md)."""
    lines = [f"Average rank over {result.n_questions} questions (1 = best); "
             "Wilcoxon signed-rank, Holm-adjusted, alpha 0.05", ""]
    if result.friedman_p is not None:
        lines[1:1] = [f"Friedman test over the {len(result.average_ranks)} runs: {p_is(result.friedman_p)}"]
    for name, rank in result.average_ranks.items():
        lines.append(f"  {rank:6.3f}  {name}")
    if result.cliques:
        lines.append("")
        lines.append("Not significantly different:")
        for group in result.cliques:
            lines.append("  - " + " | ".join(group))
    return "\n".join(lines)


def format_p(p: float) -> str:
    """A p-value as printed: "< 1e-300" when it underflows to 0 (never "p = 0")."""
    if p < 1e-300:
        return "< 1e-300"
    return f"{p:.3g}"


def p_is(p: float) -> str:
    """"p = 0.0123", or "p < 1e-300" when it underflows."""
    text = format_p(p)
    return f"p {text}" if text.startswith("<") else f"p = {text}"
