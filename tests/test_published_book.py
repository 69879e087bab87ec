"""The published book: loading, exact checks, re-assembly byte for byte,
secondary names, derived books and statistics."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from engine.benchmark.datadir import published_book_dir
from engine.benchmark.generation import BookError, load_book
from engine.benchmark.generation.assemble import build_book
from engine.benchmark.generation.bookdir import write_book_dir
from engine.benchmark.generation.checks import exact_check
from engine.benchmark.generation.derived import chronological_book, story_date
from engine.benchmark.generation.secondary import secondary_names
from engine.benchmark.generation.stats import compute_stats
from engine.benchmark.generation.universe import load_universe_spec


@pytest.fixture(scope="module")
def names():
    spec = load_universe_spec("default")
    return secondary_names(spec.secondary_first_names, spec.secondary_last_names)


def to_raw_candidate(body: str, secondary: list[str]) -> str:
    """A chapter of book.txt turned back into what the model wrote: numbered
    paragraphs and $entity_X placeholders."""
    for j, name in sorted(enumerate(secondary, start=1), key=lambda p: -len(p[1])):
        body = body.replace(name, f"$entity_{j}")
    return "\n\n".join(f"({i}) {p}" for i, p in enumerate(body.split("\n\n"), start=1))


def test_published_books_by_name(long_book):
    assert (long_book.n_chapters, long_book.n_tokens, len(long_book.events)) == (196, 102_870, 200)
    assert long_book.universe == "default"
    short = load_book("synaptic-echoes-short")
    assert (short.n_chapters, short.n_tokens, len(short.events), len(short.meta_events)) == (19, 10_397, 20, 20)
    assert [c["event_index"] for c in short.chapters] == [i for i in range(20) if i != 16]
    assert short.chapter_texts == long_book.chapter_texts[:19]
    failed = sorted(set(range(200)) - {c["event_index"] for c in long_book.chapters})
    assert failed == [16, 56, 156, 160]


def test_chapter_texts_api(long_book):
    first = long_book.chapter_text(1)
    assert first.startswith("The harsh glare of the floodlights")
    assert not first.startswith("Chapter")
    assert len(long_book.paragraphs(1)) == 7
    assert long_book.text.startswith("Chapter 1\n\n" + first + "\n\n\nChapter 2\n\n")
    with pytest.raises(IndexError):
        long_book.chapter_text(197)


def test_secondary_names_start_as_in_the_paper(names):
    assert len(names) == 100_000
    assert list(names[:4]) == ["Noa Middleton", "Mara Ledbetter", "Sienna Hamrick", "Reid Blunt"]


def test_exact_checks_accept_every_published_chapter(long_book):
    for chapter, body in zip(long_book.chapters, long_book.chapter_texts):
        raw = to_raw_candidate(body, chapter["secondary_entities"])
        event = long_book.events[chapter["event_index"]]
        meta = long_book.meta_events[chapter["event_index"]]
        assert exact_check(raw, event, meta) is None, chapter["chapter"]


def test_reassembly_gives_book_txt_byte_for_byte(long_book, names):
    # the raw candidates -> secondary names dealt chapter by chapter -> assembly
    valid = {c["event_index"]: to_raw_candidate(body, c["secondary_entities"])
             for c, body in zip(long_book.chapters, long_book.chapter_texts)}
    text, chapters = build_book(valid, long_book.events, long_book.meta_events, names)
    published = (published_book_dir() / "book.txt").read_bytes()
    assert text.encode("utf-8") == published
    assert chapters == json.loads((published_book_dir() / "chapters.json").read_text())


def test_crafted_bad_chapters_are_rejected(long_book):
    chapter = long_book.chapters[0]
    event, meta = long_book.events[0], long_book.meta_events[0]
    raw = to_raw_candidate(long_book.chapter_texts[0], chapter["secondary_entities"])
    paragraphs = raw.split("\n\n")
    assert exact_check("\n\n".join(paragraphs[:-1]), event, meta) == "6 paragraphs instead of 7"
    swapped = [paragraphs[1].replace("(2)", "(3)", 1) if i == 1 else p for i, p in enumerate(paragraphs)]
    assert exact_check("\n\n".join(swapped), event, meta) == "paragraph 2 is numbered (3)"
    unnumbered = [re.sub(r"^\(1\) ", "", p) for p in paragraphs]
    assert exact_check("\n\n".join(unnumbered), event, meta) == "paragraph 1 does not start with (1)"
    stray = raw.replace("$entity_1", "the Entity", 1)
    assert "outside a $entity_X" in exact_check(stray, event, meta)
    # date moved from paragraph 7 to paragraph 3
    moved = raw.replace(" of September 13, 2025", "").replace("(3) ", "(3) On September 13, 2025, ", 1)
    assert exact_check(moved, event, meta) == "date 'September 13, 2025' missing from paragraph 7"
    # location repeated in another paragraph (case-insensitively)
    twice = raw.replace("(4) ", "(4) Back at bethpage black course, ", 1)
    assert exact_check(twice, event, meta) == ("location 'Bethpage Black Course' also in paragraph 4 "
                                               "(expected only 2)")


def _copy_published(tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(published_book_dir(), folder)
    for f in folder.iterdir():
        f.chmod(0o644)
    return folder


def test_loading_a_folder_rechecks_every_chapter(tmp_path):
    folder = _copy_published(tmp_path)
    book = load_book(folder)
    assert book.n_chapters == 196 and book.path == folder
    text = (folder / "book.txt").read_text()
    # chapter 1's location also in its first paragraph: must be refused
    (folder / "book.txt").write_text(text.replace("The harsh glare", "At Bethpage Black Course, the harsh glare", 1))
    with pytest.raises(BookError, match="chapter 1 fails the exact checks: location"):
        load_book(folder)
    (folder / "book.txt").write_text(text)
    chapters = json.loads((folder / "chapters.json").read_text())
    chapters[5]["date"] = "May 01, 2024"
    (folder / "chapters.json").write_text(json.dumps(chapters))
    with pytest.raises(BookError, match="chapter 6 date differs from event 5"):
        load_book(folder)
    (folder / "chapters.json").unlink()
    with pytest.raises(BookError, match="missing chapters.json"):
        load_book(folder)
    with pytest.raises(BookError, match="no book named"):
        load_book(tmp_path / "nowhere")


def test_chronological_variant(tmp_path, long_book):
    chrono = chronological_book(load_book("synaptic-echoes-short"))
    dates = [story_date(c) for c in chrono.chapters]
    assert dates == sorted(dates)
    assert [c["chapter"] for c in chrono.chapters] == list(range(1, 20))
    assert sorted(chrono.chapter_texts) == sorted(long_book.chapter_texts[:19])
    for c, body in zip(chrono.chapters, chrono.chapter_texts):
        assert body == long_book.chapter_texts[c["event_index"] if c["event_index"] < 16 else c["event_index"] - 1]
    folder = write_book_dir(tmp_path / "chrono", text=chrono.text, chapters=chrono.chapters, events=chrono.events,
                            meta_events=chrono.meta_events, metadata=chrono.metadata)
    again = load_book(folder)  # passes every check in its new order
    assert again.chapter_texts == chrono.chapter_texts


def test_statistics_equal_the_paper_tables(long_book):
    stats = compute_stats(long_book)
    # tab:chapter_statistic_nb_paragraphs
    assert stats["paragraphs"] == {1: 17, 2: 27, 3: 16, 4: 21, 5: 19, 6: 19, 7: 14, 8: 18, 9: 20, 10: 25}
    assert stats["styles"] == {"comedy": 16, "detective": 22, "fantasy": 32, "horror": 18, "mystery": 25,
                               "romance": 17, "thriller": 30, "tragedy": 36}
    assert stats["secondary_entities"] == {1: 22, 2: 74, 3: 60, 4: 27, 5: 8, 6: 2, 7: 2, 8: 1}
    # tab:geometric_actual, 200 events
    rep = {k: list(v.values()) for k, v in stats["repetitions"].items()}
    assert rep == {"date": [6, 4, 14, 13], "location": [7, 7, 8, 13], "entity": [9, 3, 7, 15],
                   "content": [9, 4, 7, 14]}
    # every item found once per chapter at each level
    for item in ("date", "location", "entity", "content"):
        assert all(sum(stats["positions"][item][level]) == 196 for level in ("book", "chapter", "paragraph"))


def test_writing_the_published_book_gives_identical_files(tmp_path, long_book):
    folder = write_book_dir(tmp_path / "copy", text=long_book.text, chapters=long_book.chapters,
                            events=long_book.events, meta_events=long_book.meta_events, metadata={})
    for name in ("book.txt", "chapters.json", "events.json", "meta_events.json"):
        assert (folder / name).read_bytes() == (published_book_dir() / name).read_bytes(), name


def test_statistics_are_saved_with_the_positions_plot(tmp_path, long_book):
    """`tulving book stats` writes stats.json and the paper's position plot
    (matplotlib comes with the `plots` extra the README installs)."""
    from engine.benchmark.generation.stats import write_stats

    stats, text = write_stats(long_book, tmp_path)
    saved = json.loads((tmp_path / "stats.json").read_text())
    assert saved["positions_plot"] == "positions.png" and "positions plot: positions.png" in text
    png = (tmp_path / "positions.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000


def test_the_stated_token_counts_are_the_shipped_texts_counted():
    """load_book takes a published book's token count from PUBLISHED_TOKENS
    (no tokenizer load); counting the shipped text must give the same figure."""
    from engine.benchmark.generation.assemble import book_tokens
    from engine.benchmark.generation.published import PUBLISHED, PUBLISHED_TOKENS

    assert sorted(PUBLISHED_TOKENS) == sorted(PUBLISHED)
    for name, stated in PUBLISHED_TOKENS.items():
        text = (published_book_dir(name) / "book.txt").read_text(encoding="utf-8")
        assert book_tokens(text) == stated, name
