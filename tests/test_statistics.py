"""The paper's statistics: Holm adjustment, average ranks, Wilcoxon cliques,
Mann-Whitney — checked against values worked out by hand or by scipy directly."""
import numpy as np
import pytest
from scipy import stats

from engine.benchmark.evaluation.statistics import (
    average_ranks,
    format_ranking,
    holm,
    mann_whitney_greater,
    rank_runs,
    wilcoxon_p,
)


def test_holm_matches_hand_computation():
    # p sorted: 0.01*3=0.03, 0.02*2=0.04, 0.04*1=0.04 (monotone) -> in input order
    assert holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert holm([0.6, 0.5]) == pytest.approx([1.0, 1.0])


def test_average_ranks_ties_share_the_mean_rank():
    ranks = average_ranks({"a": [1.0, 1.0], "b": [0.0, 1.0], "c": [0.0, 0.0]})
    # q1: a=1, b=2.5, c=2.5 ; q2: a=1.5, b=1.5, c=3
    assert ranks == pytest.approx({"a": 1.25, "b": 2.0, "c": 2.75})
    assert list(ranks) == ["a", "b", "c"]


def test_rank_runs_separates_a_clearly_better_run_and_groups_equal_ones():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.6, 200)
    scores = {"strong": (base + 0.3).tolist(), "weak": base.tolist(),
              "weak-twin": (base + rng.normal(0, 0.01, 200)).tolist()}
    result = rank_runs(scores)
    assert list(result.average_ranks)[0] == "strong"
    by_pair = {frozenset((t.a, t.b)): t for t in result.pairs}
    assert by_pair[frozenset(("strong", "weak"))].significant
    assert not by_pair[frozenset(("weak", "weak-twin"))].significant
    assert sorted(result.cliques[0]) == ["weak", "weak-twin"]
    assert "strong" in format_ranking(result)


def test_wilcoxon_identical_runs_is_not_significant():
    assert wilcoxon_p([0.5, 0.7, 1.0], [0.5, 0.7, 1.0]) == 1.0
    x, y = [0.1, 0.4, 0.9, 0.3, 0.8, 0.6], [0.0, 0.2, 0.5, 0.35, 0.1, 0.2]
    assert wilcoxon_p(x, y) == pytest.approx(stats.wilcoxon(x, y).pvalue)


def test_mann_whitney_one_sided_and_errors():
    high, low = [0.9, 0.8, 1.0, 0.95, 0.85], [0.1, 0.2, 0.3, 0.15, 0.25]
    assert mann_whitney_greater(high, low) < 0.01
    assert mann_whitney_greater(low, high) > 0.99
    with pytest.raises(ValueError):
        mann_whitney_greater([], high)


def test_runs_must_share_questions():
    with pytest.raises(ValueError, match="same questions"):
        rank_runs({"a": [1.0, 0.0], "b": [1.0]})


def test_report_ranks_full_runs_on_the_questions_all_of_them_scored():
    from engine.benchmark.evaluation.report import render_markdown, summarize
    from engine.benchmark.evaluation.results import ResultRecord

    def records(model, f1s):
        return [ResultRecord(q_idx=i, question=f"q{i}", get="all", bin="1", model=model, mode="in-context",
                             judge="builtin:judge", f1=f) for i, f in enumerate(f1s)]

    good = records("good", [1.0] * 30)
    bad = records("bad", [0.0, 0.5] * 15)
    bad[3].f1 = None  # a judge failure: question 3 is left out of the comparison
    summary = summarize(good + bad)
    ranking = summary["ranking"]
    assert ranking["n_questions"] == 29
    assert list(ranking["average_ranks"]) == ["good / in-context", "bad / in-context"]
    assert ranking["pairs"][0]["significant"]
    assert "critical-difference" in render_markdown(summary)


def test_friedman_matches_scipy_and_needs_three_runs():
    from engine.benchmark.evaluation.statistics import friedman_p

    rng = np.random.default_rng(3)
    scores = {name: rng.uniform(0, 1, 40).tolist() for name in "abc"}
    expected = stats.friedmanchisquare(*scores.values()).pvalue
    assert friedman_p(scores) == pytest.approx(expected)
    assert friedman_p({"a": [0.1, 0.2], "b": [0.3, 0.4]}) is None
    assert friedman_p({k: [0.5, 1.0, 0.0] for k in "abc"}) == 1.0
    assert rank_runs(scores).friedman_p == pytest.approx(expected)
    assert "Friedman test over the 3 runs" in format_ranking(rank_runs(scores))


def test_wilcoxon_uses_pratt_for_ties():
    y = [0.5] * 12  # four questions where both runs score the same: pratt ranks them, wilcox drops them
    x = [0.5, 0.5, 0.5, 0.5, 0.8, 0.4, 0.7, 0.9, 0.3, 1.0, 0.6, 1.1]
    assert wilcoxon_p(x, y) == pytest.approx(stats.wilcoxon(x, y, zero_method="pratt").pvalue)
    assert wilcoxon_p(x, y) != pytest.approx(stats.wilcoxon(x, y, zero_method="wilcox").pvalue)


def test_paired_bootstrap_is_scipys_seeded_percentile_interval():
    from engine.benchmark.evaluation.statistics import paired_bootstrap

    rng = np.random.default_rng(5)
    a = rng.uniform(0, 1, 60)
    b = a + 0.1 + rng.normal(0, 0.05, 60)
    result = paired_bootstrap(a, b, n_resamples=1000, seed=11)
    reference = stats.bootstrap((a, b), lambda u, v, axis=-1: np.mean(v - u, axis=axis), paired=True,
                                vectorized=True, n_resamples=1000, method="percentile",
                                random_state=np.random.default_rng(11)).confidence_interval
    assert (result.ci_low, result.ci_high) == pytest.approx((reference.low, reference.high))
    assert result.mean_difference == pytest.approx(float(np.mean(b - a)))
    assert result.ci_low < result.mean_difference < result.ci_high
    assert (result.n_resamples, result.seed, result.n, len(result.distribution)) == (1000, 11, 60, 1000)
    assert paired_bootstrap(a, b, n_resamples=1000, seed=11) == result
    same = paired_bootstrap([0.5, 1.0, 0.0], [0.5, 1.0, 0.0], n_resamples=10)
    assert (same.mean_difference, same.ci_low, same.ci_high) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError):
        paired_bootstrap([1.0], [0.0])
