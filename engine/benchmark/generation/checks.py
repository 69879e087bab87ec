"""Chapter verification: the exact checks (protocol "Chapters") and the parsing
of the LLM check's reply.

`exact_check(candidate, event, meta)` runs on a raw candidate (numbered
paragraphs, `$entity_X` placeholders) and returns None when it passes, else a
short reason. It keeps exactly the candidates the reference implementation
keeps (ahstat/episodic-memory-benchmark, `epbench/src/generation/`, direct
verification), and rejects the others:
- paragraphs are the text split on runs of "\n" only: a whitespace-only line
  or a "\r" stays part of a piece, so such a candidate has the wrong count;
- every paragraph starts with exactly "(i) " -- parenthesis, the number
  without leading zero, one space -- numbered 1, 2, ... in order: "(1)text",
  "(1)  text", "(1)\ttext" and "(01) text" fail;
- every "entity" (any case) is the "entity" of a "$entity_" (as written, one
  character either side), and every "$entity_" is followed by digits.
`check_assembled_chapter` is the same check adapted to a chapter as it
stands in book.txt (numbering removed, secondary names filled in).

"entity" is matched anywhere, also inside a word: a candidate saying
"identity" fails, as in the reference (no published chapter holds the string
"entity" outside a placeholder; a content detail containing "identity" can
therefore never pass).
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping

from engine.benchmark.generation.bookdir import ChapterRecord, MetaEvent
from engine.benchmark.generation.prompts import lower_first

_PARAGRAPH_SPLIT = re.compile(r"\n+")
_NUMBERING = re.compile(r"^\(\d+\)\s*")  # what is removed before the placement checks
_ENTITY_WORD = re.compile(r"entity", re.IGNORECASE)
_PLACEHOLDER_PREFIX = re.compile(r"\$entity_\w*")
_PLACEHOLDER = re.compile(r"\$entity_\d+")
_ITEMS = ("date", "location", "entity", "content")


def split_paragraphs(text: str) -> list[str]:
    """Paragraphs: the stripped text split on runs of "\n", empty pieces
    dropped (a whitespace-only piece is kept: it is a paragraph that fails)."""
    return [p for p in _PARAGRAPH_SPLIT.split(text.strip()) if p]


def strip_numbering(paragraph: str) -> str:
    return _NUMBERING.sub("", paragraph, count=1)


def numbering_of(paragraph: str) -> str:
    """The paragraph's leading "(digits)" and the whitespace after it ("" if none)."""
    match = _NUMBERING.match(paragraph)
    return match.group(0) if match else ""


def placeholders_problem(text: str) -> str | None:
    """Every "entity" must be written "$entity_" (the character before it a
    "$", the one after it a "_") and every "$entity_" followed by digits."""
    # found in the lower-cased text, read in the text as written (the reference's way)
    for match in re.finditer("entity", text.lower()):
        if text[max(0, match.start() - 1):match.end() + 1] != "$entity_":
            return "the word 'entity' appears outside a $entity_X placeholder"
    if len(_PLACEHOLDER.findall(text)) != len(_PLACEHOLDER_PREFIX.findall(text)):
        return "a $entity_ placeholder is not followed by a number"
    return None


def item_values(event: Mapping[str, str] | ChapterRecord) -> dict[str, str]:
    """The four strings the checks look for, keyed like idx_paragraph."""
    return {"date": event["date"], "location": event["location"], "entity": event["entity"],
            "content": lower_first(event["detail"])}


def _placement_problem(paragraphs: list[str], event: Mapping[str, str] | ChapterRecord, paragraph_of: Mapping[str, int]
                       ) -> str | None:
    lowered = [p.lower() for p in paragraphs]
    for key, value in item_values(event).items():
        target = paragraph_of[key]
        needle = value.lower()
        where = [i for i, p in enumerate(lowered, start=1) if needle in p]
        if target not in where:
            return f"{key} {value!r} missing from paragraph {target}"
        others = [i for i in where if i != target]
        if others:
            return f"{key} {value!r} also in paragraph {others[0]} (expected only {target})"
    return None


def exact_check(candidate: str, event: Mapping[str, str], meta: MetaEvent) -> str | None:
    """None if the raw candidate passes every exact check, else the reason."""
    paragraphs = split_paragraphs(candidate)
    nb = meta["nb_paragraphs"]
    if len(paragraphs) != nb:
        return f"{len(paragraphs)} paragraphs instead of {nb}"
    for i, paragraph in enumerate(paragraphs, start=1):
        numbering = numbering_of(paragraph)
        if not numbering:
            return f"paragraph {i} does not start with ({i})"
        if numbering != f"({i}) ":
            number = numbering.strip()
            if numbering == number + " " and number[1:-1] == str(int(number[1:-1])):
                return f"paragraph {i} is numbered {number}"
            return f"paragraph {i} starts with {numbering!r} instead of '({i}) '"
    problem = placeholders_problem(candidate)
    if problem is not None:
        return problem
    return _placement_problem([strip_numbering(p) for p in paragraphs], event, meta["idx_paragraph"])


def check_assembled_chapter(text: str, chapter: ChapterRecord) -> str | None:
    """The exact checks on a chapter of book.txt against its ground truth."""
    paragraphs = text.split("\n\n")
    nb = chapter["nb_paragraphs"]
    if len(paragraphs) != nb or any(not p.strip() for p in paragraphs):
        return f"{len(paragraphs)} paragraphs instead of {nb}"
    if any(_NUMBERING.match(p) for p in paragraphs):
        return "a paragraph still carries its (i) numbering"
    if _ENTITY_WORD.search(text):
        return "an $entity_X placeholder (or the word 'entity') is left in the text"
    for name in chapter.get("secondary_entities", []):
        if name not in text:
            return f"secondary entity {name!r} does not appear"
    return _placement_problem(paragraphs, chapter, chapter["paragraph_of"])


# -- the LLM check -----------------------------------------------------------------------
_OBJECT = re.compile(r"\{.*?\}", re.DOTALL)


def parse_llm_check(reply: str) -> tuple[bool, str | None]:
    """(passed, reason). The reply must hold a JSON object with exactly the four
    keys "1".."4", each a boolean, all true."""
    for blob in _OBJECT.findall(reply):
        try:
            data = json.loads(blob)
        except json.JSONDecodeError:
            try:  # a model writing Python-style True/False
                data = json.loads(re.sub(r"\bTrue\b", "true", re.sub(r"\bFalse\b", "false", blob)))
            except json.JSONDecodeError:
                continue
        if not isinstance(data, dict):
            continue
        values = [data.get(k) for k in ("1", "2", "3", "4")]
        if len(data) != 4 or not all(isinstance(v, bool) for v in values):
            return False, "the check reply does not hold exactly four booleans"
        false = [str(i) for i, v in enumerate(values, start=1) if not v]
        if false:
            return False, f"LLM check answered false to question(s) {', '.join(false)}"
        return True, None
    return False, "the check reply holds no JSON object"
