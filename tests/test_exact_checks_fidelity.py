"""The exact checks keep exactly the candidates the reference keeps (issue
"fidelity", point 10; protocol.md, Chapters).

Every published chapter is turned back into a raw candidate (its paragraphs
numbered "(i) ", joined by a blank line): it passes. Each mutation below is
one a model could write; the reference's direct verification
(`epbench/src/generation/`, split on runs of "\\n", numbering compared with
"(i) " exactly) rejects every such candidate, and so must `exact_check`.
`_reference_keeps` restates those rules independently, for the sweep.
"""
from __future__ import annotations

import re

import pytest

from engine.benchmark.generation.checks import exact_check


def _reference_keeps(candidate: str, chapter: dict) -> bool:
    """The reference's direct verification, restated: pieces of the
    stripped text between runs of newlines (empty ones dropped); each opens
    with exactly "(i) "; "entity" only as "$entity_<digits>"; each item in
    its paragraph only (case-insensitive, numbering removed)."""
    pieces = [p for p in re.split(r"\n+", candidate.strip()) if p != ""]
    if len(pieces) != chapter["nb_paragraphs"]:
        return False
    for i, piece in enumerate(pieces, start=1):
        opening = re.match(r"\(\d+\)\s*", piece)
        if opening is None or opening.group(0) != f"({i}) ":
            return False
    lower = candidate.lower()
    if any(candidate[max(0, m.start() - 1):m.end() + 1] != "$entity_" for m in re.finditer("entity", lower)):
        return False
    if len(re.findall(r"\$entity_(\d+)", candidate)) != len(re.findall(r"\$entity_\w*", candidate)):
        return False
    bodies = [re.sub(r"^\(\d+\)\s*", "", p).lower() for p in pieces]
    for key in ("date", "location", "entity", "content"):
        value = chapter["detail"] if key == "content" else chapter[key]
        found = [i for i, b in enumerate(bodies, start=1) if value.lower() in b]
        if found != [chapter["paragraph_of"][key]]:
            return False
    return True


def _raw(paragraphs: list[str]) -> str:
    return "\n\n".join(f"({i}) {p}" for i, p in enumerate(paragraphs, start=1))


def _renumber(paragraphs: list[str], opening) -> str:
    return "\n\n".join(opening(i) + p for i, p in enumerate(paragraphs, start=1))


MUTATIONS = {
    "no space": lambda ps: _renumber(ps, lambda i: f"({i})"),
    "two spaces": lambda ps: _renumber(ps, lambda i: f"({i})  "),
    "tab": lambda ps: _renumber(ps, lambda i: f"({i})\t"),
    "leading zero": lambda ps: _renumber(ps, lambda i: f"({i:02d}) "),
    "whitespace-only line": lambda ps: _raw(ps).replace("\n\n(", "\n \n(") if len(ps) > 1 else None,
    "CRLF": lambda ps: _raw(ps).replace("\n", "\r\n") if len(ps) > 1 else None,
}


@pytest.fixture(scope="module")
def raw_chapters(long_book):
    out = []
    for text, chapter in zip(long_book.chapter_texts, long_book.chapters):
        event = {k: chapter[k] for k in ("date", "location", "entity", "content", "detail")}
        meta = {"nb_paragraphs": chapter["nb_paragraphs"], "idx_paragraph": chapter["paragraph_of"]}
        out.append((text.split("\n\n"), event, meta, chapter))
    return out


def test_published_chapters_as_raw_candidates_pass(raw_chapters):
    assert len(raw_chapters) == 196
    for paragraphs, event, meta, chapter in raw_chapters:
        assert exact_check(_raw(paragraphs), event, meta) is None
        assert _reference_keeps(_raw(paragraphs), chapter)


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_every_mutated_chapter_is_rejected_as_by_the_reference(raw_chapters, mutation):
    mutated = 0
    for paragraphs, event, meta, chapter in raw_chapters:
        candidate = MUTATIONS[mutation](paragraphs)
        if candidate is None:  # one paragraph: no line between paragraphs to change
            continue
        mutated += 1
        assert not _reference_keeps(candidate, chapter)
        assert exact_check(candidate, event, meta) is not None, (mutation, chapter["chapter"])
    assert mutated >= 170


@pytest.mark.parametrize("candidate, kept", [
    ("(1) On May 07, 2024, at the Met, Ann Lee ran. $entity_1 waved.", True),
    ("(1) On May 07, 2024, at the Met, Ann Lee ran. $Entity_1 waved.", False),   # case of the placeholder
    ("(1) On May 07, 2024, at the Met, Ann Lee ran. $entity_x waved.", False),   # no number
    ("(1) On May 07, 2024, at the Met, Ann Lee ran. Her identity hid.", False),  # 'entity' inside a word
    ("(1) On May 07, 2024, at the Met, Ann Lee ran. $entity_1a waved.", True),   # digits, then more: kept
    ("\n\n(1) On May 07, 2024, at the Met, Ann Lee ran.\n\n", True),              # outer blank lines: stripped
    ("(1) On May 07, 2024, at the Met, Ann Lee ran.\r", True),                   # trailing \r: stripped
    ("(1)\xa0On May 07, 2024, at the Met, Ann Lee ran.", False),                 # another space than " "
])
def test_single_paragraph_cases(candidate, kept):
    event = {"date": "May 07, 2024", "location": "the Met", "entity": "Ann Lee", "content": "Race", "detail": "Ran"}
    meta = {"nb_paragraphs": 1, "idx_paragraph": {"date": 1, "location": 1, "entity": 1, "content": 1}}
    chapter = {**event, "nb_paragraphs": 1, "paragraph_of": meta["idx_paragraph"]}
    assert _reference_keeps(candidate, chapter) is kept
    assert (exact_check(candidate, event, meta) is None) is kept
