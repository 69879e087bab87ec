"""Generation statistics (the paper's appendix tables), from a book and its
generation log.

- per iteration k (= candidate k): events still without a chapter that got a
  candidate k, how many failed the exact checks, the LLM check (or errored),
  and the valid chapters so far;
- chapter counts by number of paragraphs, style, number of secondary entities;
- how many dates / locations / entities / contents appear in 1, 2, 3-5, 6+
  chapters (tab:geometric_actual: counted over the chapters);
- positions of the four items relative to the book, the chapter and the
  paragraph: a PNG when matplotlib is importable, else text histograms.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NotRequired, TypedDict

from engine.benchmark.generation.bookdir import Book, CandidateLog, Item
from engine.benchmark.generation.checks import item_values

ITEMS: tuple[Item, ...] = ("date", "location", "entity", "content")
BINS = ("1", "2", "3-5", "6+")
LEVELS = ("book", "chapter", "paragraph")
N_HIST_BINS = 10


def read_log(path: str | Path) -> list[CandidateLog]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


class IterationRow(TypedDict):
    """One draw of the generation: how its candidates fared."""

    iteration: int
    remaining: int
    failed_exact: int
    failed_llm: int
    errors: int
    valid_so_far: int
    n_events: int


class BookStats(TypedDict):
    """stats.json of a book."""

    book: str
    n_events: int
    n_chapters: int
    n_tokens: int
    iterations: list[IterationRow]
    paragraphs: dict[int, int]
    styles: dict[str, int]
    secondary_entities: dict[int, int]
    repetitions: dict[str, dict[str, int]]
    positions: dict[str, dict[str, list[int]]]
    positions_plot: NotRequired[str]  # written by write_stats


def iteration_table(log: Sequence[CandidateLog], n_events: int) -> list[IterationRow]:
    if not log:
        return []
    rows: list[IterationRow] = []
    valid_so_far = 0
    for k in range(max(r["draw"] for r in log) + 1):
        at_k = [r for r in log if r["draw"] == k]
        exact = sum(r["outcome"] == "failed_exact" for r in at_k)
        llm = sum(r["outcome"] == "failed_llm" for r in at_k)
        errors = sum(r["outcome"] == "error" for r in at_k)  # calls that failed for good
        valid_so_far += sum(r["outcome"] == "valid" for r in at_k)
        rows.append({"iteration": k, "remaining": len(at_k), "failed_exact": exact, "failed_llm": llm,
                     "errors": errors, "valid_so_far": valid_so_far, "n_events": n_events})
    return rows


def repetition_bins(values: Iterable[str]) -> dict[str, int]:
    counts = Counter(values).values()
    return {"1": sum(c == 1 for c in counts), "2": sum(c == 2 for c in counts),
            "3-5": sum(3 <= c <= 5 for c in counts), "6+": sum(c >= 6 for c in counts)}


def item_positions(book: Book) -> dict[str, dict[str, list[float]]]:
    """Relative position (0..1) of the first occurrence of each item."""
    out: dict[str, dict[str, list[float]]] = {item: {level: [] for level in LEVELS} for item in ITEMS}
    offset = 0
    total = max(1, len(book.text))
    for k, (body, chapter) in enumerate(zip(book.chapter_texts, book.chapters), start=1):
        offset += len(f"Chapter {k}\n\n")
        lowered = body.lower()
        paragraph_starts = []
        start = 0
        for paragraph in body.split("\n\n"):
            paragraph_starts.append((start, len(paragraph)))
            start += len(paragraph) + 2
        for item, value in item_values(chapter).items():
            pos = lowered.find(value.lower())
            if pos < 0:
                continue
            out[item]["book"].append((offset + pos) / total)
            out[item]["chapter"].append(pos / max(1, len(body)))
            p_start, p_len = next((s, n) for s, n in reversed(paragraph_starts) if s <= pos)
            out[item]["paragraph"].append((pos - p_start) / max(1, p_len))
        offset += len(body) + 3
    return out


def histogram(values: Sequence[float], bins: int = N_HIST_BINS) -> list[int]:
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int(v * bins))] += 1
    return counts


def compute_stats(book: Book, log: Sequence[CandidateLog] = ()) -> BookStats:
    chapters = book.chapters
    positions = item_positions(book)
    return {
        "book": book.name,
        "n_events": len(book.events),
        "n_chapters": len(chapters),
        "n_tokens": book.n_tokens,
        "iterations": iteration_table(log, len(book.events)),
        "paragraphs": dict(sorted(Counter(c["nb_paragraphs"] for c in chapters).items())),
        "styles": dict(sorted(Counter(c["style"] for c in chapters).items())),
        "secondary_entities": dict(sorted(Counter(len(c["secondary_entities"]) for c in chapters).items())),
        "repetitions": {item: repetition_bins(c[item] for c in chapters) for item in ITEMS},
        "positions": {item: {level: histogram(positions[item][level]) for level in LEVELS} for item in ITEMS},
    }


def format_stats(stats: BookStats) -> str:
    lines = [f"{stats['book']}: {stats['n_chapters']} chapters from {stats['n_events']} events, "
             f"{stats['n_tokens']} tokens", ""]
    if stats["iterations"]:
        with_errors = any(r["errors"] for r in stats["iterations"])
        lines.append("iteration  remaining  fail exact  fail LLM  valid so far" + ("  errors" if with_errors else ""))
        for r in stats["iterations"]:
            lines.append(f"{r['iteration']:>9}  {r['remaining']:>9}  {r['failed_exact']:>10}  {r['failed_llm']:>8}"
                         f"  {r['valid_so_far']:>6}/{r['n_events']}" + (f"  {r['errors']:>6}" if with_errors else ""))
        lines.append("")
    counted: tuple[tuple[str, dict[int, int] | dict[str, int]], ...] = (
        ("paragraphs", stats["paragraphs"]), ("style", stats["styles"]),
        ("secondary entities", stats["secondary_entities"]))
    for title, tally in counted:
        lines.append(f"{title}: " + ", ".join(f"{k}: {v}" for k, v in tally.items()))
    lines += ["", "repetitions   " + "  ".join(f"{b:>4}" for b in BINS)]
    for item in ITEMS:
        lines.append(f"{item:<12}  " + "  ".join(f"{stats['repetitions'][item][b]:>4}" for b in BINS))
    lines += ["", f"item positions ({N_HIST_BINS} bins from start to end)"]
    for level in LEVELS:
        for item in ITEMS:
            counts = stats["positions"][item][level]
            peak = max(counts) or 1
            bar = "".join(" .:-=+*#%@"[min(9, round(9 * c / peak))] for c in counts)
            lines.append(f"{level:<9} {item:<8} |{bar}| {counts}")
    return "\n".join(lines)


def plot_positions(book: Book, path: str | Path) -> bool:
    """Write the position histograms as a PNG; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    positions = item_positions(book)
    fig, axes = plt.subplots(len(LEVELS), 1, figsize=(7, 8))
    for ax, level in zip(axes, LEVELS):
        for item in ITEMS:
            ax.hist(positions[item][level], bins=N_HIST_BINS, range=(0, 1), histtype="step", label=item)
        ax.set_title(f"position relative to the {level}")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def write_stats(book: Book, folder: str | Path) -> tuple[BookStats, str]:
    """Compute, save stats.json (and positions.png if possible) in `folder`;
    returns (stats, printable text)."""
    folder = Path(folder)
    log = read_log(folder / "generation_log.jsonl")
    stats = compute_stats(book, log)
    png = plot_positions(book, folder / "positions.png")
    stats["positions_plot"] = "positions.png" if png else "text histograms (matplotlib not installed)"
    (folder / "stats.json").write_text(json.dumps(stats, indent=1) + "\n", encoding="utf-8")
    return stats, format_stats(stats) + f"\npositions plot: {stats['positions_plot']}"
