"""Checks of an imported book against what Tulving already has.

- `same_as_packaged`: the 200- and 20-chapter default books of the release are
  the packaged `synaptic-echoes` / `synaptic-echoes-short`: their files must be
  equal byte for byte (text, chapters, events, meta-events).
- `match_questions`: Tulving's question set of a book (questions.build_questions,
  the procedure the packaged books' sets come from) must be the release's df_qa
  table. Rows are matched by question text (texts are unique within a set);
  every compared field must agree. The match gives, for each df_qa row (the
  number of the answers' files), Tulving's question.

A mismatch is a ReleaseError naming the book and the first differing item.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from engine.benchmark.datadir import published_book_dir
from engine.benchmark.evaluation.questions import Question
from engine.benchmark.generation.bookdir import BOOK_FILES
from engine.benchmark.release.layout import ReleaseError
from engine.benchmark.release.tables import QaRow

# The reference's label of the 3-5 bin (qa_generation.py, filtering_built_qa_func).
_BIN_LABELS = {"{3,4,5}": "3-5"}


def same_as_packaged(name: str, folder: Path) -> None:
    """The imported folder's files equal the packaged book's, byte for byte."""
    packaged = published_book_dir(name)
    for file in BOOK_FILES:
        mine, theirs = (folder / file).read_bytes(), (packaged / file).read_bytes()
        if mine != theirs:
            at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
            raise ReleaseError(f"book {name}: the release's {file} differs from the packaged one at byte {at} "
                               f"(release {mine[at:at + 40]!r}, packaged {theirs[at:at + 40]!r})")


def _fields(q: Question) -> dict[str, object]:
    unordered = q.get == "all"
    return {"template": q.template, "cue": q.cue, "cue_completed": q.cue_completed,
            "retrieval_type": q.retrieval_type, "get": q.get, "bin": q.bin, "n_chapters": q.n_chapters,
            "correct_answer": sorted(q.correct_answer) if unordered else list(q.correct_answer),
            "chapters": sorted(q.chapters) if unordered else list(q.chapters)}


def _row_fields(row: QaRow) -> dict[str, object]:
    # An "all" question's answer and chapters were Python sets: their stored order means nothing.
    unordered = row["get"] == "all"
    answer = [str(x) for x in row["correct_answer"] or []]
    chapters = [int(x) for x in row["correct_answer_chapters"] or []]
    bin_label = str(row["bins_items_correct_answer"])
    return {"template": int(row["q_idx"]), "cue": row["cue"], "cue_completed": row["cue_completed"],
            "retrieval_type": row["retrieval_type"], "get": row["get"], "bin": _BIN_LABELS.get(bin_label, bin_label),
            "n_chapters": int(row["n_chapters_correct_answer"]),
            "correct_answer": sorted(answer) if unordered else answer,
            "chapters": sorted(chapters) if unordered else chapters}


def match_questions(name: str, questions: Sequence[Question], rows: Sequence[QaRow]) -> list[Question]:
    """For each df_qa row, Tulving's equal question (see the module docstring)."""
    if len(questions) != len(rows):
        raise ReleaseError(f"book {name}: Tulving builds {len(questions)} questions, the release's df_qa "
                           f"has {len(rows)}")
    by_text = {q.question: q for q in questions}
    matched = []
    for i, row in enumerate(rows):
        q = by_text.get(row["question"])
        if q is None:
            raise ReleaseError(f"book {name}: df_qa row {i} is not in Tulving's question set: {row['question']!r}")
        ours, theirs = _fields(q), _row_fields(row)
        for key, value in theirs.items():
            if ours[key] != value:
                raise ReleaseError(f"book {name}: df_qa row {i} ({row['question'][:60]!r}...) {key}: "
                                   f"release {value!r}, Tulving {ours[key]!r}")
        matched.append(q)
    return matched
