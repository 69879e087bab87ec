"""Reproduce the paper's table of expected item-repetition counts
(tab:uniform_vs_geometric): N_events items drawn i.i.d. from a universe of 100
with the truncated geometric (p = 0.1) or the uniform distribution, repeated
10,000 times; for each bin (an item drawn 1, 2, 3-5, 6+ times) the mean and
standard deviation of the number of items in it.

    python benchmarks/repetition_table.py [--repetitions 10000] [--seed 0]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.benchmark.generation.events import GEOMETRIC_P  # noqa: E402
from engine.benchmark.generation.universe import N_UNIVERSE  # noqa: E402

BINS = ("1", "2", "3-5", "6+")
# The paper's values: (N_events, distribution) -> bin -> (mean, sd)
PAPER = {
    (20, "geometric"): {"1": (8, 2.4), "2": (3, 1.5), "3-5": (2, 0.9), "6+": (0, 0.2)},
    (200, "geometric"): {"1": (9, 2.7), "2": (5, 1.9), "3-5": (7, 2.2), "6+": (13, 1.4)},
    (20, "uniform"): {"1": (16, 2.3), "2": (2, 1.1), "3-5": (0, 0.3), "6+": (0, 0.0)},
    (200, "uniform"): {"1": (27, 4.0), "2": (27, 4.5), "3-5": (31, 3.2), "6+": (2, 1.2)},
}


def probabilities(distribution: str, n_universe: int = N_UNIVERSE, p: float = GEOMETRIC_P) -> np.ndarray:
    if distribution == "uniform":
        return np.full(n_universe, 1.0 / n_universe)
    weights = (1 - p) ** np.arange(n_universe) * p
    return weights / weights.sum()  # P(X=i) = (1-p)^i p / (1 - (1-p)^N)


def expected_counts(n_events: int, distribution: str, repetitions: int = 10_000, seed: int = 0,
                    n_universe: int = N_UNIVERSE) -> dict[str, tuple[float, float]]:
    """bin -> (mean, sd) of the number of items drawn that many times."""
    rng = np.random.default_rng(seed)
    draws = rng.choice(n_universe, size=(repetitions, n_events), p=probabilities(distribution, n_universe))
    # per repetition, how many times each item was drawn (one bincount for all rows)
    flat = (draws + n_universe * np.arange(repetitions)[:, None]).ravel()
    counts = np.bincount(flat, minlength=repetitions * n_universe).reshape(repetitions, n_universe)
    per_bin = {"1": (counts == 1).sum(1), "2": (counts == 2).sum(1),
               "3-5": ((counts >= 3) & (counts <= 5)).sum(1), "6+": (counts >= 6).sum(1)}
    return {b: (float(v.mean()), float(v.std())) for b, v in per_bin.items()}


def table(repetitions: int = 10_000, seed: int = 0) -> dict[tuple[int, str], dict[str, tuple[float, float]]]:
    return {key: expected_counts(key[0], key[1], repetitions, seed) for key in PAPER}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    ours = table(args.repetitions, args.seed)
    elapsed = time.perf_counter() - start
    print(f"expected counts over {args.repetitions} repetitions (ours | paper), {elapsed:.2f} s")
    print(f"{'N':>4} {'D':<10} " + " ".join(f"{b:>22}" for b in BINS))
    for (n, dist), row in ours.items():
        cells = []
        for b in BINS:
            m, s = row[b]
            pm, ps = PAPER[(n, dist)][b]
            cells.append(f"{m:5.1f}±{s:3.1f} | {pm:>2}±{ps:3.1f}")
        print(f"{n:>4} {dist:<10} " + " ".join(f"{c:>22}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
