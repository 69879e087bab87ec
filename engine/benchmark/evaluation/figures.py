"""The report's figures (matplotlib, Agg backend), each written as PNG and SVG.

- `f1_by_bin`: mean F1 (± sd) by bin per configuration, the paper's main figure;
- `cue_heatmaps`: mean F1 by cue type x configuration, one panel per bin;
- `cd_diagram`: the critical-difference diagram (average ranks on an axis,
  groups not significantly different as bars), from statistics.rank_runs;
- `bootstrap_differences`: paired bootstrap mean differences (Gardner-Altman style);
- `agreement_scatter`: two judges' F1 on the same answers;
- `item_positions`: where the four items first appear in the book, chapter, paragraph;
- `entity_track`: one entity's chapters through the book with their dates and places.

Each function takes plain data and returns a `Figure` (name, title, the PNG
bytes) after writing `<name>.png` and `<name>.svg` into the folder; the HTML
report inlines the PNG as a data URI. No library draws CD diagrams in the
paper's style from precomputed cliques, so `cd_diagram` lays it out itself:
one axis of ranks, each run a tick with an elbow line to its label (best
half on the left), each clique a thick bar under the axis.
"""
from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from engine.benchmark.evaluation.tables import visible_controls
from engine.benchmark.generation.bookdir import Book, ChapterRecord
from engine.benchmark.generation.stats import ITEMS, LEVELS, N_HIST_BINS
from engine.benchmark.generation.stats import item_positions as positions_of

if TYPE_CHECKING:  # matplotlib is optional (the plots extra): imported when a figure is drawn
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure as MplFigure
    from matplotlib.transforms import Bbox


@dataclass(frozen=True, slots=True)
class Figure:
    name: str      # file stem in figures/
    title: str
    png: bytes
    caption: str = ""


def _plt() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Reproducible SVG ids; no mathtext: a "$" in a model name or answer is a dollar sign, not TeX.
    plt.rcParams.update({"svg.hashsalt": "tulving", "font.size": 9, "text.parse_math": False})
    return plt


def _t(text: object) -> str:
    """Text from a run (model names, judges, places) as drawn: control characters as \\xNN."""
    return visible_controls(str(text))


def _save(fig: MplFigure, folder: Path, name: str, title: str, caption: str = "") -> Figure:
    """Write `fig` as `name`.png (100 dpi) and .svg, both cropped to the same tight box.

    savefig(bbox_inches="tight") draws the figure once more to measure it, for
    each file; the box is measured here once (as savefig measures it: on the
    PNG's renderer, padded by savefig.pad_inches) and given to both saves."""
    plt = _plt()
    folder.mkdir(parents=True, exist_ok=True)
    box = _tight_box(fig, dpi=100)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches=box)
    png = buf.getvalue()
    (folder / f"{name}.png").write_bytes(png)
    fig.savefig(folder / f"{name}.svg", format="svg", bbox_inches=box, metadata={"Date": None})
    plt.close(fig)
    return Figure(name=name, title=title, png=png, caption=caption)


def _tight_box(fig: MplFigure, dpi: float) -> Bbox:
    """The box savefig(bbox_inches="tight", dpi=dpi) would crop a PNG to, in inches:
    the figure laid out (ticks, text) on the Agg renderer without rasterizing,
    measured, padded by savefig.pad_inches."""
    import matplotlib

    fig.set_dpi(dpi)
    fig.draw_without_rendering()
    pad = matplotlib.rcParams["savefig.pad_inches"]
    return fig.get_tightbbox().padded(pad, pad)


def f1_by_bin(folder: Path, series: Mapping[str, Mapping[str, tuple[float, float]]], bins: Sequence[str],
              name: str = "f1_by_bin", title: str = "F1 by number of matching events",
              published: Mapping[str, Mapping[str, float]] | None = None) -> Figure:
    """The paper's main figure, written as `name`.png and .svg (see `f1_by_bin_figure`)."""
    return _save(f1_by_bin_figure(series, bins, title, published), folder, name, title)


def f1_by_bin_figure(series: Mapping[str, Mapping[str, tuple[float, float]]], bins: Sequence[str], title: str,
                     published: Mapping[str, Mapping[str, float]] | None = None) -> MplFigure:
    """`series`: label -> bin -> (mean, sd). One line with sd error bars per
    label; `published` (label -> bin -> mean, the paper's rows for this book)
    as thin grey dashed lines behind them, each named in the right margin at
    a height of its own (a leader line to its end: labels never overlap).
    The legend goes under the axes, where it can hide no point."""
    plt = _plt()
    fig: MplFigure
    fig, ax = plt.subplots(figsize=(9, 5))
    x = np.arange(len(bins))
    ends: list[tuple[float, float, str]] = []   # (x, y) of each published line's last point, its label
    for i, (label, per_bin) in enumerate((published or {}).items()):
        ys = [per_bin.get(b, np.nan) for b in bins]
        ax.plot(x, ys, color="0.65", linestyle="--", linewidth=0.8, zorder=1,
                label="published (paper), named on the right" if i == 0 else None)
        last = max((j for j, y in enumerate(ys) if not np.isnan(y)), default=None)
        if last is not None:
            ends.append((float(x[last]), float(ys[last]), _t(label)))
    _name_ends(ax, ends, right=len(bins) - 1 + 0.25)
    n = max(1, len(series))
    for i, (label, stats) in enumerate(series.items()):
        shift = (i - (n - 1) / 2) * 0.06
        points = [stats.get(b, (np.nan, np.nan)) for b in bins]
        ax.errorbar(x + shift, [m for m, _ in points], yerr=[s for _, s in points], marker="o", capsize=3,
                    label=_t(label), zorder=3)
    ax.set_xticks(x, bins)
    ax.set_xlim(-0.3, len(bins) - 1 + (1.6 if ends else 0.3))
    ax.set_xlabel("matching events (bin)")
    ax.set_ylabel("F1 (mean ± sd)")
    ax.set_ylim(-0.05, 1.1)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    ax.set_title(title)
    return fig


def _name_ends(ax: Axes, ends: list[tuple[float, float, str]], right: float, gap: float = 0.045) -> None:
    """Labels at x = `right`, one per line end, spread to at least `gap`
    apart (data units) within the y axis, each joined to its end."""
    if not ends:
        return
    order = sorted(range(len(ends)), key=lambda i: ends[i][1])
    ys = [ends[i][1] for i in order]
    for k in range(1, len(ys)):  # push up what is too close to the one below
        ys[k] = max(ys[k], ys[k - 1] + gap)
    top = 1.08
    for k in range(len(ys) - 1, -1, -1):  # then down from the top what went past it
        ys[k] = min(ys[k], top - (len(ys) - 1 - k) * gap, ys[k + 1] - gap if k + 1 < len(ys) else top)
    for k, i in enumerate(order):
        x_end, y_end, label = ends[i]
        ax.plot([x_end, right - 0.03], [y_end, ys[k]], color="0.8", linewidth=0.5, zorder=1)
        ax.text(right, ys[k], label, fontsize=6.5, color="0.35", va="center")


def cue_heatmaps(folder: Path, cells: Mapping[str, Mapping[tuple[str, str], float]], cues: Sequence[str],
                 labels: Sequence[str]) -> Figure:
    """`cells`: bin -> (cue, label) -> mean F1. One heatmap per bin."""
    plt = _plt()
    bins = list(cells)
    fig, axes = plt.subplots(1, len(bins), figsize=(2.2 + 1.1 * len(labels) * len(bins), 0.8 + 0.28 * len(cues)),
                             squeeze=False, sharey=True)
    image = None
    for ax, b in zip(axes[0], bins):
        grid = np.array([[cells[b].get((c, lab), np.nan) for lab in labels] for c in cues], dtype=float)
        image = ax.imshow(np.ma.masked_invalid(grid), vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_title(f"bin {b}")
        ax.set_xticks(range(len(labels)), [_t(lab) for lab in labels], rotation=60, ha="right", fontsize=7)
        ax.set_yticks(range(len(cues)), [_t(c) for c in cues], fontsize=7)
        for (i, j), v in np.ndenumerate(grid):
            if not np.isnan(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                        color="white" if v < 0.5 else "black")
    if image is not None:
        fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="mean F1")
    return _save(fig, folder, "f1_heatmap_cue", "F1 by cue type and configuration, per bin")


def cd_diagram(folder: Path, average_ranks: Mapping[str, float], cliques: Sequence[Sequence[str]],
               n_questions: int, name: str = "cd_diagram", subtitle: str = "") -> Figure:
    """Average ranks on an axis (1 = best, left), runs joined to their label by
    an elbow line, cliques of runs not significantly different as bars."""
    plt = _plt()
    names = list(average_ranks)  # best first
    k = len(names)
    lo, hi = 1, max(k, 2)
    left = names[: (k + 1) // 2]
    right = names[(k + 1) // 2:]
    rows = max(len(left), len(right))
    fig, ax = plt.subplots(figsize=(8, 1.4 + 0.3 * rows + 0.2 * len(cliques)))
    ax.set_xlim(lo - 0.8, hi + 0.8)
    ax.set_ylim(-(rows + 1.2 + 0.4 * len(cliques)), 1.2)
    ax.axis("off")
    ax.hlines(0, lo, hi, color="black", linewidth=1)
    for r in range(lo, hi + 1):
        ax.vlines(r, 0, 0.15, color="black", linewidth=1)
        ax.text(r, 0.3, str(r), ha="center", va="bottom")
    for i, run in enumerate(left):
        x, y = average_ranks[run], -(i + 1) * 0.6
        ax.plot([x, x, lo - 0.5], [0, y, y], color="black", linewidth=0.8)
        ax.text(lo - 0.55, y, f"{_t(run)} ({x:.2f})", ha="right", va="center", fontsize=8)
    for i, run in enumerate(reversed(right)):
        x, y = average_ranks[run], -(i + 1) * 0.6
        ax.plot([x, x, hi + 0.5], [0, y, y], color="black", linewidth=0.8)
        ax.text(hi + 0.55, y, f"({x:.2f}) {_t(run)}", ha="left", va="center", fontsize=8)
    for j, group in enumerate(cliques):
        ranks = [average_ranks[g] for g in group]
        y = -0.15 - 0.18 * j
        ax.hlines(y, min(ranks) - 0.03, max(ranks) + 0.03, color="tab:red", linewidth=4)
    title = f"Critical difference{_t(subtitle)}: average rank over {n_questions} questions"
    ax.set_title(title + "\n(bars: no significant difference, Wilcoxon-Holm, alpha 0.05)", fontsize=9)
    return _save(fig, folder, name, title)


def bootstrap_differences(folder: Path, a: Sequence[float], b: Sequence[float], diffs: Sequence[float],
                          ci: tuple[float, float], labels: tuple[str, str], caption: str) -> Figure:
    """Gardner-Altman: both configurations' F1 (left) and the bootstrap
    distribution of the mean difference a - b with its CI (right), as
    `tulving compare` asks "does A score higher than B?"."""
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 4), gridspec_kw={"width_ratios": [2, 1]})
    rng = np.random.default_rng(0)  # jitter only
    for i, values in enumerate((a, b)):
        ax1.scatter(i + rng.uniform(-0.15, 0.15, len(values)), values, s=6, alpha=0.4)
        ax1.hlines(float(np.mean(values)), i - 0.25, i + 0.25, color="black")
    ax1.set_xticks([0, 1], [_t(labels[0]), _t(labels[1])], fontsize=7)
    ax1.set_ylabel("F1 per question")
    ax2.hist(diffs, bins=40, orientation="horizontal", color="tab:gray", alpha=0.7)
    mean = float(np.mean(a) - np.mean(b))
    ax2.axhline(mean, color="black")
    ax2.axhspan(ci[0], ci[1], color="tab:blue", alpha=0.2)
    ax2.axhline(0, color="tab:red", linestyle=":")
    ax2.set_ylabel("mean difference (A - B; above 0: A higher)")
    ax2.set_xlabel("bootstrap resamples")
    fig.suptitle("Paired bootstrap of the mean F1 difference")
    return _save(fig, folder, "bootstrap_differences", "Paired bootstrap of the mean F1 difference", caption)


def bootstrap_forest(folder: Path, rows: Sequence[tuple[str, float, float, float]], reference: str,
                     caption: str, name: str = "bootstrap_vs_best") -> Figure:
    """Mean F1 difference (run - reference) with its bootstrap CI, one row per run."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.35 * max(1, len(rows))))
    for i, (_label, mean, low, high) in enumerate(rows):
        ax.errorbar([mean], [i], xerr=[[mean - low], [high - mean]], fmt="o", color="tab:blue", capsize=3)
    ax.axvline(0, color="tab:red", linestyle=":")
    ax.set_yticks(range(len(rows)), [_t(r[0]) for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"mean F1 difference vs {_t(reference)}")
    title = f"Paired bootstrap: each run minus {_t(reference)}"
    ax.set_title(title, fontsize=9)
    return _save(fig, folder, name, title, caption)


def agreement_scatter(folder: Path, x: Sequence[float], y: Sequence[float], labels: tuple[str, str],
                      name: str = "judge_agreement", subtitle: str = "") -> Figure:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    rng = np.random.default_rng(0)  # jitter so that identical pairs stay visible
    ax.scatter(np.asarray(x) + rng.uniform(-0.01, 0.01, len(x)), np.asarray(y) + rng.uniform(-0.01, 0.01, len(y)),
               s=8, alpha=0.4)
    ax.plot([0, 1], [0, 1], color="tab:red", linestyle=":")
    ax.set_xlabel(f"F1, judge {_t(labels[0])}")
    ax.set_ylabel(f"F1, judge {_t(labels[1])}")
    title = "Judge agreement per question" + (f": {_t(subtitle)}" if subtitle else "")
    ax.set_title(title, fontsize=8)
    return _save(fig, folder, name, title)


def item_positions(folder: Path, book: Book) -> Figure:
    """Relative position of each item's first mention in the book, chapter and paragraph."""
    plt = _plt()
    positions = positions_of(book)
    fig, axes = plt.subplots(1, len(LEVELS), figsize=(10, 3))
    for ax, level in zip(axes, LEVELS):
        for item in ITEMS:
            ax.hist(positions[item][level], bins=N_HIST_BINS, range=(0, 1), histtype="step", label=item)
        ax.set_title(f"relative to the {level}")
    axes[0].legend(fontsize=7)
    return _save(fig, folder, "item_positions", f"Positions of the items in {book.name}")


def entity_track(folder: Path, book: Book, entity: str | None = None) -> Figure:
    """The chapters of one entity (default: the one in most chapters): chapter
    number against story date, each point labelled with its place."""
    import datetime as dt

    plt = _plt()
    counts: dict[str, int] = {}
    for c in book.chapters:
        counts[c["entity"]] = counts.get(c["entity"], 0) + 1
    entity = entity or max(sorted(counts), key=lambda e: counts[e])
    chapters = [c for c in book.chapters if c["entity"] == entity]

    def date(c: ChapterRecord) -> dt.date | None:
        try:
            return dt.datetime.strptime(c["date"], "%B %d, %Y").date()
        except (KeyError, ValueError):
            return None

    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = [c["chapter"] for c in chapters]
    ys = [date(c) for c in chapters]
    ax.plot(xs, ys, marker="o", linestyle="-", color="tab:blue")
    for c, x, y in zip(chapters, xs, ys):
        ax.annotate(_t(c.get("location", "")), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=6)
    ax.set_xlim(0, len(book.chapters) + 1)
    ax.set_xlabel("chapter")
    ax.set_ylabel("story date")
    title = f"{_t(entity)}: {len(chapters)} chapters of {_t(book.name)} (dates and places)"
    ax.set_title(title)
    fig.autofmt_xdate()
    return _save(fig, folder, "entity_track", title)


def accuracy_against_cost(folder: Path, points: Sequence[tuple[str, float, float]],
                          name: str = "accuracy_cost", title: str = "Simple Recall against cost") -> Figure:
    """`points`: (label, USD per question, Simple Recall) per configuration:
    what the answers and the memory system's own calls cost at list prices
    (a symmetric-log axis, so that free local runs sit at 0 beside paid ones)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, usd, score in points:
        ax.scatter([usd], [score], s=24)
        ax.annotate(_t(label), (usd, score), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xscale("symlog", linthresh=1e-4)
    ax.set_xlabel("USD per question at list prices (answer + memory system calls)")
    ax.set_ylabel("Simple Recall")
    ax.set_ylim(-0.05, 1.05)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    return _save(fig, folder, name, title, "Each point a configuration (model / memory system); up and left is better.")
