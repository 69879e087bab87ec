"""The run's evidence budget, what it cuts, and how well the evidence kept
covers the ground truth.

Every memory system of a run gets the same budget (`--evidence-passages`,
`--evidence-tokens`). The default is the paper's own: the largest evidence
either of its RAG modes can give on the book -- top-K chapters (K the most
matching chapters of any question: 17 on the long book, 3 on the short one)
or 4K paragraphs, whichever holds more tokens -- so the built-in RAG modes
are never cut and an outside system gets exactly as much room as they had.

Tokens are counted over the passages' texts in the answering model's
tokenizer (`Budget.tokenizer`: o200k_base for OpenAI's models that use it,
else cl100k_base, the stand-in where a provider publishes no offline
tokenizer: providers/tokens.py), the same count for every system read by
that model; the paper's budget is computed in that tokenizer too, so the
built-in RAG modes are never cut whoever reads them. Evidence beyond the
budget is cut whole passages at a time from the last (least relevant) one,
and the cut is counted on the question.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from engine.benchmark.evaluation import rag
from engine.benchmark.evaluation.answers import RAG_CHAPTER, RAG_PARAGRAPH
from engine.benchmark.evaluation.questions import Question
from engine.benchmark.memory.contract import Budget, Passage
from engine.tokens import CL100K_BASE, count_tokens


@lru_cache(maxsize=65536)
def passage_tokens(text: str, tokenizer: str) -> int:
    return count_tokens(text, tokenizer)


def paper_budget(book_text: str, questions: Sequence[Question], tokenizer: str = CL100K_BASE) -> Budget:
    """The largest evidence the paper's RAG modes give on this book (see
    above), its tokens counted in `tokenizer`."""
    chapters_k = rag.top_k(questions, RAG_CHAPTER)
    paragraphs_k = rag.top_k(questions, RAG_PARAGRAPH)
    chapter_sizes = sorted((passage_tokens(c, tokenizer) for c in rag.chapter_chunks(book_text)), reverse=True)
    paragraph_sizes = sorted((passage_tokens(p, tokenizer) for p in rag.paragraph_chunks(book_text)), reverse=True)
    tokens = max(sum(chapter_sizes[:chapters_k]), sum(paragraph_sizes[:paragraphs_k]))
    return Budget(passages=paragraphs_k, tokens=tokens, tokenizer=tokenizer)


def loosest(budgets: Iterable[Budget]) -> Budget:
    """The budget that lets most through: the largest token figure (None, no
    limit, the largest), then the most passages; on a tie the first in
    tokenizer order. What a memory system read by models of different
    tokenizers is handed: each reader's rows are then cut to their own."""
    ordered = sorted(budgets, key=lambda b: b.tokenizer)
    if not ordered:
        return Budget()
    return max(ordered, key=lambda b: (b.tokens is None, b.tokens or 0, b.passages is None, b.passages or 0))


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
    """`passages` cut to `budget`, counted in its tokenizer (None: kept whole,
    counted in cl100k_base: the in-context book and the fine-tuned weights
    have no budget)."""
    if budget is None:
        return Evidence(tuple(passages), answer, sum(passage_tokens(p.text, CL100K_BASE) for p in passages))
    kept: list[Passage] = []
    used = cut_tokens = 0
    for n, passage in enumerate(passages):
        size = passage_tokens(passage.text, budget.tokenizer)
        over_count = budget.passages is not None and n >= budget.passages
        over_tokens = budget.tokens is not None and used + size > budget.tokens
        if over_count or over_tokens:
            cut_tokens += sum(passage_tokens(p.text, budget.tokenizer) for p in passages[n:])
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
