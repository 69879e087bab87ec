"""Retrieval for the RAG memory modes: chunking, embeddings, top-K, context fit.

Chunks (protocol.md, Answers; as the reference implementation built them):
- chapter chunks are `book.split("\\n\\n\\n")`;
- paragraph chunks are `"Chapter {k}, Paragraph {j}\\n\\n{paragraph}"`, the
  paragraphs of chapter k being its non-empty lines after the heading.

top-K is the largest number of matching chapters of any question (17 on the
long book, 3 on the short one) for chapters, 4 times that for paragraphs.

Embeddings go through the engine as `EmbedRequest`s in fixed batches, so the
engine caches them and a rerun makes no call. Similarity is the cosine, with
numpy; chunks are returned most similar first (ties: book order).

A model with a small context (the local SmolLM2: 8,192 tokens) gets fewer
chunks, dropped from the least similar, so that the prompt fits.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import numpy as np

from engine.benchmark.evaluation.answers import RAG_CHAPTER, RAG_PARAGRAPH, format_chunks, rag_prompt
from engine.benchmark.evaluation.questions import Question, build_questions
from engine.benchmark.generation.bookdir import Book
from engine.config import ModelAlias
from engine.requests import EmbedRequest, Outcome
from engine.tokens import count_tokens
from providers.base import EmbedResult, TulvingError

EMBED_BATCH = 256  # texts per embeddings call (OpenAI accepts up to 2048)
PARAGRAPHS_PER_CHAPTER = 4  # date, location, entity, content: at most 4 paragraphs hold an event

# Token counts are cl100k; other tokenizers (SmolLM2's) give up to ~6% more on
# book text, and the chat template adds a few tokens: keep a margin.
TOKEN_MARGIN = 1.15
TEMPLATE_OVERHEAD = 64

_HEADING = re.compile(r"Chapter (\d+)")


def chapter_chunks(book_text: str) -> list[str]:
    return [c.strip() for c in book_text.split("\n\n\n") if c.strip()]


def paragraph_chunks(book_text: str) -> list[str]:
    chunks: list[str] = []
    for k, chapter in enumerate(chapter_chunks(book_text), 1):
        lines = [line.strip() for line in chapter.split("\n") if line.strip()]
        heading = _HEADING.fullmatch(lines[0]) if lines else None
        if heading:
            k = int(heading.group(1))
            lines = lines[1:]
        chunks.extend(f"Chapter {k}, Paragraph {j}\n\n{p}" for j, p in enumerate(lines, 1))
    return chunks


def chunks_for_mode(book_text: str, mode: str) -> list[str]:
    if mode == RAG_CHAPTER:
        return chapter_chunks(book_text)
    if mode == RAG_PARAGRAPH:
        return paragraph_chunks(book_text)
    raise ValueError(f"{mode} is not a RAG mode")


def index_texts(book: Book) -> list[str]:
    """Every text a RAG run on `book` may embed, once each: its chunks in both
    RAG modes and its question set's texts (providers/embed_table.py ships
    the vectors of the default book's)."""
    chunks = chapter_chunks(book.text) + paragraph_chunks(book.text)
    return list(dict.fromkeys(chunks + [q.question for q in build_questions(book)]))


def top_k(questions: Iterable[Question], mode: str) -> int:
    most = max((q.n_chapters for q in questions), default=0)
    most = max(most, 1)
    return most * PARAGRAPHS_PER_CHAPTER if mode == RAG_PARAGRAPH else most


class EmbedRunner(Protocol):
    """What retrieval needs of the engine: `Engine.run` (or a wrapper that counts its calls)."""

    async def run(self, requests: Sequence[EmbedRequest], *, label: str = "") -> list[Outcome]: ...


async def embed_texts(engine: EmbedRunner, model: str, texts: Sequence[str], *, batch: int = EMBED_BATCH,
                      label: str = "") -> np.ndarray:
    """Unit-normalised vectors, one row per text, through the engine."""
    if not texts:
        return np.zeros((0, 0))
    requests = [EmbedRequest(model=model, texts=list(texts[i:i + batch]), tag=i)
                for i in range(0, len(texts), batch)]
    outcomes = await engine.run(requests, label=label or f"embeddings ({model})")
    rows: list[list[float]] = []
    for outcome in outcomes:
        result, request = outcome.result, outcome.request
        if not isinstance(result, EmbedResult) or not isinstance(request, EmbedRequest):
            raise TulvingError(f"embedding with {model} failed: {outcome.error}")
        vectors = result.vectors
        if len(vectors) != len(request.texts):
            raise TulvingError(f"embedding with {model} returned {len(vectors)} vectors "
                               f"for {len(request.texts)} texts")
        rows.extend(vectors)
    matrix = np.asarray(rows, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms == 0, 1.0, norms)


def rank(similarities: np.ndarray, k: int) -> list[int]:
    """Indices of the k most similar, most similar first; ties keep book order."""
    order = np.argsort(-similarities, kind="stable")
    return [int(i) for i in order[:k]]


@dataclass(slots=True)
class Retrieval:
    """The retrieved chunks of every question of one (book, mode, embedder)."""

    mode: str
    chunks: list[str]
    k: int
    ranked: dict[str, list[int]]  # question text -> chunk indices, best first

    def chunks_for(self, question_text: str) -> list[str]:
        return [self.chunks[i] for i in self.ranked[question_text]]


async def retrieve(engine: EmbedRunner, book_text: str, questions: Sequence[Question], mode: str,
                   embed_model: str) -> Retrieval:
    """Embed the chunks and the questions, keep each question's top-K."""
    chunks = chunks_for_mode(book_text, mode)
    k = top_k(questions, mode)
    texts = list(dict.fromkeys(q.question for q in questions))
    chunk_vectors = await embed_texts(engine, embed_model, chunks, label=f"embed {mode} chunks ({embed_model})")
    question_vectors = await embed_texts(engine, embed_model, texts, label=f"embed questions ({embed_model})")
    if len(texts) and chunk_vectors.shape[1] != question_vectors.shape[1]:
        raise TulvingError(f"embedding model {embed_model} returned vectors of different sizes")
    similarities = question_vectors @ chunk_vectors.T if texts else np.zeros((0, len(chunks)))
    ranked = {text: rank(similarities[i], k) for i, text in enumerate(texts)}
    return Retrieval(mode=mode, chunks=chunks, k=k, ranked=ranked)


# -- fitting a small context ----------------------------------------------------

@lru_cache(maxsize=65536)
def _tokens(text: str) -> int:
    return count_tokens(text)


def estimate_tokens(text: str) -> int:
    return math.ceil(_tokens(text) * TOKEN_MARGIN)


def prompt_budget(context_tokens: int, max_output_tokens: int) -> int:
    return context_tokens - max_output_tokens - TEMPLATE_OVERHEAD


def fit_chunks(chunks: Sequence[str], question: str, *, context_tokens: int | None,
               max_output_tokens: int = 0, model: str = "the model") -> list[str]:
    """The longest prefix of `chunks` (most similar first) whose prompt fits the
    context with room for the answer; a clear error if even none fit."""
    if not context_tokens:
        return list(chunks)
    budget = prompt_budget(context_tokens, max_output_tokens)
    used = estimate_tokens(rag_prompt([], question))
    if used > budget:
        raise TulvingError(f"{model}: the question prompt alone needs ~{used} tokens, more than its "
                           f"{context_tokens}-token context leaves after {max_output_tokens} answer tokens")
    kept: list[str] = []
    for chunk in chunks:
        cost = estimate_tokens(format_chunks([chunk]))
        if used + cost > budget:
            break
        used += cost
        kept.append(chunk)
    return kept


def check_in_context_fits(alias: ModelAlias, book_tokens: int) -> None:
    """One-line error before sending when the whole book cannot fit."""
    context = getattr(alias, "context_tokens", None)
    if not context:
        return
    max_out = int((getattr(alias, "params", {}) or {}).get("max_tokens") or 0)
    needed = book_tokens + max_out + TEMPLATE_OVERHEAD + 200  # + the prompt's own words
    if needed > context:
        raise TulvingError(f"model {alias.name} has a {context}-token context but in-context answering needs "
                           f"~{needed} tokens (book: {book_tokens}); use --modes rag-paragraph or rag-chapter")
