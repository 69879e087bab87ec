"""`tulving compare` (paired: Wilcoxon + paired bootstrap; unpaired: one-sided
Mann-Whitney) and `tulving agreement` (two judges), as subprocesses over run
folders; figures checked against scipy computed here directly."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from scipy import stats

from engine.benchmark.evaluation.results import load_results, write_results
from tests.report_runs import copied_run, offline_run, renamed_run, tulving

OTHER_JUDGE = "other-judge"


@pytest.fixture(scope="module")
def runs(tmp_path_factory, offline_short_run):
    root = tmp_path_factory.mktemp("compare")
    good = copied_run(offline_short_run, root, "good")
    # A weaker configuration on the same questions: every third scored 'all' answer wrong.
    worse = renamed_run(good, root / "worse", "weaker-model")
    records = load_results(worse)
    for r in records:
        if r.get == "all" and r.q_idx % 3 == 0 and r.f1 is not None:
            r.f1, r.identified_items, r.matching_scores = 0.0, [], [0.0] * len(r.correct_answer)
    write_results(worse / "results.jsonl", records)
    # The same answers under a second judge that disagrees on every fifth question.
    other = renamed_run(good, root / "other", "builtin:reader")
    records = load_results(other)
    for r in records:
        r.judge = OTHER_JUDGE
        if r.q_idx % 5 == 0 and r.f1 is not None:
            r.f1, r.identified_items = 1.0 - r.f1, ["something else"]
    write_results(other / "results.jsonl", records)
    offline_run(root, "long", "--book", "synaptic-echoes", "--sample", "60")
    return root


def _f1(folder, get="all"):
    return {r.q_idx: r.f1 for r in load_results(folder) if r.get == get and r.f1 is not None}


def test_compare_same_questions_is_paired(runs):
    result = tulving(runs, "compare", "good", "worse", "--resamples", "2000", "--seed", "7", "--out", "cmp")
    assert result.returncode == 0, result.stderr
    a, b = _f1(runs / "good"), _f1(runs / "worse")
    common = sorted(set(a) & set(b))
    x, y = np.array([a[q] for q in common]), np.array([b[q] for q in common])
    p = stats.wilcoxon(x, y, zero_method="pratt").pvalue
    assert "test: paired" in result.stdout and f"p = {p:.3g}" in result.stdout
    assert "2000 resamples, seed 7" in result.stdout
    data = json.loads((runs / "cmp" / "compare.json").read_text())
    boot = data["bootstrap"]
    # Oriented as the question it answers, "does A score higher than B?": A - B (it printed B - A).
    assert boot["mean_difference"] == pytest.approx((x - y).mean())
    assert 0 < boot["ci_low"] < boot["mean_difference"] < boot["ci_high"]
    reference = stats.bootstrap((x, y), lambda u, v, axis=-1: np.mean(u - v, axis=axis), paired=True,
                                vectorized=True, n_resamples=2000, method="percentile",
                                random_state=np.random.default_rng(7)).confidence_interval
    assert (boot["ci_low"], boot["ci_high"]) == pytest.approx((reference.low, reference.high), abs=1e-9)
    assert "does A score higher than B?" in result.stdout and "mean difference A - B = +" in result.stdout
    assert "answer: yes: A scores higher than B (the 95% CI of A - B lies above 0)" in result.stdout
    reverse = tulving(runs, "compare", "worse", "good", "--resamples", "2000", "--seed", "7")
    assert "answer: no: B scores higher than A (the 95% CI of A - B lies below 0)" in reverse.stdout
    assert (runs / "cmp" / "figures" / "bootstrap_differences.png").stat().st_size > 1000
    # Same seed, same interval.
    again = tulving(runs, "compare", "good", "worse", "--resamples", "2000", "--seed", "7")
    assert result.stdout.splitlines()[4] == again.stdout.splitlines()[4]


def test_compare_different_books_is_mann_whitney(runs):
    result = tulving(runs, "compare", "good", "long")
    assert result.returncode == 0, result.stderr
    x, y = list(_f1(runs / "good").values()), list(_f1(runs / "long").values())
    greater = stats.mannwhitneyu(x, y, alternative="greater").pvalue
    less = stats.mannwhitneyu(y, x, alternative="greater").pvalue
    assert "test: unpaired -- different books" in result.stdout
    assert f"'A scores higher than B': p = {greater:.3g}" in result.stdout
    assert f"'B higher than A': p = {less:.3g}" in result.stdout
    verdict = ("yes: A scores higher" if greater < 0.05 else "no: B scores higher" if less < 0.05 else "not shown")
    assert f"answer: {verdict}" in result.stdout


def test_compare_asks_which_configuration(runs):
    result = tulving(runs, "compare", "good,worse", "long")
    assert result.returncode != 0 and "--a MODEL/MODE" in result.stderr
    picked = tulving(runs, "compare", "good,worse", "good", "--a", "weaker-model/in-context")
    assert picked.returncode == 0, picked.stderr
    assert "A: weaker-model / in-context" in picked.stdout and "test: paired" in picked.stdout


def test_agreement_of_two_judges(runs):
    result = tulving(runs, "agreement", "good", "other", "--out", "agree", "--top", "5")
    assert result.returncode == 0, result.stderr
    with open(runs / "agree" / "judge_agreement.csv", newline="") as f:
        [row] = list(csv.DictReader(f))
    all_a = {r.q_idx: r.f1 for r in load_results(runs / "good") if r.f1 is not None}
    all_b = {r.q_idx: r.f1 for r in load_results(runs / "other") if r.f1 is not None}
    keys = sorted(set(all_a) & set(all_b))
    x, y = np.array([all_a[k] for k in keys]), np.array([all_b[k] for k in keys])
    assert int(row["questions"]) == len(keys) == 456
    assert float(row["Pearson"]) == pytest.approx(stats.pearsonr(x, y).statistic, abs=1e-3)
    assert float(row["Spearman"]) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-3)
    assert float(row["mean |F1 A - F1 B|"]) == pytest.approx(np.abs(x - y).mean(), abs=1e-3)
    changed = sum(1 for k in keys if k % 5 == 0)
    assert float(row["identical item sets"]) == pytest.approx(1 - changed / 456, abs=1e-3)
    assert row["answers differ"] == "0"
    with open(runs / "agree" / "judge_disagreements.csv", newline="") as f:
        worst = list(csv.DictReader(f))
    assert len(worst) == 5 and all(int(w["q"]) % 5 == 0 and abs(float(w["F1 A"]) - float(w["F1 B"])) == 1
                                   for w in worst)
    assert (runs / "agree" / "judge_agreement.png").stat().st_size > 1000


def test_report_has_an_agreement_section_when_two_judges_are_present(runs):
    result = tulving(runs, "report", "good", "other", "--out", "rep")
    assert result.returncode == 0, result.stderr
    html = (runs / "rep" / "index.html").read_text()
    assert 'id="agreement"' in html and 'id="t-judge_agreement"' in html
    assert (runs / "rep" / "figures" / "judge_agreement.png").is_file()
    scores = json.loads((runs / "rep" / "scores.json").read_text())
    assert sorted(g["judge"] for g in scores["groups"]) == ["builtin:judge", OTHER_JUDGE]


def test_agreement_needs_two_judges(runs):
    result = tulving(runs, "agreement", "good", "worse")
    assert result.returncode != 0 and "two judges" in result.stderr
