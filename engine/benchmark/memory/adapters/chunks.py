"""What the adapters store: a chapter's paragraphs, labelled as the paper's
rag-paragraph mode labels them ("Chapter k, Paragraph j"), and the options
every adapter reads the same way."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from engine.benchmark.memory.contract import Budget, Chapter, MemoryError

DEFAULT_TOP_K = 12  # when the run sets no passage budget: the paper's rag-paragraph top-K on the short book


@dataclass(frozen=True, slots=True)
class Unit:
    """One stored piece of a chapter: its text and where it came from."""

    chapter: int
    paragraph: int | None  # None: the whole chapter
    text: str


def paragraphs(chapter: Chapter) -> list[str]:
    """The chapter's paragraphs: its non-empty lines, as the paper cuts them."""
    return [line.strip() for line in chapter.text.split("\n") if line.strip()]


def units(chapters: Sequence[Chapter], unit: str, *, label: bool) -> list[Unit]:
    """Every chapter cut into paragraphs (`unit="paragraph"`) or kept whole
    (`"chapter"`); `label` heads each text as the paper's RAG chunks are headed."""
    out = []
    for chapter in chapters:
        if unit == "chapter":
            text = "\n".join(paragraphs(chapter))
            out.append(Unit(chapter.id, None, f"Chapter {chapter.id}\n\n{text}" if label else text))
            continue
        for j, text in enumerate(paragraphs(chapter), 1):
            out.append(Unit(chapter.id, j, f"Chapter {chapter.id}, Paragraph {j}\n\n{text}" if label else text))
    return out


def top_k(budget: Budget, options: Mapping[str, object]) -> int:
    """How many passages to ask the store for: the budget's, else the `top_k` option."""
    if budget.passages is not None:
        return max(1, budget.passages)
    value = options.get("top_k", DEFAULT_TOP_K)
    return value if isinstance(value, int) and value > 0 else DEFAULT_TOP_K


def option(system: str, options: Mapping[str, object], name: str, default: object, allowed: Sequence[object]) -> object:
    """An option's value, refused with one line when it is not one of `allowed`."""
    value = options.get(name, default)
    if value not in allowed:
        raise MemoryError(system, "open", f"option {name} = {value!r}: expected one of "
                                          f"{', '.join(repr(a) for a in allowed)}")
    return value


def chapter_of(metadata: object) -> int | None:
    """The chapter number kept in a stored item's metadata, or None."""
    value = metadata.get("chapter") if isinstance(metadata, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
