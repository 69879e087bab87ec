"""Question sets built from the published book equal the published ones."""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from engine.benchmark.datadir import published_book_dir
from engine.benchmark.evaluation.questions import (
    BINS,
    Question,
    QuestionsError,
    bin_of,
    build_questions,
    make_question,
    read_questions,
    single_event_questions,
    write_questions,
)
from engine.benchmark.evaluation.templates import TEMPLATES, cue_parts
from engine.errors import TulvingError

PAPER = Path(__file__).resolve().parents[2] / "shared" / "paper" / "episodic-memory-benchmark.tex"
needs_paper = pytest.mark.skipif(not PAPER.exists(), reason=f"{PAPER} is absent (a clone without shared/ beside it): the paper's listings cannot be read")


# -- templates --------------------------------------------------------------------------------
def _paper_templates() -> list[tuple[int, str, str, str, str]]:
    rows = []
    for m in re.finditer(r"^(\d+) & \((.*?)\) & (.*?) & (.*?) & \\parbox\[c\]\{12\.2cm\}\{(.*)\} \\\\",
                         PAPER.read_text(encoding="utf-8"), re.MULTILINE):
        idx, cue, trace, get, text = m.groups()
        rows.append((int(idx), cue, trace, get, text.replace("\\{", "{").replace("\\}", "}")))
    return rows


@needs_paper
def test_templates_are_the_papers_word_for_word():
    rows = _paper_templates()
    assert [r[0] for r in rows] == list(range(36))
    trace_names = {"Spaces": "Spaces", "Entities": "Entities", "Contents": "Event contents", "Times": "Times",
                   "Other entities": "Other entities", "Full details": "Full event details"}
    gets = {"all": "all", "latest": "latest", "chrono.": "chronological"}
    for (_idx, cue, trace, get, text), template in zip(rows, TEMPLATES):
        assert template.text == text
        assert template.cue.replace(" ", "").replace("ent", "e") == f"({cue})"
        assert template.retrieval_type == trace_names[trace]
        assert template.get == gets[get]


def test_fill_gives_question_and_filled_cue():
    text, cue = TEMPLATES[0].fill("May 14, 2025", "Central Park", "Ezra Edwards", "Carnival")
    assert text.startswith("Recall all the events that occurred on May 14, 2025. Without describing")
    assert cue == "({May 14, 2025}, *, *, *)"
    assert TEMPLATES[28].fill("t1", "s1", "e1", "c1")[1] == "({t1}, {s1}, {e1}, {c1})"
    with pytest.raises(ValueError):
        cue_parts("(t, *, *)")


# -- the published sets -----------------------------------------------------------------------
def test_long_book_set_is_the_published_one(long_questions):
    qs = long_questions
    assert len(qs) == 686
    assert Counter(q.get for q in qs) == {"all": 548, "latest": 69, "chronological": 69}
    assert Counter(q.bin for q in qs if q.get == "all") == {"0": 150, "1": 150, "2": 90, "3-5": 98, "6+": 60}
    # the chronological questions with an order to judge
    assert sum(q.get == "chronological" and len(q.correct_answer) >= 2 for q in qs) == 39
    assert [q.q_idx for q in qs] == list(range(686))
    assert len({q.question for q in qs}) == 686


def test_short_book_set_is_the_published_one(short_questions):
    qs = short_questions
    assert len(qs) == 456
    assert Counter(q.bin for q in qs if q.get == "all").keys() <= {"0", "1", "2", "3-5"}
    assert not any(q.bin == "6+" for q in qs)  # at most three chapters share a cue on the short book


def _paper_spread() -> dict[str, tuple[list[int], list[int]]]:
    """The paper's table of selected questions per cue and bin (20 and 200 events)."""
    text = PAPER.read_text(encoding="utf-8")
    table = text[text.index(r"\label{tab:question_select_widespread}"):]
    out = {}
    for m in re.finditer(r"^(\(.*?\)|others) ((?:& \d+ ){10})\\\\", table[:3000], re.MULTILINE):
        counts = [int(x) for x in m.group(2).replace("&", " ").split()]
        out[m.group(1)] = (counts[:5], counts[5:])
    return out


@needs_paper
@pytest.mark.parametrize("which", [0, 1])
def test_spread_per_cue_and_bin_is_the_papers_table(which, short_questions, long_questions):
    qs = (short_questions, long_questions)[which]
    per_template: dict[tuple[str, int], Counter] = defaultdict(Counter)
    for q in qs:
        per_template[(q.cue, q.template)][q.bin] += 1
    spread = _paper_spread()
    assert len(spread) == 10
    named = set()
    for cue, counts in spread.items():
        if cue == "others":
            continue
        ours = cue.replace(",", ", ").replace(" e,", " ent,")
        named.add(ours)
        rows = [c for (k, _), c in per_template.items() if k == ours]
        assert rows, cue
        for row in rows:  # every template of the cue got the table's number
            assert [row[b] for b in BINS] == counts[which], cue
    others = [c for (k, _), c in per_template.items() if k not in named]
    assert others and all([c[b] for b in BINS] == spread["others"][which] for c in others)


def test_paper_examples(long_book):
    chapters = long_book.chapters
    q = make_question(chapters, TEMPLATES[21], ("September 13, 2025", "Bethpage Black Course", "Ezra Edwards",
                                                "Parkour Workshop"))
    assert q.question == ("Think about the events involving Parkour Workshop at Bethpage Black Course. "
                          "List all protagonists involved in these events, without mentioning the events themselves.")
    assert q.chapters == [1, 109, 128] and q.bin == "3-5"
    assert sorted(q.correct_answer) == ["Chloe Castillo", "Ezra Edwards", "Levi Rodriguez"]
    jackson = next(c for c in chapters if c["entity"] == "Jackson Ramos")
    values = tuple(jackson[f] for f in ("date", "location", "entity", "content"))
    dates = make_question(chapters, TEMPLATES[6], values).correct_answer
    assert sorted(dates) == sorted(["September 22, 2026", "February 27, 2026", "August 24, 2026",
                                    "April 09, 2026", "June 14, 2025"])
    at_park = make_question(chapters, TEMPLATES[18], (values[0], "Central Park", "Jackson Ramos", values[3]))
    assert at_park.correct_answer == ["September 22, 2026"]


def test_ground_truth_is_consistent_with_the_chapters(long_book, long_questions):
    by_number = {c["chapter"]: c for c in long_book.chapters}
    for q in long_questions:
        assert q.n_chapters == len(q.chapters) and q.bin == bin_of(q.n_chapters)
        if q.n_chapters == 0:
            assert q.correct_answer == []
        if q.get in ("latest", "chronological") and q.chapters:
            from datetime import datetime
            dates = [datetime.strptime(by_number[k]["date"], "%B %d, %Y") for k in q.chapters]
            assert dates == sorted(dates)  # story time, not chapter order
            field = {"Times": "date", "Spaces": "location", "Event contents": "content"}[q.retrieval_type]
            trace = [by_number[k][field] for k in q.chapters]
            assert q.correct_answer == (trace if q.get == "chronological" else trace[-1:])
        if q.retrieval_type == "Full event details" and q.chapters:
            assert q.correct_answer == [f"Full chapter {q.chapters[0]}"]
        if q.retrieval_type == "Other entities" and q.chapters:
            assert q.correct_answer == by_number[q.chapters[0]]["secondary_entities"]
    # latest keeps every matching chapter in its count
    assert any(q.get == "latest" and q.n_chapters >= 6 and len(q.correct_answer) == 1 for q in long_questions)


def test_build_from_a_book_folder_or_name(long_questions, short_questions):
    from_folder = build_questions(published_book_dir("synaptic-echoes"))
    assert [q.to_json() for q in from_folder] == [q.to_json() for q in long_questions]
    assert build_questions("synaptic-echoes-short") == short_questions


# -- JSON Lines ------------------------------------------------------------------------------------
def test_jsonl_round_trip(tmp_path, short_questions):
    path = write_questions(tmp_path / "out" / "q.jsonl", short_questions)
    assert read_questions(path) == short_questions
    first = json.loads(path.read_text().splitlines()[0])
    assert set(first) == {"question", "template", "cue", "cue_completed", "retrieval_type", "get",
                          "correct_answer", "chapters", "n_chapters", "bin", "q_idx"}


@pytest.mark.parametrize("line, message", [
    ("{not json", "not valid JSON"),
    ('{"question": "q"}', "missing key"),
    ("[1, 2]", "JSON object"),
])
def test_malformed_lines_name_file_and_line(tmp_path, short_questions, line, message):
    good = json.dumps(short_questions[0].to_json())
    path = tmp_path / "q.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(QuestionsError) as err:
        read_questions(path)
    assert f"{path}:2:" in str(err.value) and message in str(err.value)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, TulvingError)


def test_bad_field_values_are_refused(tmp_path, short_questions):
    data = short_questions[0].to_json()
    for key, value in (("get", "sometimes"), ("bin", "7"), ("template", 36), ("correct_answer", "x")):
        bad = dict(data, **{key: value})
        with pytest.raises(ValueError, match=key):
            Question.from_json(bad)
    with pytest.raises(QuestionsError, match="not found"):
        read_questions(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(QuestionsError, match="no questions"):
        read_questions(tmp_path / "empty.jsonl")


# -- fine-tuning questions ---------------------------------------------------------------------
def test_single_event_questions_are_the_published_training_set(long_book, short_book):
    """The paper trains on 3,199 questions (long book) and 468 (short book)."""
    assert len(single_event_questions(short_book)) == 468
    qs = single_event_questions(long_book)
    assert len(qs) == 3199 and len({q.question for q in qs}) == 3199
    assert all(q.n_chapters == 1 and len(q.chapters) == 1 for q in qs)
    assert sum(q.retrieval_type == "Full event details" for q in qs) == 196  # one per chapter
    assert Counter(q.get for q in qs)["latest"] == Counter(q.get for q in qs)["chronological"]


def test_small_and_broken_books(long_book):
    from engine.benchmark.generation.bookdir import Book

    first = long_book.chapters[0]
    one = Book(name="one", text=long_book.text.split("\n\n\n")[0], chapters=[first], events=long_book.events[:1],
               meta_events=long_book.meta_events[:1])
    qs = build_questions(one)
    assert qs and {q.bin for q in qs} == {"0", "1"}
    assert all(q.chapters == [1] for q in qs if q.bin == "1")
    with pytest.raises(QuestionsError, match="no chapters"):
        build_questions(Book(name="none", text="", chapters=[], events=[], meta_events=[], chapter_texts=["-"]))
    twin = dict(long_book.chapters[1], chapter=2, entity=first["entity"], date=first["date"])
    clash = Book(name="clash", text="", chapters=[first, twin], events=long_book.events[:2],
                 meta_events=long_book.meta_events[:2], chapter_texts=["a", "b"])
    with pytest.raises(QuestionsError, match="share a date"):
        build_questions(clash)
