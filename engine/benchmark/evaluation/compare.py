"""`tulving compare RUN_A RUN_B`: does configuration A score higher than B, and by how much?

Every figure is oriented as that question: a difference is A - B (positive:
A higher), and the output ends with the answer in words. The test is picked
from what the two runs share:
- the same questions (same book: the same q_idx and question text on both
  sides) -> paired: Wilcoxon signed-rank (zero_method 'pratt', two-sided)
  on the per-question F1, and a paired bootstrap confidence interval of the
  mean difference A - B (number of resamples and seed stated), drawn as a
  Gardner-Altman figure;
- different questions (another book: ordered vs unordered, book A vs book B,
  realistic vs not) -> unpaired: one-sided Mann-Whitney U, "A tends to score
  higher than B" (the direction is the order given on the command line; the
  reverse p-value is stated too), as the paper's ablations.

Only the 'all' (simple recall) questions are compared by default (`get`);
judge failures are left out on both sides (and, paired, the question with them).

The realism ablation (realism.py, the paper's appendix table): when the
chapters are rated (`--realism FILE`, or realism.json in a run's book
folder), each side's questions are split into realistic and non-realistic
ones, with the F1 of each class and the Mann-Whitney U test of the
difference. `compare_realism` does it for one run alone (`tulving compare
RUN`): every configuration of it side by side, as the paper's table.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from engine.benchmark.evaluation import figures as F
from engine.benchmark.evaluation.realism import RealismSplit, find_ratings, realism_markdown, realism_split
from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.evaluation.runset import RunKey, RunSet, load_runs
from engine.benchmark.evaluation.statistics import mann_whitney_greater, p_is, paired_bootstrap, wilcoxon_p
from providers.base import TulvingError


@dataclass(slots=True)
class Comparison:
    a: str
    b: str
    test: str                    # "paired" | "unpaired"
    get: str
    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    why: str
    p_value: float               # paired: two-sided Wilcoxon; unpaired: one-sided MW, A > B
    p_reverse: float | None = None       # unpaired: B > A
    bootstrap: dict[str, float] | None = None  # BootstrapResult but its distribution
    figure: str | None = None
    notes: list[str] = field(default_factory=list)
    realism: dict[str, RealismSplit] | None = None  # "A: model / mode" -> its realism split

    def text(self, *, realism: bool = True) -> str:
        lines = [f"A: {self.a}  (n={self.n_a}, mean F1 {self.mean_a:.3f})",
                 f"B: {self.b}  (n={self.n_b}, mean F1 {self.mean_b:.3f})",
                 f"questions: '{self.get}'; does A score higher than B? test: {self.test} -- {self.why}"]
        if self.test == "paired":
            lines.append(f"Wilcoxon signed-rank (zero_method 'pratt', two-sided: A and B differ): {p_is(self.p_value)}")
            b = self.bootstrap or {}
            lines.append(f"mean difference A - B = {b.get('mean_difference', 0):+.4f}, "
                         f"{100 * b.get('confidence', 0.95):.0f}% CI [{b.get('ci_low', 0):+.4f}, "
                         f"{b.get('ci_high', 0):+.4f}] (paired percentile bootstrap, "
                         f"{b.get('n_resamples')} resamples, seed {b.get('seed')}; positive: A higher)")
        else:
            lines.append(f"Mann-Whitney U, one-sided, H1 'A scores higher than B': {p_is(self.p_value)} "
                         f"(reverse, 'B higher than A': {p_is(self.p_reverse or 0.0)})")
        lines.append(f"answer: {self.answer()}")
        lines += [f"note: {n}" for n in self.notes]
        if self.realism and realism:
            lines += ["", realism_markdown(self.realism, self.get)]
        return "\n".join(lines)

    def answer(self, alpha: float = 0.05) -> str:
        """The question "does A score higher than B?" answered in words, from
        the bootstrap interval of A - B (paired) or the one-sided tests (unpaired)."""
        if self.test == "paired":
            b = self.bootstrap or {}
            low, high = b.get("ci_low", 0.0), b.get("ci_high", 0.0)
            level = f"{100 * b.get('confidence', 0.95):.0f}%"
            if low > 0:
                return f"yes: A scores higher than B (the {level} CI of A - B lies above 0)"
            if high < 0:
                return f"no: B scores higher than A (the {level} CI of A - B lies below 0)"
            return f"not shown: the {level} CI of A - B contains 0"
        if self.p_value < alpha:
            return f"yes: A scores higher than B (one-sided p < {alpha:g})"
        if (self.p_reverse or 1.0) < alpha:
            return f"no: B scores higher than A (the reverse one-sided p < {alpha:g})"
        return f"not shown: neither one-sided p is below {alpha:g}"


@dataclass(slots=True)
class RealismComparison:
    """One run's realistic against non-realistic questions, per configuration."""

    get: str
    realism: dict[str, RealismSplit]

    def text(self) -> str:
        return realism_markdown(self.realism, self.get)


def _pick(runset: RunSet, selector: str | None, side: str) -> RunKey:
    keys = runset.keys
    if selector:
        chosen = [k for k in keys if selector in (f"{k.model}/{k.mode}", f"{k.model} / {k.mode}", k.model)]
        if len(chosen) != 1:
            raise TulvingError(f"--{side} {selector!r} matches {len(chosen)} of: "
                               + ", ".join(runset.label(k) for k in keys))
        return chosen[0]
    if len(keys) != 1:
        raise TulvingError(f"RUN_{side.upper()} holds {len(keys)} configurations: pick one with "
                           f"--{side} MODEL/MODE (" + ", ".join(f"{k.model}/{k.mode}" for k in keys) + ")")
    return keys[0]


def compare(run_a: Sequence[str | Path], run_b: Sequence[str | Path], *, a: str | None = None,
            b: str | None = None, get: str = "all", resamples: int = 10_000, seed: int = 0,
            out: str | Path | None = None, realism: str | Path | None = None) -> Comparison:
    set_a, set_b = load_runs(run_a), load_runs(run_b)
    key_a, key_b = _pick(set_a, a, "a"), _pick(set_b, b, "b")
    recs_a = [r for r in set_a.groups[key_a] if get == "any" or r.get == get]
    recs_b = [r for r in set_b.groups[key_b] if get == "any" or r.get == get]
    label_a = f"{key_a.model} / {key_a.mode} ({key_a.book}, judge {key_a.judge})"
    label_b = f"{key_b.model} / {key_b.mode} ({key_b.book}, judge {key_b.judge})"
    if not recs_a or not recs_b:
        raise TulvingError(f"no '{get}' questions on one side")
    qa = {r.q_idx: r.question for r in recs_a}
    qb = {r.q_idx: r.question for r in recs_b}
    notes = []
    if key_a.judge != key_b.judge:
        notes.append("the two sides were judged by different judges")
    if key_a.book == key_b.book and qa == qb:
        result = _paired(recs_a, recs_b, (key_a, key_b), (label_a, label_b), get, resamples, seed, out, notes)
    else:
        x = [float(r.f1) for r in recs_a if r.f1 is not None]
        y = [float(r.f1) for r in recs_b if r.f1 is not None]
        why = "different books" if key_a.book != key_b.book else "different question sets"
        result = Comparison(label_a, label_b, "unpaired", get, len(x), len(y), float(np.mean(x)), float(np.mean(y)),
                            why + ": the questions cannot be paired", mann_whitney_greater(x, y),
                            p_reverse=mann_whitney_greater(y, x), notes=notes)
    result.realism = _side_splits(((set_a, key_a, recs_a), (set_b, key_b, recs_b)), get, realism)
    if out is not None:
        _write(result, Path(out))
    return result


def _side_splits(sides: Sequence[tuple[RunSet, RunKey, list[ResultRecord]]], get: str,
                 realism: str | Path | None) -> dict[str, RealismSplit] | None:
    """Each side's realism split ("A: model / mode"), when its chapters are rated."""
    if realism is not None and len({key.book for _, key, _ in sides}) > 1:
        raise TulvingError("--realism rates the chapters of one book, and A and B are on different books: "
                           "compare each run alone (tulving compare RUN --realism FILE)")
    splits = {}
    for side, (runset, key, recs) in zip("AB", sides):
        ratings = find_ratings(realism, runset.runs.get((key.book, key.judge)))
        if ratings is not None:
            splits[f"{side}: {key.model} / {key.mode}"] = realism_split(recs, ratings, get)
    return splits or None


def compare_realism(run: Sequence[str | Path], *, a: str | None = None, get: str = "all",
                    realism: str | Path | None = None, out: str | Path | None = None) -> RealismComparison:
    """The realism ablation of one run (every configuration, or the one `a`
    picks): the ratings of `realism`, else of the run's book folder."""
    runset = load_runs(run)
    keys = [_pick(runset, a, "a")] if a else runset.keys
    if realism is not None and len({k.book for k in keys}) > 1:
        raise TulvingError("--realism rates the chapters of one book, and the run holds several: pick one "
                           "configuration with --a MODEL/MODE")
    splits = {}
    for key in keys:
        ratings = find_ratings(realism, runset.runs.get((key.book, key.judge)))
        if ratings is None:
            raise TulvingError(f"{key.book}: its chapters are not rated: pass --realism FILE (`tulving book "
                               f"realism` writes it), or give RUN_B to compare two runs")
        splits[runset.label(key)] = realism_split(runset.groups[key], ratings, get)
    result = RealismComparison(get, splits)
    if out is not None:
        folder = Path(out)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "compare.json").write_text(json.dumps(asdict(result), indent=1) + "\n")
        (folder / "compare.md").write_text("# Comparison\n\n" + result.text() + "\n")
    return result


def _paired(recs_a: list[ResultRecord], recs_b: list[ResultRecord], keys: tuple[RunKey, RunKey],
            labels: tuple[str, str], get: str, resamples: int, seed: int, out: str | Path | None,
            notes: list[str]) -> Comparison:
    """Wilcoxon and the paired bootstrap on the questions both sides scored (figure when `out`)."""
    f1a = {r.q_idx: r.f1 for r in recs_a}
    f1b = {r.q_idx: r.f1 for r in recs_b}
    both = {q: (fa, fb) for q in f1a if (fa := f1a[q]) is not None and (fb := f1b[q]) is not None}
    common = sorted(both)
    if len(common) < len(f1a):
        notes.append(f"{len(f1a) - len(common)} question(s) with a judge failure on a side left out")
    x = [float(both[q][0]) for q in common]
    y = [float(both[q][1]) for q in common]
    boot = paired_bootstrap(y, x, n_resamples=resamples, seed=seed)  # of mean(x - y): A - B, as the question
    result = Comparison(labels[0], labels[1], "paired", get, len(x), len(y), float(np.mean(x)), float(np.mean(y)),
                        "the same questions on both sides", wilcoxon_p(x, y),
                        bootstrap={k: v for k, v in asdict(boot).items() if k != "distribution"}, notes=notes)
    if out is not None:
        caption = (f"{boot.n_resamples} paired resamples, seed {boot.seed}; "
                   f"{100 * boot.confidence:.0f}% CI [{boot.ci_low:+.4f}, {boot.ci_high:+.4f}]")
        key_a, key_b = keys
        fig = F.bootstrap_differences(Path(out) / "figures", x, y, boot.distribution,
                                      (boot.ci_low, boot.ci_high), ("A: " + key_a.model + " / " + key_a.mode,
                                                                    "B: " + key_b.model + " / " + key_b.mode),
                                      caption)
        result.figure = f"figures/{fig.name}.png"
    return result


def _write(result: Comparison, folder: Path) -> None:
    """compare.json and compare.md (with the figure's link) into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "compare.json").write_text(json.dumps(asdict(result), indent=1) + "\n")
    md = "# Comparison\n\n```\n" + result.text(realism=False) + "\n```\n"
    if result.figure:
        md += f"\n![paired bootstrap]({result.figure})\n"
    if result.realism:  # Markdown of its own, out of the code block
        md += "\n" + realism_markdown(result.realism, result.get) + "\n"
    (folder / "compare.md").write_text(md)
