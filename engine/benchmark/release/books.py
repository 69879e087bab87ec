"""One released book turned into a Tulving book folder (engine/benchmark/generation/bookdir.py).

From the release (layout.py):
- book.txt        <- books/<dir>/book.json, the text as one JSON string (export_list of
                     the string build_chapter joined: the same "Chapter k" format).
- chapters.json   <- df_book_groundtruth.parquet (one row per chapter: date, location,
                     entity, content, post_entities = the secondary names in $entity_X
                     order, raw_generated_paragraph_idx = the event index), the detail
                     from events.json and nb_paragraphs / style / paragraph positions
                     from meta_events.json (the columns benchmark_generation_wrapper.py
                     adds back after loading).
- events.json     <- <experiment>/events.json, lists [t, s, e, c, detail], its first
                     n_events (the file holds the largest run of that folder: events are
                     sampled so that the first N are the same for any larger run).
- meta_events.json <- <experiment>/meta_events.json, its first n_events.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal, TypedDict

from engine.benchmark.generation.bookdir import ChapterRecord, MetaEvent, write_book_dir
from engine.benchmark.release.layout import BOOK_JSON, DOI, GROUNDTRUTH, ReleaseBook, ReleaseError
from engine.benchmark.release.tables import GroundTruthRow, read_groundtruth

_EVENT_KEYS = ("date", "location", "entity", "content", "detail")
_ITEMS: tuple[Literal["date", "location", "entity", "content"], ...] = ("date", "location", "entity", "content")


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReleaseError(f"{path}: missing") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReleaseError(f"{path}: not JSON ({exc})") from None


def read_events(experiment: Path, n_events: int) -> tuple[list[dict[str, str]], list[MetaEvent]]:
    """The first n_events events (as Tulving's dicts) and meta-events of an experiment folder."""
    raw_events = _read_json(experiment / "events.json")
    metas = _read_json(experiment / "meta_events.json")
    if not isinstance(raw_events, list) or not isinstance(metas, list):
        raise ReleaseError(f"{experiment}: events.json / meta_events.json are not lists")
    if len(raw_events) < n_events or len(metas) < n_events:
        raise ReleaseError(f"{experiment}: {len(raw_events)} events and {len(metas)} meta-events, "
                           f"the book needs {n_events}")
    events = []
    for k, ev in enumerate(raw_events[:n_events]):
        if not isinstance(ev, list) or len(ev) != 5 or not all(isinstance(x, str) for x in ev):
            raise ReleaseError(f"{experiment / 'events.json'}: event {k} is not [date, location, entity, "
                               "content, detail]")
        events.append(dict(zip(_EVENT_KEYS, ev)))
    return events, list(metas[:n_events])


def _chapter(row: GroundTruthRow, events: list[dict[str, str]], metas: list[MetaEvent], where: str) -> ChapterRecord:
    index = row["raw_generated_paragraph_idx"]
    if not 0 <= index < len(events):
        raise ReleaseError(f"{where}: chapter {row['chapter']} uses event {index}, outside the book's "
                           f"{len(events)} events")
    event, meta = events[index], metas[index]
    for item in _ITEMS:
        if row[item] != event[item]:
            raise ReleaseError(f"{where}: chapter {row['chapter']} {item} {row[item]!r} "
                               f"differs from event {index}'s {event[item]!r}")
    return ChapterRecord(chapter=row["chapter"], event_index=index, date=event["date"],
                         location=event["location"], entity=event["entity"], content=event["content"],
                         detail=event["detail"], secondary_entities=list(row["post_entities"]),
                         nb_paragraphs=meta["nb_paragraphs"], style=meta["style"],
                         paragraph_of={k: meta["idx_paragraph"][k] for k in _ITEMS})


class ConvertedBook(TypedDict):
    """A release book in Tulving's terms: what write_book_dir writes."""

    text: str
    chapters: list[ChapterRecord]
    events: list[dict[str, str]]
    meta_events: list[MetaEvent]
    metadata: dict[str, object]


def convert(book: ReleaseBook) -> ConvertedBook:
    """The Tulving book folder's contents: text, chapters, events, meta_events, metadata."""
    pub = book.published
    text = _read_json(book.folder / BOOK_JSON)
    if not isinstance(text, str):
        raise ReleaseError(f"{book.folder / BOOK_JSON}: not the book text (a JSON string)")
    events, metas = read_events(book.experiment_dir, pub.n_events)
    where = str(book.folder / GROUNDTRUTH)
    rows = read_groundtruth(book.folder / GROUNDTRUTH)
    if len(rows) != book.n_chapters:
        raise ReleaseError(f"{where}: {len(rows)} chapters, the folder name says {book.n_chapters}")
    chapters = [_chapter(r, events, metas, where) for r in rows]
    used = {c["event_index"] for c in chapters}
    seed = int(pub.experiment.rsplit("seed", 1)[1])
    metadata: dict[str, object] = {"name": pub.name, "universe": pub.universe, "universe_name": pub.universe,
                "universe_seed": pub.universe_seed, "seed": seed, "n_events": pub.n_events,
                "distribution": "geometric", "model": pub.writer, "itermax": book.itermax,
                "n_chapters": book.n_chapters, "n_tokens": book.n_tokens,
                "failed_events": [k for k in range(pub.n_events) if k not in used],
                "source": "published release", "doi": DOI,
                "release_folder": f"{pub.experiment}/books/{book.folder.name}"}
    return {"text": text, "chapters": chapters, "events": events, "meta_events": metas, "metadata": metadata}


def write_converted(folder: Path, converted: ConvertedBook) -> Path:
    return write_book_dir(folder, text=converted["text"], chapters=converted["chapters"],
                          events=converted["events"], meta_events=converted["meta_events"],
                          metadata=converted["metadata"])
