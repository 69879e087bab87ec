"""95% bootstrap intervals of a configuration's Simple Recall and
Chronological Awareness, over questions (the leaderboard's "[low, high]").

Questions are resampled with replacement within their stratum: 'all' and
'latest' questions within their bin, the considered chronological questions
among themselves, so every resample keeps the set's composition (no bin
vanishes, the count weights of Latest stay those of the set). Each resample's
scores are computed as scores.py defines them (bin means, then their mean;
Latest weighted by bin counts; Order = max(0, exact share x mean tau of the
exact matches)), vectorised, without the published tables' display rounding.
Seeded: the same records give the same interval.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.evaluation.scores import BINS, LATEST_BINS, is_considered

RESAMPLES = 2000
SEED = 0
CONFIDENCE = 0.95
NOTE = (f"[low, high]: {CONFIDENCE:.0%} percentile bootstrap intervals over questions ({RESAMPLES} resamples, "
        f"seed {SEED}; questions resampled within their type and bin)")


@dataclass(frozen=True, slots=True)
class Intervals:
    simple_recall: list[float] | None            # [low, high], None when the score is undefined
    chronological_awareness: list[float] | None


def _resampled_means(values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """RESAMPLES means of `values` resampled with replacement."""
    return np.asarray(values[rng.integers(0, len(values), (RESAMPLES, len(values)))].mean(axis=1))


def _bin_values(records: Sequence[ResultRecord], get: str, bins: Sequence[str]) -> list[np.ndarray]:
    out = []
    for b in bins:
        values = [r.f1 for r in records if r.get == get and r.bin == b and r.f1 is not None]
        if values:
            out.append(np.asarray(values, dtype=float))
    return out


def _simple_recall(records: Sequence[ResultRecord], rng: np.random.Generator) -> np.ndarray | None:
    bins = _bin_values(records, "all", BINS)
    if not bins:
        return None
    return np.asarray(np.mean([_resampled_means(v, rng) for v in bins], axis=0))


def _latest(records: Sequence[ResultRecord], rng: np.random.Generator) -> np.ndarray | None:
    bins = _bin_values(records, "latest", LATEST_BINS)
    if not bins:
        return None
    counts = np.asarray([len(v) for v in bins], dtype=float)
    return np.asarray(np.sum([_resampled_means(v, rng) * n for v, n in zip(bins, counts)], axis=0) / counts.sum())


def _order(records: Sequence[ResultRecord], rng: np.random.Generator) -> np.ndarray | None:
    considered = [r for r in records if r.get == "chronological" and is_considered(r.correct_answer or [])
                  and r.exact_match is not None]
    if not considered:
        return None
    exact = np.asarray([bool(r.exact_match) for r in considered], dtype=float)
    tau = np.asarray([float(r.tau) if r.exact_match and r.tau is not None else 0.0 for r in considered])
    has_tau = np.asarray([bool(r.exact_match) and r.tau is not None for r in considered], dtype=float)
    idx = rng.integers(0, len(considered), (RESAMPLES, len(considered)))
    share = exact[idx].mean(axis=1)
    n_tau = has_tau[idx].sum(axis=1)
    mean_tau = np.divide(tau[idx].sum(axis=1), n_tau, out=np.zeros(RESAMPLES), where=n_tau > 0)
    return np.asarray(np.maximum(0.0, share * mean_tau))


def _percentiles(draws: np.ndarray | None) -> list[float] | None:
    if draws is None:
        return None
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return [round(float(low), 3), round(float(high), 3)]


def score_intervals(records: Sequence[ResultRecord], seed: int = SEED) -> Intervals:
    """The intervals of one configuration's records (None where the score is
    undefined, or fewer than 2 questions were scored: no spread to resample)."""
    if sum(1 for r in records if r.f1 is not None) < 2:
        return Intervals(None, None)
    rng = np.random.default_rng(seed)
    order = _order(records, rng)
    latest = _latest(records, rng)
    if order is None:
        chrono = None  # Order undefined: so is the score (scores.chronological_awareness)
    else:
        chrono = order if latest is None else (latest + order) / 2
    return Intervals(simple_recall=_percentiles(_simple_recall(records, rng)),
                     chronological_awareness=_percentiles(chrono))
