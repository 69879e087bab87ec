"""The paper's memory modes and the no-memory baseline, as memory systems.

They keep the contract every outside system keeps (contract.py) and give
exactly what the paper's modes gave (protocol.md, Answers):

- `in-context`: every chapter, which the reader gets as the whole book in
  the paper's in-context prompt (the passages joined back are the book's
  text, byte for byte);
- `rag-paragraph` / `rag-chapter`: the book's chunks as the reference cut
  them (engine/benchmark/evaluation/rag.py), embedded through the run's
  embedding model in the reference's batches (so earlier runs' cached
  vectors answer), the top-K most similar to the question by cosine;
- `finetuned`: nothing (the book is in the model's weights), with the
  paper's fine-tuning prompt;
- `no-memory`: nothing, with the RAG prompt around no passage: the question
  alone, the floor every memory system should clear.

K is the paper's: the most matching chapters of any question of the set,
4 times that for paragraphs. The run computes it from the question set and
hands it over as the `k` option: the systems themselves never see the set.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from engine.benchmark.evaluation import rag
from engine.benchmark.evaluation.answers import FINETUNED as FINETUNED_MODE
from engine.benchmark.evaluation.answers import IN_CONTEXT, NO_MEMORY, RAG_CHAPTER, RAG_PARAGRAPH
from engine.benchmark.memory.contract import (
    BOOK,
    FINETUNED,
    Budget,
    Chapter,
    MemorySystem,
    Passage,
    Recall,
)

_HEADING = re.compile(r"Chapter (\d+)")


def book_text(chapters: Sequence[Chapter] | Sequence[Passage]) -> str:
    """The book as book.txt holds it, from its chapters in book order."""
    return "\n\n\n".join(f"Chapter {_number(c)}\n\n{c.text}" for c in chapters)


def _number(chapter: Chapter | Passage) -> int | None:
    return chapter.id if isinstance(chapter, Chapter) else chapter.chapter


def _unit_rows(matrix: np.ndarray) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)


class InContextMemory(MemorySystem):
    description = "the whole book in the prompt (the paper's in-context mode)"
    prompt = BOOK
    concurrency = 64

    def __init__(self, name: str = IN_CONTEXT, options: Mapping[str, object] | None = None):
        super().__init__(name, options)
        self._all: tuple[Passage, ...] = ()

    async def ingest(self, chapters: Sequence[Chapter]) -> None:
        self._all = tuple(Passage(text=c.text, chapter=c.id) for c in chapters)

    async def recall(self, question: str, budget: Budget) -> Recall:
        return Recall(passages=self._all)  # one tuple for every question: the book is held once


class RagMemory(MemorySystem):
    """The reference's RAG: chunks, embeddings through the run, cosine top-K."""

    concurrency = 64

    def __init__(self, name: str = RAG_PARAGRAPH, options: Mapping[str, object] | None = None):
        super().__init__(name, options)
        self.mode = str(self.options.get("chunks", name))
        if self.mode not in (RAG_PARAGRAPH, RAG_CHAPTER):
            raise ValueError(f"RagMemory chunks must be {RAG_PARAGRAPH} or {RAG_CHAPTER}, not {self.mode!r}")
        self.description = f"the paper's RAG over {'paragraphs' if self.mode == RAG_PARAGRAPH else 'chapters'}"
        self.k = int(self.options["k"]) if self.options.get("k") else None  # type: ignore[call-overload]
        self._chunks: list[str] = []
        self._chapters: list[int | None] = []
        self._vectors = np.zeros((0, 0))

    async def ingest(self, chapters: Sequence[Chapter]) -> None:
        self._chunks = rag.chunks_for_mode(book_text(chapters), self.mode)
        self._chapters = [_chunk_chapter(c) for c in self._chunks]
        self._vectors = _unit_rows(await self.services.embed(self._chunks)) if self._chunks else np.zeros((0, 0))

    async def recall(self, question: str, budget: Budget) -> Recall:
        if not self._chunks:
            return Recall()
        vector = _unit_rows(await self.services.embed([question]))
        if vector.shape[1] != self._vectors.shape[1]:
            raise ValueError(f"the embedding model returned vectors of different sizes "
                             f"({vector.shape[1]} and {self._vectors.shape[1]})")
        similarities = (vector @ self._vectors.T)[0]
        limits = [n for n in (self.k, budget.passages) if n is not None]
        picked = rag.rank(similarities, min(limits) if limits else len(self._chunks))
        return Recall(passages=[Passage(text=self._chunks[i], chapter=self._chapters[i],
                                        score=float(similarities[i])) for i in picked])


def _chunk_chapter(chunk: str) -> int | None:
    heading = _HEADING.match(chunk)
    return int(heading.group(1)) if heading else None


class FinetunedMemory(MemorySystem):
    description = "nothing retrieved: the book is in the fine-tuned model's weights (the paper's fine-tuned mode)"
    prompt = FINETUNED
    concurrency = 64

    def __init__(self, name: str = FINETUNED_MODE, options: Mapping[str, object] | None = None):
        super().__init__(name, options)

    async def ingest(self, chapters: Sequence[Chapter]) -> None:
        return None

    async def recall(self, question: str, budget: Budget) -> Recall:
        return Recall()


class NoMemory(MemorySystem):
    description = "the question alone, in the RAG prompt around no passage (the floor)"
    concurrency = 64

    def __init__(self, name: str = NO_MEMORY, options: Mapping[str, object] | None = None):
        super().__init__(name, options)

    async def ingest(self, chapters: Sequence[Chapter]) -> None:
        return None

    async def recall(self, question: str, budget: Budget) -> Recall:
        return Recall()

