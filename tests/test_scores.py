"""The scoring core against the protocol's edge cases and the published figures."""
from __future__ import annotations

import itertools
import json
import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import kendalltau

from engine.benchmark.datadir import data_dir
from engine.benchmark.evaluation.scores import (
    agreement,
    bin_mean,
    chrono_match,
    chronological_awareness,
    distinct,
    is_considered,
    kendall_tau,
    lenient_f1,
    simple_recall,
)

LONG_ALL_COUNTS = {"0": 150, "1": 150, "2": 90, "3-5": 98, "6+": 60}


# -- lenient F1 --------------------------------------------------------------------------------
@pytest.mark.parametrize("identified, gt, scores, expected", [
    ([], [], [], 1.0),                                  # nothing to find, nothing said: both undefined
    (["Central Park"], [], [], 0.0),                    # R undefined only
    ([], ["a"], [0], 0.0),                              # P undefined only
    (["x"], ["a", "b"], [0, 0], 0.0),                   # P = R = 0
    (["a"], ["a"], [1], 1.0),
    # the paper's listing: 5 items identified for 1 ground-truth item -> #pred = 1
    (["Tech Hackathon", "developers gathered", "collaborative projects", "innovative solutions", "presentations"],
     ["Tech Hackathon"], [1], 1.0),
    # the paper's Bella Brown example: 3 identified, scores 0, 0.5, 1
    (["Washington Square Park", "Lincoln Center", "Bethpage State Park"],
     ["High Line", "Bethpage Black Course", "Lincoln Center"], [0, 0.5, 1], 0.5),
    (["a"], ["a", "b", "c"], [1, 0, 0], 0.5),          # P = 1, R = 1/3
    (["a", "a", "a"], ["a", "b", "c"], [1, 0, 0], 0.5),  # repeated identified items count once
    (["a", "b"], ["a", "a", "b"], [1, 0, 1], 1.0),     # repeated ground truth: first occurrence scores
])
def test_lenient_f1(identified, gt, scores, expected):
    assert lenient_f1(identified, gt, scores) == pytest.approx(expected)


def test_lenient_f1_formula_and_bad_input():
    # #pred = min(#identified, #gt): 2 identified, 4 ground truth, S = 1.5 -> P = 0.75, R = 0.375
    assert lenient_f1(["a", "b"], ["a", "b", "c", "d"], [1, 0.5, 0, 0]) == pytest.approx(2 * 0.75 * 0.375 / 1.125)
    with pytest.raises(ValueError, match="2 scores for 1"):
        lenient_f1(["a"], ["a"], [1, 0])


# -- chronological -----------------------------------------------------------------------------
def _reference_tau(predicted: list[int], n_gt: int) -> float:
    """Kendall tau as the reference scoring computed it: positions of the common
    elements in the filtered prediction and in the ground-truth index list."""
    filtered = list(dict.fromkeys(i for i in predicted if i != -1))
    common = list(set(filtered) & set(range(n_gt)))
    in_pred = [x for x in filtered if x in common]
    in_gt = [x for x in range(n_gt) if x in common]
    return kendalltau([in_pred.index(x) for x in common], [in_gt.index(x) for x in common]).statistic


def test_kendall_tau_equals_the_reference_computation():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(2, 8)
        predicted = [rng.randint(-1, n - 1) for _ in range(rng.randint(2, 10))]
        match = chrono_match(predicted, n)
        expected = _reference_tau(predicted, n) if len(match.kept) >= 2 else None
        if expected is None:
            assert match.tau is None
        else:
            assert match.tau == pytest.approx(expected)


@pytest.mark.parametrize("indices, n_gt, kept, tau, exact, considered", [
    ([1, -1, 0], 3, [1, 0], -1.0, False, True),
    ([0, 1, 2], 3, [0, 1, 2], 1.0, True, True),
    ([2, 2, -1, 0, 1], 3, [2, 0, 1], -1 / 3, True, True),
    ([0], 1, [0], None, True, False),                  # one item: no order to judge
    ([0, 7, 1], 2, [0, 1], 1.0, True, True),           # an index outside the ground truth is dropped
    ([], 2, [], None, False, True),
])
def test_chrono_match(indices, n_gt, kept, tau, exact, considered):
    m = chrono_match(indices, n_gt)
    assert m.kept == kept and m.exact_match is exact and m.considered is considered
    assert (m.tau is None) if tau is None else m.tau == pytest.approx(tau)


def test_kendall_tau_is_tau_b():
    assert kendall_tau([0, 1]) == 1.0 and kendall_tau([1, 0]) == -1.0 and kendall_tau([3]) is None
    for perm in itertools.permutations(range(4)):
        assert kendall_tau(list(perm)) == pytest.approx(kendalltau(range(4), perm).statistic)


def test_kendall_tau_is_scipys_to_the_last_bit_ties_included():
    # Computed without scipy (its import costs ~40 MB during a run): stored
    # scores must not move by an ulp.
    rng = random.Random(3)
    for _ in range(2_000):
        kept = [rng.randint(0, rng.randint(1, 40)) for _ in range(rng.randint(2, 40))]
        expected = kendalltau(list(range(len(kept))), kept).statistic
        assert kendall_tau(kept) == (None if math.isnan(expected) else float(expected)), kept
    assert kendall_tau([5, 5, 5]) is None


# -- Simple Recall ---------------------------------------------------------------------------------
def _rows_with_mean(get: str, bin_: str, n: int, mean: float, **extra) -> list[dict]:
    """n rows whose F1 average to `mean` exactly: ones, one remainder, zeros."""
    total = mean * n
    ones = int(total)
    f1s = [1.0] * ones + ([total - ones] if ones < n else []) + [0.0] * max(0, n - ones - 1)
    assert len(f1s) == n and math.isclose(sum(f1s) / n, mean)
    return [{"get": get, "bin": bin_, "f1": f, **extra} for f in f1s]


def _published():
    root = data_dir() / "published"
    return (json.loads((root / "paper_f1_by_bin.json").read_text()),
            {r["model"]: r for r in json.loads((root / "leaderboard.json").read_text())["rows"]})


def test_simple_recall_gpt4o_long_book():
    rows = []
    for bin_, mean in zip(LONG_ALL_COUNTS, (0.84, 0.81, 0.60, 0.57, 0.53)):
        rows += _rows_with_mean("all", bin_, LONG_ALL_COUNTS[bin_], mean)
    rows += _rows_with_mean("latest", "6+", 5, 0.0)        # other gets do not count
    rows += [{"get": "all", "bin": "1", "f1": None}]       # a judge failure is left out
    score, bins = simple_recall(rows)
    assert score == 0.670
    assert bins == {"0": 0.84, "1": 0.81, "2": 0.60, "3-5": 0.57, "6+": 0.53}


def test_simple_recall_reproduces_the_leaderboard_from_the_papers_bin_means():
    """Every in-context long-book model of the paper's F1 table that is also on
    the leaderboard: its published bin means give its published score."""
    tables, board = _published()
    checked = 0
    for entry in tables["long_book"]:
        if entry["memory"] != "in-context" or entry["model"] not in board:
            continue
        rows = []
        for bin_, stats in entry["bins"].items():
            rows += _rows_with_mean("all", bin_, LONG_ALL_COUNTS[bin_], stats["mean"])
        assert simple_recall(rows)[0] == board[entry["model"]]["simple_recall"], entry["model"]
        checked += 1
    assert checked >= 4


def test_simple_recall_short_book_has_four_bins():
    tables, _ = _published()
    gpt4o = next(e for e in tables["short_book"] if e["model"] == "gpt-4o" and e["memory"] == "in-context")
    rows = []
    for bin_, stats in gpt4o["bins"].items():
        rows += _rows_with_mean("all", bin_, 30, stats["mean"])
    score, bins = simple_recall(rows)
    assert list(bins) == ["0", "1", "2", "3-5"]
    # (0.86 + 0.96 + 0.93 + 0.88) / 4 = 0.9075: a half, rounded as pandas does
    assert [s["mean"] for s in gpt4o["bins"].values()] == [0.86, 0.96, 0.93, 0.88]
    assert score == 0.908 and round(0.9075, 3) == 0.907
    assert math.isnan(simple_recall([])[0])


# -- Chronological Awareness -------------------------------------------------------------------------
def _chrono_rows(questions, n_exact: int, taus: list[float]) -> list[dict]:
    considered = [q for q in questions if q.get == "chronological" and len(set(q.correct_answer)) >= 2]
    rows = []
    for i, q in enumerate(considered):
        exact = i < n_exact
        rows.append({"get": "chronological", "bin": q.bin, "f1": 0.5, "correct_answer": q.correct_answer,
                     "exact_match": exact, "tau": taus[i] if exact else 0.3})
    return rows


def _latest_rows(questions, means: tuple[float, float, float]) -> list[dict]:
    """The question set's 'latest' questions of bins 2, 3-5, 6+ with these bin means."""
    counts = Counter(q.bin for q in questions if q.get == "latest" and q.bin in ("2", "3-5", "6+"))
    rows = []
    for bin_, mean in zip(("2", "3-5", "6+"), means):
        rows += _rows_with_mean("latest", bin_, counts[bin_], mean)
    return rows


def _taus_with_mean(k: int, tau: float) -> list[float]:
    """k Kendall taus (each a possible tau) whose mean rounds to `tau`."""
    for pattern in itertools.product((1.0, 2 / 3, 1 / 3, 0.0, -1 / 3, -1.0), repeat=k):
        if round(float(sum(pattern) / k), 2) == tau:
            return list(pattern)
    raise AssertionError(f"no {k} taus average to {tau}")


def test_considered_counts_distinct_items(long_questions, short_questions):
    """12 of the long book's 39 considered questions repeat an item; the short
    book considers 14 (one question has a single item, repeated)."""
    for questions, considered, repeating in ((long_questions, 39, 12), (short_questions, 14, 0)):
        chrono = [q for q in questions if q.get == "chronological"]
        assert sum(is_considered(q.correct_answer) for q in chrono) == considered
        assert sum(is_considered(q.correct_answer) and len(set(q.correct_answer)) < len(q.correct_answer)
                   for q in chrono) == repeating
    assert sum(len(q.correct_answer) >= 2 for q in short_questions if q.get == "chronological") == 15
    assert is_considered(["a", "b", "a"]) and not is_considered(["a", "a"]) and distinct("abca") == ["a", "b", "c"]


def test_a_perfect_answer_matches_every_considered_question(long_questions):
    """A judge that finds every item, in order: 39/39 exact matches, tau 1
    (the repeated items are sent once, so each distinct item is found)."""
    rows = []
    for q in long_questions:
        if q.get != "chronological":
            continue
        n = len(distinct(q.correct_answer))
        match = chrono_match(list(range(n)), n)
        rows.append({"get": "chronological", "bin": q.bin, "f1": 1.0, "correct_answer": q.correct_answer,
                     "exact_match": match.exact_match, "tau": match.tau})
    _, parts = chronological_awareness(rows)
    assert (parts.considered, parts.exact_matches, parts.all, parts.tau, parts.order) == (39, 39, 1.0, 1.0, 1.0)


def test_chronological_awareness_gpt4o_long_book(long_questions):
    """Published: gpt-4o in context has All = 10% (4 of the 39 questions) and
    tau = 0.50 (paper, latest/chronological table) and scores 0.204
    (leaderboard). All is kept to 4 decimals (0.1026): the 'latest' bin means
    0.36, 0.36, 0.35 (Latest 0.3562, the paper's 36%) give 0.204, where All
    rounded to 0.10 would give 0.203."""
    rows = _latest_rows(long_questions, (0.36, 0.36, 0.35))
    rows += _rows_with_mean("latest", "1", 15, 1.0)       # bins 0 and 1 do not count
    rows += _chrono_rows(long_questions, 4, [1.0, 1.0, 0.0, 0.0])
    assert sum(r["get"] == "chronological" for r in rows) == 39
    score, parts = chronological_awareness(rows)
    assert parts.considered == 39 and parts.exact_matches == 4
    assert parts.all == 10.26 / 100 and parts.tau == 0.50 and parts.order == pytest.approx(0.0513)
    assert parts.latest == 35.62 / 100
    assert score == 0.204
    assert round((parts.latest + 0.10 * 0.50) / 2, 3) == 0.203  # the too-early rounding
    _, board = _published()
    assert board["gpt-4o"]["chronological_awareness"] == score


def test_all_keeps_four_decimals():
    """19/39 exact, tau 0.25, Latest 0.5369: the reference's 0.329 (All =
    0.4872), not 0.330 (All rounded to 0.49)."""
    rows = _rows_with_mean("latest", "2", 9, 0.56) + _rows_with_mean("latest", "3-5", 15, 0.53)
    rows += _rows_with_mean("latest", "6+", 15, 0.53)
    taus = [1.0] * 4 + [2 / 3] + [0.0] * 14 + [-1.0] * 20  # mean over the 19 exact matches: 0.2456
    rows += [{"get": "chronological", "bin": "2", "f1": 0.5, "correct_answer": ["a", "b"],
              "exact_match": i < 19, "tau": taus[i]} for i in range(39)]
    score, parts = chronological_awareness(rows)
    # the reference's floats: '53.69%' and '48.72%' read back, divided by 100
    assert parts.latest == 53.69 / 100 and parts.all == 48.72 / 100 and parts.tau == 0.25
    assert score == 0.329


PAPER_TABLE = json.loads((Path(__file__).parent / "data" / "paper_latest_chrono.json").read_text())["columns"]
# Leaderboard rows from the same runs as the paper's table columns, with bin
# means for 'latest' that give the paper's Latest (bins 2, 3-5, 6+).
LEADERBOARD_LATEST_MEANS = {"gpt-4o": (0.36, 0.36, 0.35), "gpt-4o-mini": (0.14, 0.13, 0.12),
                            "llama-3.1-405b": (0.27, 0.26, 0.25)}


def test_paper_table_matches_the_tex():
    tex = Path(__file__).resolve().parents[2] / "shared" / "paper" / "episodic-memory-benchmark.tex"
    if not tex.exists():
        pytest.skip(f"{tex} is absent (a clone without shared/ beside it): the fixture cannot be checked against it")
    lines = tex.read_text().splitlines()

    def row(label: str) -> list[str]:
        line = next(l for l in lines if l.lstrip().startswith(label))
        return [c.strip() for c in line.split("\\\\")[0].split("&")[1:]]
    assert [int(c.split("\\")[0]) for c in row("\\bf \\scriptsize Latest &")] == [c["latest_pct"] for c in PAPER_TABLE]
    assert [int(c.split("\\")[0]) for c in row("\\bf \\scriptsize All &")] == [c["all_pct"] for c in PAPER_TABLE]
    assert [int(c.split("/")[0]) for c in row("%\\bf \\scriptsize Match all &")] == [c["exact_matches"] for c in PAPER_TABLE]
    taus = [None if c == "n.a." else float(c) for c in row("\\bf \\scriptsize Kendall")]
    assert taus == [c["tau"] for c in PAPER_TABLE]


@pytest.mark.parametrize("column", PAPER_TABLE, ids=lambda c: f"{c['model']}/{c['memory']}")
def test_every_column_of_the_papers_latest_chrono_table(column, long_questions):
    """Each column of the paper's table: its exact matches out of the 39
    considered questions give its All and its tau, and Order = All x tau;
    where the leaderboard scores the same run, the score is reproduced."""
    k, tau = column["exact_matches"], column["tau"]
    means = LEADERBOARD_LATEST_MEANS.get(column["model"]) if column["memory"] == "in-context" else None
    rows = _latest_rows(long_questions, means or (column["latest_pct"] / 100,) * 3)
    rows += _chrono_rows(long_questions, k, _taus_with_mean(k, tau) if k else [])
    score, parts = chronological_awareness(rows)
    assert parts.considered == 39 and parts.exact_matches == k
    assert parts.all == round(k / 39 * 100, 2) / 100 and round(parts.all * 100) == column["all_pct"]
    assert parts.tau == (tau if k else 0.0)
    assert parts.order == pytest.approx(parts.all * parts.tau if k else 0.0)
    assert round(parts.latest * 100) == column["latest_pct"]
    if means is not None:
        _, board = _published()
        assert score == board[column["model"]]["chronological_awareness"]


@pytest.mark.parametrize("model", ["claude-3-haiku", "claude-3-5-sonnet", "o1-mini"])
def test_leaderboard_rows_from_other_runs_than_the_paper_table(model):
    """Three in-context models have a leaderboard score that no Latest within
    the paper's printed percentage gives, whether All keeps 4 decimals or 2:
    their leaderboard rows come from other runs than the paper's table, so
    they are not checked against it."""
    column = next(c for c in PAPER_TABLE if c["model"] == model and c["memory"] == "in-context")
    _, board = _published()
    published = board[model]["chronological_awareness"]
    k, tau = column["exact_matches"], column["tau"] or 0.0
    for all_ in (round(k / 39 * 100, 2) / 100, round(k / 39, 2)):
        for latest in np.arange(column["latest_pct"] - 0.5, column["latest_pct"] + 0.5, 0.01) / 100:
            assert round((latest + all_ * tau) / 2, 3) != published


def test_chronological_awareness_edge_cases(long_questions):
    latest = _rows_with_mean("latest", "2", 9, 0.26)
    # no exact match: Order is 0 whatever tau (llama-3.1-405b's case: 0.129 = 0.258 / 2)
    score, parts = chronological_awareness(latest + _chrono_rows(long_questions, 0, []))
    assert parts.order == 0 and parts.tau == 0 and score == 0.13
    # negative tau: Order = max(0, All x tau) = 0
    score, parts = chronological_awareness(latest + _chrono_rows(long_questions, 3, [-1.0, -1.0, 0.0]))
    assert parts.tau == -0.67 and parts.order == 0.0
    # judge failures are left out of the considered questions
    rows = _chrono_rows(long_questions, 2, [1.0, 1.0])
    for r in rows[20:]:
        r["exact_match"] = None
    _, parts = chronological_awareness(rows)
    assert parts.considered == 20 and parts.all == 0.10
    # questions with one distinct item are never considered
    singles = [{"get": "chronological", "bin": "1", "f1": 1.0, "correct_answer": ["a"], "exact_match": True,
                "tau": None},
               {"get": "chronological", "bin": "2", "f1": 1.0, "correct_answer": ["a", "a"], "exact_match": True,
                "tau": None}]
    assert chronological_awareness(singles)[1].considered == 0


def test_undefined_parts_are_not_zero(long_questions):
    chrono = _chrono_rows(long_questions, 4, [1.0, 1.0, 0.0, 0.0])
    # no 'latest' question in bins 2+ (bins 0/1 do not count): the score is Order alone
    score, parts = chronological_awareness(chrono + _rows_with_mean("latest", "1", 5, 1.0))
    assert math.isnan(parts.latest) and parts.latest_bins == {}
    assert score == round(0.1026 * 0.5, 3) == 0.051
    # no considered chronological question: Order is undefined, and so is the score
    score, parts = chronological_awareness(_rows_with_mean("latest", "2", 9, 0.26))
    assert parts.considered == 0 and math.isnan(parts.all) and math.isnan(parts.order) and math.isnan(parts.tau)
    assert math.isnan(score)
    assert math.isnan(chronological_awareness([])[0])


# -- ties: means as pandas computes them, from F1 at full precision -----------------------------------
@pytest.mark.parametrize("values, expected, naive", [
    # exact mean 0.625: '%.2f' of the compensated mean -> 0.62; np.mean gives 0.6250000000000001 -> 0.63
    ([0.9, 0.8, 0.7, 0.1], 0.62, 0.63),
    ([0.3, 0.75, 0.75, 0.25, 0.7, 0.7], 0.57, 0.58),
    ([0.9, 0.9, 0.9, 0.1, 0.2, 0.4, 0.3, 0.9], 0.58, 0.57),
])
def test_bin_mean_is_the_compensated_mean(values, expected, naive):
    assert bin_mean(values) == expected and round(float(np.mean(values)), 2) == naive
    assert simple_recall([{"get": "all", "bin": "2", "f1": f} for f in values])[1] == {"2": expected}


def test_bin_mean_needs_full_precision_f1():
    """F1 stored rounded to 6 decimals moves this exact .xx5 tie."""
    values = [0.1, 0.8, 1 / 3, 2 / 3]
    assert bin_mean(values) == 0.47
    assert bin_mean([round(v, 6) for v in values]) == 0.48


def test_rows_may_be_objects():
    class Row:
        def __init__(self, f1):
            self.get, self.bin, self.f1 = "all", "1", f1
    assert simple_recall([Row(1.0), Row(0.0)]) == (0.5, {"1": 0.5})


# -- agreement ---------------------------------------------------------------------------------------
def test_agreement():
    same = agreement([1.0, 0.5, 0.0], [1.0, 0.5, 0.0])
    assert same["n"] == 3 and same["mean_abs_diff"] == 0 and same["identical"] == 1 and same["pearson"] == pytest.approx(1)
    a = [{"q_idx": 0, "f1": 1.0}, {"q_idx": 1, "f1": 0.0}, {"q_idx": 2, "f1": None}, {"q_idx": 3, "f1": 0.5}]
    b = {0: 0.5, 1: 0.0, 2: 1.0, 3: 1.0, 9: 1.0}
    out = agreement(a, b)
    assert out["n"] == 3  # q 2 unjudged by a, q 9 absent from a
    assert out["mean_abs_diff"] == pytest.approx(1 / 3)
    assert out["identical"] == pytest.approx(1 / 3) and out["within_0.25"] == pytest.approx(1 / 3)
    assert out["mean_a"] == pytest.approx(0.5) and out["mean_b"] == pytest.approx(0.5)
    flat = agreement([1.0, 1.0], [0.0, 1.0])
    assert flat["pearson"] is None  # a constant side has no correlation
    assert agreement([], [])["n"] == 0

