"""Book assembly (protocol "Chapters", last point): numbering removed,
paragraphs joined by a blank line, each chapter "Chapter {k}\\n\\n{text}",
chapters joined by "\\n\\n\\n", k from 1 in event order."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from engine.benchmark.generation.bookdir import CHAPTER_SEPARATOR, ChapterRecord, MetaEvent
from engine.benchmark.generation.checks import split_paragraphs, strip_numbering
from engine.benchmark.generation.secondary import NameDealer
from engine.tokens import count_tokens


def chapter_body(candidate: str) -> str:
    """A validated candidate (names already filled in) as it stands in the book."""
    return "\n\n".join(strip_numbering(p) for p in split_paragraphs(candidate))


def assemble_book(bodies: Iterable[str]) -> str:
    """Chapter bodies (in order) -> the book text."""
    return CHAPTER_SEPARATOR.join(f"Chapter {k}\n\n{body}" for k, body in enumerate(bodies, start=1))


def ground_truth(chapter: int, event_index: int, event: Mapping[str, str], meta: MetaEvent,
                 secondary: list[str]) -> ChapterRecord:
    """One chapters.json entry (same keys and order as the published file)."""
    idx = meta["idx_paragraph"]
    return {"chapter": chapter, "event_index": event_index, "date": event["date"],
            "location": event["location"], "entity": event["entity"], "content": event["content"],
            "detail": event["detail"], "secondary_entities": secondary,
            "nb_paragraphs": meta["nb_paragraphs"], "style": meta["style"],
            "paragraph_of": {key: idx[key] for key in ("date", "location", "entity", "content")}}


def build_book(valid: Mapping[int, str], events: Sequence[Mapping[str, str]], metas: Sequence[MetaEvent],
               names: Sequence[str]) -> tuple[str, list[ChapterRecord]]:
    """Valid raw candidates (event index -> text) -> (book text, chapters.json).

    Chapters follow event order; secondary names are dealt chapter by chapter."""
    dealer = NameDealer(names)
    bodies: list[str] = []
    chapters: list[ChapterRecord] = []
    for k, index in enumerate(sorted(valid), start=1):
        filled, taken = dealer.fill(valid[index])
        bodies.append(chapter_body(filled))
        chapters.append(ground_truth(k, index, events[index], metas[index], taken))
    return assemble_book(bodies), chapters


# bpe-openai refuses texts of 1,000,000 characters or more.
_TOKEN_CHUNK_CHARS = 500_000


def book_tokens(text: str) -> int:
    """cl100k_base token count of a book of any size.

    Long books are counted in pieces cut just before a "Chapter k" header.
    The header follows "\\n\\n\\n", and cl100k's pre-tokenizer never joins a
    newline to the letters after it, so the cut is a pre-token boundary and
    the sum is the exact count of the whole text."""
    if len(text) < _TOKEN_CHUNK_CHARS:
        return count_tokens(text)
    total, start = 0, 0
    while start < len(text):
        end = len(text) if len(text) - start <= _TOKEN_CHUNK_CHARS else \
            text.rfind(CHAPTER_SEPARATOR, start, start + _TOKEN_CHUNK_CHARS)
        if end <= start:  # one chapter over the limit: cut after a newline (count then approximate)
            end = text.rfind("\n", start, start + _TOKEN_CHUNK_CHARS)
            end = start + _TOKEN_CHUNK_CHARS if end <= start else end + 1
        else:
            end = end + len(CHAPTER_SEPARATOR) if end < len(text) else end
        total += count_tokens(text[start:end])
        start = end
    return total
