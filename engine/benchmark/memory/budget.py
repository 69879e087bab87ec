"""The run's evidence budget, what it cuts, and how well the evidence kept
covers the ground truth.

Every memory system of a run gets the same budget (`--evidence-passages`,
`--evidence-tokens`). The default is the paper's own: the largest evidence
either of its RAG modes can give on the book -- top-K chapters (K the most
matching chapters of any question: 17 on the long book, 3 on the short one)
or 4K paragraphs, whichever holds more tokens -- so the built-in RAG modes
are never cut and an outside system gets exactly as much room as they had.

Tokens are cl100k_base over the passages' texts (the tokenizer Tulving
estimates every model's prompts with), the same count for every system.
Evidence beyond the budget is cut whole passages at a time from the last
(least relevant) one, and the cut is counted on the question.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from engine.benchmark.evaluation import rag
from engine.benchmark.evaluation.answers import RAG_CHAPTER, RAG_PARAGRAPH
from engine.benchmark.evaluation.questions import Question
from engine.benchmark.memory.contract import Budget, Passage
from engine.tokens import count_tokens


@lru_cache(maxsize=65536)
def passage_tokens(text: str) -> int:
    return count_tokens(text)


def paper_budget(book_text: str, questions: Sequence[Question]) -> Budget:
    """The largest evidence the paper's RAG modes give on this book (see above)."""
    chapters_k = rag.top_k(questions, RAG_CHAPTER)
    paragraphs_k = rag.top_k(questions, RAG_PARAGRAPH)
    chapter_sizes = sorted((passage_tokens(c) for c in rag.chapter_chunks(book_text)), reverse=True)
    paragraph_sizes = sorted((passage_tokens(p) for p in rag.paragraph_chunks(book_text)), reverse=True)
    tokens = max(sum(chapter_sizes[:chapters_k]), sum(paragraph_sizes[:paragraphs_k]))
    return Budget(passages=paragraphs_k, tokens=tokens)


@dataclass(frozen=True, slots=True)
class Evidence:
    """One question's evidence after the budget: the passages kept, what
    was cut, and (agent style) the system's answer."""

    passages: tuple[Passage, ...] = ()
    answer: str | None = None
    tokens: int = 0
    cut_passages: int = 0
    cut_tokens: int = 0
    error: str | None = None  # the recall failed: no evidence, the question is not answered

    @property
    def chapters(self) -> list[int | None]:
        return [p.chapter for p in self.passages]


def within_budget(passages: Sequence[Passage], budget: Budget | None, answer: str | None = None) -> Evidence:
    """`passages` cut to `budget` (None: kept whole: the in-context book and
    the fine-tuned weights have no budget)."""
    if budget is None:
        return Evidence(tuple(passages), answer, sum(passage_tokens(p.text) for p in passages))
    kept: list[Passage] = []
    used = cut_tokens = 0
    for n, passage in enumerate(passages):
        size = passage_tokens(passage.text)
        over_count = budget.passages is not None and n >= budget.passages
        over_tokens = budget.tokens is not None and used + size > budget.tokens
        if over_count or over_tokens:
            cut_tokens += sum(passage_tokens(p.text) for p in passages[n:])
            return Evidence(tuple(kept), answer, used, len(passages) - n, cut_tokens)
        kept.append(passage)
        used += size
    return Evidence(tuple(kept), answer, used, 0, 0)


def coverage(evidence_chapters: Sequence[int | None], ground_truth: Sequence[int]) -> tuple[float | None, float | None]:
    """(recall, precision) of the distinct chapters the evidence came from
    against the question's ground-truth chapters. Recall is undefined (None)
    for a question without ground truth; precision for evidence naming no
    chapter. Passages without a chapter count for neither."""
    found = {c for c in evidence_chapters if c is not None}
    truth = set(ground_truth)
    hits = len(found & truth)
    recall = hits / len(truth) if truth else None
    precision = hits / len(found) if found else None
    return recall, precision
