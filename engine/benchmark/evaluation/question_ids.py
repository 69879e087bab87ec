"""Stable question ids, and the digests that name a book and its question set.

A question's id is `q{q_idx:04d}-{digest}`, e.g. `q0042-3f9a0c1be2`: its
position in the set (results.jsonl's `q_idx`), then the first 10 hex digits
of the SHA-256 of

    {"book": SHA-256 of the book's text, "chapters": [...], "correct_answer": [...],
     "question": "..."}

(JSON, keys sorted, no spaces, UTF-8). The same book and question-building
procedure always give the same ids, on any machine; an answer written for
another book (another text: a rewrite of the same events too), another
version of the question set (other ground truth) or another position is
refused by `tulving score`, since its id names no question of this set.
`tulving questions --book B --ids` prints them.

`book_sha256(book)` and `questions_sha256(questions)` are the full digests
that a bundle records: the book by its text, the question set by the JSON
Lines `tulving questions` writes (one `Question.to_json()` per line, keys
sorted).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence

from engine.benchmark.evaluation.questions import Question
from engine.benchmark.generation.bookdir import Book

ID_DIGITS = 10
# The keys of a Question, as results lines and bundle records hold them.
QUESTION_KEYS = ("question", "template", "cue", "cue_completed", "retrieval_type", "get", "correct_answer",
                 "chapters", "n_chapters", "bin", "q_idx")


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _canonical(data: object) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def book_sha256(book: Book) -> str:
    """SHA-256 of the book's text (book.txt as read, UTF-8)."""
    return _sha256(book.text)


def questions_sha256(questions: Iterable[Question]) -> str:
    """SHA-256 of the question set, one canonical JSON line per question."""
    return _sha256("".join(_canonical(q.to_json()) + "\n" for q in questions))


def question_id(question: Question, book_digest: str) -> str:
    """The id of `question` in the set of the book whose text digests to `book_digest`."""
    body = {"book": book_digest, "question": question.question, "correct_answer": list(question.correct_answer),
            "chapters": list(question.chapters)}
    return f"q{question.q_idx:04d}-{_sha256(_canonical(body))[:ID_DIGITS]}"


def question_ids(questions: Sequence[Question], book: Book) -> dict[str, Question]:
    """Every question of the set by its id, in set order."""
    digest = book_sha256(book)
    return {question_id(q, digest): q for q in questions}


def question_of(record: object) -> Question:
    """The question of a results record (a ResultRecord, or its JSON line)."""
    if isinstance(record, Mapping):
        return Question.from_json({k: record.get(k) for k in QUESTION_KEYS})
    return Question.from_json({k: getattr(record, k) for k in QUESTION_KEYS})
