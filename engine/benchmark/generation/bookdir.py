"""The book folder format, and the `Book` object every later step reads.

A book is a folder holding:

- `book.txt`: the document exactly as evaluated. Chapter k (k = 1, 2, ...) is
  `"Chapter {k}\\n\\n{text}"`, chapters are joined by `"\\n\\n\\n"`, no final
  newline. In `text` the paragraph numbering is removed, paragraphs are joined
  by one blank line and every `$entity_X` is replaced by a secondary name.
- `chapters.json`: the ground truth, a list with one object per chapter, in
  chapter order: `chapter` (1-based), `event_index` (index in events.json),
  `date`, `location`, `entity`, `content`, `detail` (as in the universe, first
  letter upper-case), `secondary_entities` (names, in the order of their
  `$entity_X` number), `nb_paragraphs`, `style`, `paragraph_of` (1-based
  paragraph holding each of date, location, entity, content-detail).
- `events.json`: every sampled event (also the ones without a chapter), a list
  of `{date, location, entity, content, detail}`.
- `meta_events.json`: one per event, `{nb_paragraphs, idx_paragraph: {location,
  date, entity, content}, style}`.
- `book.json`: metadata: `format` (version), `name`, `universe` (a published
  universe's name, or the absolute path of a user's universe file),
  `universe_name`, `universe_seed`, `seed` (events seed), `n_events`,
  `distribution` (geometric | uniform), `model`, `itermax`, `n_chapters`,
  `n_tokens` (cl100k_base), `failed_events` (event indices without a valid
  chapter). Derived books add `derived_from` and `order`.
- `generation_log.jsonl` (generated books only): one line per candidate:
  `{"event", "draw", "outcome", "reason"}` with outcome one of `valid`,
  `failed_exact`, `failed_llm`, `error`.
- `stats.json`: the generation statistics (engine/benchmark/generation/stats.py), plus
  `positions.png` when matplotlib is installed.
- `realism.json` (optional, `tulving book realism`): one rating per chapter.

`events.json`, `meta_events.json` and `chapters.json` have the shapes of the
published book's files, so they compare directly.

`Book.chapter_texts[i]` is chapter i+1 as it stands in book.txt *without* its
`"Chapter k\\n\\n"` header: numbering removed, secondary names filled in,
paragraphs separated by `"\\n\\n"`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict

from providers.base import TulvingError

FORMAT_VERSION = 1
CHAPTER_SEPARATOR = "\n\n\n"
BOOK_FILES = ("book.txt", "chapters.json", "events.json", "meta_events.json")


class BookError(TulvingError):
    """A book folder that is missing, malformed or inconsistent."""


Item = Literal["date", "location", "entity", "content"]  # the four items of a chapter (and of a cue)


class ChapterRecord(TypedDict):
    """chapters.json: one chapter's ground truth (the published file's keys, in its order)."""
    chapter: int                    # 1-based, in book order
    event_index: int                # the event the chapter tells (events.json)
    date: str
    location: str
    entity: str
    content: str
    detail: str
    secondary_entities: list[str]
    nb_paragraphs: int
    style: str
    paragraph_of: dict[str, int]    # date, location, entity, content -> paragraph (1-based)


class CandidateLog(TypedDict):
    """generation_log.jsonl: one line per chapter candidate."""
    event: int
    draw: int
    outcome: str                    # valid | failed_exact | failed_llm | error
    reason: str | None


class MetaEvent(TypedDict):
    """meta_events.json: how one event's chapter is laid out."""
    nb_paragraphs: int
    idx_paragraph: dict[str, int]   # item -> paragraph (1-based)
    style: str


@dataclass
class Book:
    """A benchmark document and its ground truth."""

    name: str
    text: str
    chapters: list[ChapterRecord]           # chapters.json
    events: list[dict[str, str]]            # events.json (all sampled events)
    meta_events: list[MetaEvent]            # meta_events.json
    universe: str = "default"
    n_tokens: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)  # book.json
    path: Path | None = None
    chapter_texts: list[str] = field(default_factory=list)  # index 0 = chapter 1, no header

    def __post_init__(self) -> None:
        if not self.chapter_texts:
            self.chapter_texts = split_chapters(self.text)

    @property
    def n_chapters(self) -> int:
        return len(self.chapters)

    def chapter_text(self, k: int) -> str:
        """Chapter k (1-based) without its header."""
        if not 1 <= k <= len(self.chapter_texts):
            raise IndexError(f"chapter {k} out of range 1..{len(self.chapter_texts)}")
        return self.chapter_texts[k - 1]

    def paragraphs(self, k: int) -> list[str]:
        """The paragraphs of chapter k (1-based)."""
        return self.chapter_text(k).split("\n\n")


def split_chapters(text: str) -> list[str]:
    """book.txt -> chapter texts without their "Chapter k" headers."""
    texts = []
    for k, part in enumerate(text.split(CHAPTER_SEPARATOR), start=1):
        header = f"Chapter {k}\n\n"
        if not part.startswith(header):
            raise BookError(f"book text: chunk {k} does not start with 'Chapter {k}'")
        texts.append(part[len(header):])
    return texts


def read_text_file(path: Path, what: str = "file") -> str:
    """A UTF-8 text file; one BookError line naming it for every way reading
    fails (missing, a folder, unreadable, not UTF-8, holding NUL bytes)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise BookError(f"book folder {path.parent}: missing {path.name}") from None
    except IsADirectoryError:
        raise BookError(f"{path}: is a folder, not a {what}") from None
    except OSError as exc:
        raise BookError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BookError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    if "\0" in text:
        raise BookError(f"{path}: holds NUL bytes (at character {text.index(chr(0))}); not a text file")
    return text


def _read_json(path: Path) -> Any:
    text = read_text_file(path, "JSON file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BookError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise BookError(f"{path}: JSON nested too deeply") from None


def check_output_folder(folder: str | Path) -> Path:
    """Raise a one-line StorageError now, before any call, if `folder` cannot
    take the files a command will write: it is a file, or cannot be created or
    written (read-only, permissions, disk full)."""
    from engine.errors import StorageError

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise StorageError(f"output {folder} exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".tulving-write-probe-{os.getpid()}"
        with open(probe, "wb") as f:
            f.write(b"x" * 4096)
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as exc:
        raise StorageError(f"cannot write to the output folder {folder}: {exc.strerror or exc}") from None
    return folder


def read_book_dir(path: str | Path) -> dict[str, Any]:
    """The raw contents of a book folder (no checks beyond presence and JSON)."""
    folder = Path(path)
    if not folder.is_dir():
        raise BookError(f"book folder {folder} not found")
    text = read_text_file(folder / "book.txt", "text file")
    meta_path = folder / "book.json"
    return {
        "text": text,
        "chapters": _read_json(folder / "chapters.json"),
        "events": _read_json(folder / "events.json"),
        "meta_events": _read_json(folder / "meta_events.json"),
        "metadata": _read_json(meta_path) if meta_path.exists() else {},
    }


def _dump(path: Path, data: object) -> None:
    # Written to a temporary name then renamed, so a killed run never leaves a
    # half-written file behind.
    tmp = path.with_suffix(path.suffix + ".tmp")
    if isinstance(data, str):
        tmp.write_text(data, encoding="utf-8")
    else:
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    tmp.replace(path)


def write_events(folder: str | Path, events: list[dict[str, str]], meta_events: list[MetaEvent]) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _dump(folder / "events.json", events)
    _dump(folder / "meta_events.json", meta_events)
    return folder


def write_book_dir(folder: str | Path, *, text: str, chapters: list[ChapterRecord], events: list[dict[str, str]],
                   meta_events: list[MetaEvent], metadata: dict[str, Any],
                   log: list[CandidateLog] | None = None) -> Path:
    """Write a complete book folder (see the module docstring)."""
    folder = write_events(folder, events, meta_events)
    _dump(folder / "book.txt", text)
    _dump(folder / "chapters.json", chapters)
    _dump(folder / "book.json", {"format": FORMAT_VERSION, **metadata})
    if log is not None:
        _dump(folder / "generation_log.jsonl",
              "".join(json.dumps(rec, ensure_ascii=False) + "\n" for rec in log))
    return folder
