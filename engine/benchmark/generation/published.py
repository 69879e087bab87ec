"""Books by name or folder: `load_book("synaptic-echoes")`, `load_book(path)`.

Published books, shipped in the package (engine/benchmark/data/books/):
- `synaptic-echoes`: the default long book (200 events, 196 chapters).
- `synaptic-echoes-short`: its first 19 chapters, i.e. the 20-event run
  (event 16 failed), with the first 20 events and meta-events
  (`first_events` derives it from the long book; a test checks the shipped
  folder equals that derivation).

Any other name is looked up in TULVING_DATA/books/NAME; anything else is a
folder path.

Loading checks the book: every chapter passes the exact checks against its
ground truth (adapted to the assembled text), the ground truth agrees with
events.json / meta_events.json, and book.txt has one chunk per chapter.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.benchmark.datadir import book_dir, published_book_dir, published_names, user_data_dir
from engine.benchmark.generation.assemble import book_tokens
from engine.benchmark.generation.bookdir import (
    CHAPTER_SEPARATOR,
    Book,
    BookError,
    ChapterRecord,
    MetaEvent,
    read_book_dir,
    split_chapters,
)
from engine.benchmark.generation.checks import check_assembled_chapter
from engine.errors import did_you_mean

LONG = "synaptic-echoes"
SHORT = "synaptic-echoes-short"
PUBLISHED = published_names("books")
# The published books' cl100k token counts (the figure in the authors' folder
# names, nbtokens_102870 / nbtokens_10397), so loading one does not import the
# tokenizer's tables (1.6-1.8 s) to count them again; tests/test_published.py
# counts them again against the shipped text.
PUBLISHED_TOKENS: dict[str, int] = {"synaptic-echoes": 102_870, "synaptic-echoes-short": 10_397}
PUBLISHED_META: dict[str, object] = {"universe": "default", "universe_seed": 0, "seed": 0, "model": "claude-3-5-sonnet-20240620", "itermax": 10,
                  "distribution": "geometric"}


def first_events(raw: dict[str, Any], n_events: int) -> dict[str, Any]:
    """The book a run of the first `n_events` events gives (events are sampled
    so that the first N are the same for any larger run)."""
    chapters = [c for c in raw["chapters"] if c["event_index"] < n_events]
    text = CHAPTER_SEPARATOR.join(raw["text"].split(CHAPTER_SEPARATOR)[:len(chapters)])
    return {"text": text, "chapters": chapters, "events": raw["events"][:n_events],
            "meta_events": raw["meta_events"][:n_events], "metadata": {}}


def _missing_book(key: str) -> str:
    """Why `key` names no book, and what to do: fetch a released book that is
    not installed yet, or the closest name to a mistyped one."""
    from engine.benchmark.release.layout import CATALOGUE

    fetchable = [p.name for p in CATALOGUE]
    if key in fetchable:
        return (f"book {key!r} is published but not installed: `tulving data fetch` downloads the release "
                f"(or `tulving data import FILE` imports the archive fetched by hand)")
    user = user_data_dir()
    installed = sorted(p.name for p in (user / "books").iterdir() if p.is_dir()) \
        if user is not None and (user / "books").is_dir() else []
    guess = did_you_mean(key, [*PUBLISHED, *installed, *fetchable])
    return (f"no book named {key!r} and no such folder{': ' + guess if guess else ''} (packaged: "
            f"{', '.join(PUBLISHED)}; `tulving books` lists the installed and fetchable ones)")


def load_book(name_or_path: str | Path, *, verify: bool = True) -> Book:
    """A published book by name, a user's book by name (TULVING_DATA), or a
    book folder (see engine/benchmark/generation/bookdir.py)."""
    key = str(name_or_path)
    if key in PUBLISHED:
        raw = read_book_dir(published_book_dir(key))
        metadata: dict[str, Any] = {"name": key, "n_events": len(raw["events"]), **PUBLISHED_META}
        if key in PUBLISHED_TOKENS:
            metadata["n_tokens"] = PUBLISHED_TOKENS[key]
        name, path = key, None
    else:
        folder = book_dir(key)
        path = folder if folder is not None else Path(key)
        if not path.is_dir():
            raise BookError(_missing_book(key))
        raw = read_book_dir(path)
        metadata = raw["metadata"]
        name = metadata.get("name", path.name)
    events, metas, chapters, text = raw["events"], raw["meta_events"], raw["chapters"], raw["text"]
    chapter_texts = split_chapters(text)
    source = key
    if len(chapter_texts) != len(chapters):
        raise BookError(f"book {source}: book.txt has {len(chapter_texts)} chapters, chapters.json {len(chapters)}")
    if len(metas) != len(events):
        raise BookError(f"book {source}: {len(events)} events but {len(metas)} meta-events")
    if verify:
        verify_chapters(source, chapter_texts, chapters, events, metas)
    n_tokens = _stated_tokens(metadata) or book_tokens(text)
    return Book(name=name, text=text, chapters=chapters, events=events, meta_events=metas,
                universe=metadata.get("universe", "default"), n_tokens=n_tokens, metadata=metadata,
                path=path, chapter_texts=chapter_texts)


def _stated_tokens(metadata: dict[str, Any]) -> int | None:
    """The token count book.json states (written by `tulving generate` from the
    same text): counting a 1M-token book again loads the tokenizer's tables
    (~90 MB resident) for a number already known."""
    n = metadata.get("n_tokens")
    return n if type(n) is int and n > 0 else None


def verify_chapters(source: str, chapter_texts: list[str], chapters: list[ChapterRecord], events: list[dict[str, str]],
                    metas: list[MetaEvent]) -> None:
    for k, (body, chapter) in enumerate(zip(chapter_texts, chapters), start=1):
        if chapter.get("chapter") != k:
            raise BookError(f"book {source}: chapters.json entry {k} has chapter number {chapter.get('chapter')}")
        index = chapter.get("event_index")
        if not isinstance(index, int) or not 0 <= index < len(events):
            raise BookError(f"book {source}: chapter {k} has event_index {index!r} outside events.json")
        event, meta = events[index], metas[index]
        for field in ("date", "location", "entity", "content", "detail"):
            if chapter.get(field) != event[field]:
                raise BookError(f"book {source}: chapter {k} {field} differs from event {index}")
        if chapter.get("nb_paragraphs") != meta["nb_paragraphs"] or chapter.get("style") != meta["style"] \
                or chapter.get("paragraph_of") != {key: meta["idx_paragraph"][key] for key in chapter["paragraph_of"]}:
            raise BookError(f"book {source}: chapter {k} meta-data differs from meta-event {index}")
        problem = check_assembled_chapter(body, chapter)
        if problem:
            raise BookError(f"book {source}: chapter {k} fails the exact checks: {problem}")
