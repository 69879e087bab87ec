"""The question set of a book (protocol.md, "Questions"), and its JSON Lines file.

`build_questions(book)` gives exactly the published selection: 686 questions
on the long default book, 456 on the short one. Steps, each as the published
procedure did them:

1. Non-empty questions: `random.seed(1)`, chapters in the order
   `random.sample(range(1, n+1), n)`, all 36 templates filled with each
   chapter's (t, s, e, c). (Each seeded draw uses its own `random.Random`,
   which gives the same numbers as the global generator without touching it.)
2. Empty questions: `random.seed(2)`, chapters in a sampled order; then each
   chapter gets a set of changed fields and an inner/outer flag (seed 2
   again for each draw). The changed fields are replaced (under
   `random.seed(chapter)`) by another value of the book (inner) or by an
   unused value of the universe (outer); only the templates whose cue then
   matches no chapter are kept.
3. Both sets together, repeated question texts dropped (first kept).
4. Bins by the number of matching chapters (0, 1, 2, 3-5, 6+); in each
   (template, bin) the 5 questions whose filled cue sorts first are kept.

Books with more than 200 chapters: the published procedure sampled at most
200 chapters (2000 for books of more than 1000 events), and used only inner
replacements for books of more than 1000 events. Both are kept here.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import random
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from engine.benchmark.evaluation.templates import (
    CONTENTS,
    ENTITIES,
    FIELDS,
    FULL_DETAILS,
    OTHER_ENTITIES,
    SPACES,
    TEMPLATES,
    TIMES,
    Template,
)
from engine.benchmark.generation.bookdir import Book, ChapterRecord, Item
from engine.benchmark.generation.published import load_book
from engine.benchmark.generation.universe import load_universe  # the generation side owns the universe
from providers.base import TulvingError

BINS = ("0", "1", "2", "3-5", "6+")
PER_TEMPLATE_AND_BIN = 5
SEED_NON_EMPTY = 1
SEED_EMPTY = 2
DATE_FORMAT = "%B %d, %Y"

_TRACE_FIELD: dict[str, Item] = {TIMES: "date", SPACES: "location", ENTITIES: "entity", CONTENTS: "content"}


class QuestionsError(TulvingError):
    """A questions file or a book that questions cannot be built from."""


@dataclass(slots=True)
class Question:
    """One benchmark question and its ground truth.

    `correct_answer` is the list of ground-truth items: for 'all' the distinct
    trace values in chapter order, for 'chronological' the trace value of each
    matching chapter in story-time order (repeats kept), for 'latest' the last
    of those. For 'Full event details' it is ["Full chapter {k}"]: the judge is
    shown chapter k's text instead. `chapters` are the matching chapter
    numbers (story-time order for latest/chronological), `n_chapters` their
    count (also for 'latest', whose answer has one item).
    """

    question: str
    template: int
    cue: str
    cue_completed: str
    retrieval_type: str
    get: str
    correct_answer: list[str]
    chapters: list[int]
    n_chapters: int
    bin: str
    q_idx: int = -1

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> Question:
        if not isinstance(data, dict):
            raise ValueError("a question is a JSON object")
        missing = [f for f in _FIELDS if f not in data]
        if missing:
            raise ValueError(f"missing key(s) {', '.join(missing)}")
        q = cls(**{f: data[f] for f in _FIELDS})
        _check(q)
        return q


_FIELDS = ("question", "template", "cue", "cue_completed", "retrieval_type", "get", "correct_answer",
           "chapters", "n_chapters", "bin", "q_idx")


def _check(q: Question) -> None:
    if not isinstance(q.question, str) or not q.question:
        raise ValueError("'question' must be a non-empty string")
    if not isinstance(q.template, int) or not 0 <= q.template < len(TEMPLATES):
        raise ValueError(f"'template' must be an integer 0..{len(TEMPLATES) - 1}")
    if q.get not in ("all", "latest", "chronological"):
        raise ValueError(f"'get' must be all, latest or chronological, not {q.get!r}")
    if q.bin not in BINS:
        raise ValueError(f"'bin' must be one of {', '.join(BINS)}, not {q.bin!r}")
    if not isinstance(q.correct_answer, list) or not all(isinstance(x, str) for x in q.correct_answer):
        raise ValueError("'correct_answer' must be a list of strings")
    if not isinstance(q.chapters, list) or not all(isinstance(x, int) for x in q.chapters):
        raise ValueError("'chapters' must be a list of chapter numbers")
    if not isinstance(q.n_chapters, int) or q.n_chapters < 0:
        raise ValueError("'n_chapters' must be a non-negative integer")
    if not isinstance(q.q_idx, int):
        raise ValueError("'q_idx' must be an integer")


def bin_of(n_chapters: int) -> str:
    """The bin of a question by its number of matching chapters."""
    if n_chapters < 0:
        raise ValueError("negative chapter count")
    if n_chapters <= 2:
        return str(n_chapters)
    return "3-5" if n_chapters <= 5 else "6+"


# -- ground truth -----------------------------------------------------------------
class ChapterIndex:
    """The chapters by field value, so that a cue's matches are found fast."""

    def __init__(self, chapters: Sequence[ChapterRecord]):
        self.chapters = list(chapters)
        self.by_value: dict[tuple[str, str], list[ChapterRecord]] = {}
        for ch in self.chapters:
            for name in FIELDS:
                self.by_value.setdefault((name, ch[name]), []).append(ch)

    def matching(self, template: Template, values: Sequence[str]) -> list[ChapterRecord]:
        """The chapters matching the template's cue filled with values, in chapter order."""
        fixed = [(name, v) for f, name, v in zip(template.fixed, FIELDS, values) if f]
        if not fixed:
            return list(self.chapters)
        pools = sorted((self.by_value.get(key, []) for key in fixed), key=len)
        return [ch for ch in pools[0] if all(ch[name] == v for name, v in fixed)]


def _index(chapters: Sequence[ChapterRecord] | ChapterIndex) -> ChapterIndex:
    return chapters if isinstance(chapters, ChapterIndex) else ChapterIndex(chapters)


@lru_cache(maxsize=4096)
def _parse_date(text: str) -> dt.date:
    return dt.datetime.strptime(text, DATE_FORMAT).date()


def _story_date(chapter: ChapterRecord) -> dt.date:
    return _parse_date(chapter["date"])


def ground_truth(chapters: Sequence[ChapterRecord] | ChapterIndex, template: Template,
                 values: Sequence[str]) -> tuple[list[str], list[int]]:
    """(correct_answer, matching chapter numbers) of a template filled with
    values = (t, s, e, c), over the book's chapter ground truth."""
    matching = _index(chapters).matching(template, values)
    rtype = template.retrieval_type
    if template.get == "all":
        numbers = sorted(ch["chapter"] for ch in matching)
        if rtype == FULL_DETAILS:
            return ([f"Full chapter {numbers[0]}"] if numbers else []), numbers
        if rtype == OTHER_ENTITIES:
            items = [name for ch in matching for name in ch.get("secondary_entities", [])]
        else:
            items = [ch[_TRACE_FIELD[rtype]] for ch in matching]
        return list(dict.fromkeys(items)), numbers
    ordered = sorted(matching, key=_story_date)
    dates = [ch["date"] for ch in ordered]
    if len(set(dates)) != len(dates):  # no order to speak of: a broken book
        raise QuestionsError(f"chapters {[ch['chapter'] for ch in ordered]} share a date: "
                             f"no chronological order for {template.text!r}")
    items = [ch[_TRACE_FIELD[rtype]] for ch in ordered]
    if template.get == "latest":
        items = items[-1:]
    return items, [ch["chapter"] for ch in ordered]


def make_question(chapters: Sequence[ChapterRecord] | ChapterIndex, template: Template,
                  values: Sequence[str]) -> Question:
    text, cue_completed = template.fill(*values)
    answer, numbers = ground_truth(chapters, template, values)
    return Question(question=text, template=template.index, cue=template.cue, cue_completed=cue_completed,
                    retrieval_type=template.retrieval_type, get=template.get, correct_answer=answer,
                    chapters=numbers, n_chapters=len(numbers), bin=bin_of(len(numbers)))


# -- the two candidate sets --------------------------------------------------------
def _chapter_order(n_chapters: int, n_events: int, seed: int) -> list[int]:
    # The published run sampled at most 200 chapters (2000 beyond 1000 events).
    cap = 200 if n_events <= 1000 else 2000
    return random.Random(seed).sample(range(1, n_chapters + 1), min(cap, n_chapters))


def _tsec(chapter: ChapterRecord) -> tuple[str, str, str, str]:
    t, s, e, c = (chapter[f] for f in FIELDS)
    return t, s, e, c


def non_empty_candidates(chapters: Sequence[ChapterRecord], n_events: int) -> list[Question]:
    index = ChapterIndex(chapters)
    by_number = {ch["chapter"]: ch for ch in chapters}
    out: list[Question] = []
    for k in _chapter_order(len(chapters), n_events, SEED_NON_EMPTY):
        values = _tsec(by_number[k])
        out.extend(make_question(index, t, values) for t in TEMPLATES)
    return out


def _changed_fields(n: int, seed: int) -> list[set[str]]:
    rng = random.Random(seed)
    return [set(rng.sample(list(FIELDS), rng.randint(1, 4))) for _ in range(n)]


def _unused_universe(book: Book) -> dict[str, list[str]]:
    """Per field, the universe's values (universe order) that none of the
    book's sampled events uses (failed events included); the whole list if
    every value is used."""
    universe = load_universe(getattr(book, "universe", None) or "default",
                             int((getattr(book, "metadata", None) or {}).get("universe_seed", 0)))
    lists = {"date": universe.dates, "location": universe.locations,
             "entity": universe.entities, "content": universe.contents}
    unused = {}
    for name, values in lists.items():
        used = {ev[name] for ev in book.events}
        unused[name] = [v for v in values if v not in used] or list(values)
    return unused


def empty_candidates(book: Book) -> list[Question]:
    chapters = book.chapters
    index = ChapterIndex(chapters)
    by_number = {ch["chapter"]: ch for ch in chapters}
    n_events = len(book.events)
    order = _chapter_order(len(chapters), n_events, SEED_EMPTY)
    changed = _changed_fields(len(order), SEED_EMPTY)
    if n_events <= 1000:
        inner = random.Random(SEED_EMPTY).choices([True, False], k=len(order))
    else:  # not enough unused universe values: inner replacements only
        inner = [True] * len(order)
    distinct = {f: sorted({ch[f] for ch in chapters}) for f in FIELDS}
    unused = _unused_universe(book) if not all(inner) else {}
    out: list[Question] = []
    for k, fields_changed, is_inner in zip(order, changed, inner):
        values = list(_tsec(by_number[k]))
        rng = random.Random(k)
        for i, name in enumerate(FIELDS):
            if name not in fields_changed:
                continue
            pool = [v for v in distinct[name] if v != values[i]] if is_inner else unused[name]
            if pool:  # a book with a single value of this field has nothing to swap in
                values[i] = rng.sample(pool, 1)[0]
        for t in TEMPLATES:
            if not index.matching(t, values):
                out.append(make_question(index, t, values))
    return out


def dedupe(questions: Iterable[Question]) -> list[Question]:
    """Drop repeated question texts, keeping the first."""
    seen: set[str] = set()
    out = []
    for q in questions:
        if q.question not in seen:
            seen.add(q.question)
            out.append(q)
    return out


def select(questions: Iterable[Question], per_group: int = PER_TEMPLATE_AND_BIN) -> list[Question]:
    """Within each (template, bin), the `per_group` questions whose filled cue
    sorts first (plain string order). Returned by template, bin, filled cue,
    with q_idx set to the position."""
    groups: dict[tuple[int, str], list[Question]] = {}
    for q in questions:
        groups.setdefault((q.template, q.bin), []).append(q)
    chosen: list[Question] = []
    for key in sorted(groups, key=lambda k: (k[0], BINS.index(k[1]))):
        chosen.extend(sorted(groups[key], key=lambda q: q.cue_completed)[:per_group])
    for i, q in enumerate(chosen):
        q.q_idx = i
    return chosen


def as_book(book: Book | str | Path) -> Book:
    """A Book object as is; a book folder or a published book name loaded."""
    if isinstance(book, (str, Path)):
        return load_book(book)
    return book


def build_questions(book: Book | str | Path) -> list[Question]:
    """The benchmark's question set for a book (a Book, a book folder or a
    published book name)."""
    book = as_book(book)
    if not book.chapters:
        raise QuestionsError("the book has no chapters: no questions to build")
    candidates = non_empty_candidates(book.chapters, len(book.events)) + empty_candidates(book)
    return select(dedupe(candidates))


def single_event_questions(book: Book | str | Path) -> list[Question]:
    """Every distinct non-empty question whose cue matches exactly one chapter
    (the fine-tuning training questions), in the published generation order."""
    book = as_book(book)
    by_number = {ch["chapter"]: ch for ch in book.chapters}
    order = _chapter_order(len(book.chapters), len(book.events), 0)  # published: seed 0 for this set
    index = ChapterIndex(book.chapters)
    out = [make_question(index, t, _tsec(by_number[k])) for k in order for t in TEMPLATES]
    return [q for q in dedupe(out) if q.n_chapters == 1]


# -- JSON Lines ------------------------------------------------------------------------
def write_questions(path: str | os.PathLike[str], questions: Iterable[Question]) -> Path:
    """One question per line, keys in a fixed order; written atomically."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for q in questions:
            fh.write(json.dumps(q.to_json(), ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def read_questions(path: str | os.PathLike[str]) -> list[Question]:
    """Questions from a JSON Lines file; a malformed line raises QuestionsError
    naming the file and line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise QuestionsError(f"questions file {path} not found") from None
    except (UnicodeDecodeError, IsADirectoryError) as exc:
        raise QuestionsError(f"questions file {path}: cannot be read as text ({exc.__class__.__name__})") from None
    out = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append(Question.from_json(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise QuestionsError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        except (ValueError, TypeError) as exc:
            raise QuestionsError(f"{path}:{lineno}: {exc}") from None
    if not out:
        raise QuestionsError(f"questions file {path} holds no questions")
    return out
