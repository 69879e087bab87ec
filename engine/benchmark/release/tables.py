"""The release's parquet tables, read with pyarrow (the optional `release` extra).

The reference wrote them with pandas (`DataFrame.to_parquet`, pyarrow engine:
epbench/src/generation/benchmark_generation_wrapper.py). Only pyarrow is
needed to read them back: each table becomes a list of plain rows (dicts of
Python values). Sets the reference stored (`correct_answer` of an "all"
question, `post_entities`) come back as lists in the order pyarrow stored them;
`correct_answer_detailed` is a `str()` of a dict (the reference's own
workaround to store it) and is not needed here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from engine.benchmark.release.layout import ReleaseError

INSTALL_HINT = "reading the release's parquet tables needs pyarrow: pip install 'tulving-bench[release]'"


class GroundTruthRow(TypedDict):
    """A row of df_book_groundtruth.parquet (generate_4_books.py, build_chapter)."""

    chapter: int
    date: str
    location: str
    entity: str
    content: str
    post_entities: list[str]
    raw_generated_paragraph_idx: int


class QaRow(TypedDict, total=False):
    """The columns of a df_qa.parquet row that Tulving compares (qa_generation.py, build_qa_func)."""

    q_idx: int                      # the template index
    bins_items_correct_answer: str  # '0', '1', '2', '{3,4,5}', '6+'
    question: str
    cue: str
    cue_completed: str
    retrieval_type: str
    get: str
    correct_answer: list[str]
    correct_answer_chapters: list[int]
    n_chapters_correct_answer: int


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A parquet file's rows; a clear error for a missing pyarrow or a damaged file."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ReleaseError(INSTALL_HINT) from None
    if not path.is_file():
        raise ReleaseError(f"{path}: missing (the release's book folders each hold it)")
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:  # pyarrow.ArrowInvalid is a ValueError
        raise ReleaseError(f"{path}: not a readable parquet file ({str(exc).splitlines()[0]})") from None
    rows: list[dict[str, Any]] = table.to_pylist()
    return rows


def _require(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...]) -> None:
    if not rows:
        raise ReleaseError(f"{path}: no rows")
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise ReleaseError(f"{path}: unknown layout: no column {', '.join(missing)}")


def read_groundtruth(path: Path) -> list[GroundTruthRow]:
    """df_book_groundtruth, in chapter order."""
    rows = read_rows(path)
    _require(path, rows, tuple(GroundTruthRow.__annotations__))
    out = [GroundTruthRow(chapter=int(r["chapter"]), date=r["date"], location=r["location"], entity=r["entity"],
                          content=r["content"], post_entities=list(r["post_entities"] or []),
                          raw_generated_paragraph_idx=int(r["raw_generated_paragraph_idx"])) for r in rows]
    out.sort(key=lambda r: r["chapter"])
    if [r["chapter"] for r in out] != list(range(1, len(out) + 1)):
        raise ReleaseError(f"{path}: chapters are not numbered 1..{len(out)}")
    return out


def read_qa(path: Path) -> list[QaRow]:
    """df_qa, in row order (the order the answers' file numbers follow)."""
    rows = read_rows(path)
    columns = ("q_idx", "question", "cue", "cue_completed", "retrieval_type", "get", "correct_answer",
               "correct_answer_chapters", "n_chapters_correct_answer", "bins_items_correct_answer")
    _require(path, rows, columns)
    return [QaRow(**{c: r[c] for c in columns}) for r in rows]  # type: ignore[typeddict-item]
