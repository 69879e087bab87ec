"""Answer prompts, one per memory mode, and the lazy stream of answer requests.

The prompts are the paper's (appendix "Generating answers using in-context,
RAG, and fine-tuned models"), character for character, including the trailing
newline of the reference implementation. Every answering call has the system
prompt "You are an expert in memory tests." (protocol.md, Answers).

Modes:
- ``in-context``: the whole book, then the question.
- ``rag-paragraph`` / ``rag-chapter``: the top-K retrieved chunks (see rag.py),
  most similar first, each as ``\\n\\n\"\"\"\\n{chunk}\\n\"\"\"``.
- ``finetuned``: the question only, behind the fine-tuning preamble (the
  reference's string, literal "/n/n " included); the model is expected to
  hold the book in its weights (see finetune.py).
- ``no-memory``: the RAG prompt around no chunk: the question alone, the
  floor every memory system should clear (not in the paper).

Every mode is a memory system (engine/benchmark/memory/builtin.py); outside
memory systems' evidence is prompted as RAG chunks.

In-context prompts are book-sized: `answer_requests` is a generator so that at
most the engine's in-flight window of them exists at any time.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

from engine.errors import did_you_mean
from engine.requests import ChatRequest, RequestSettings
from providers.base import TulvingError

if TYPE_CHECKING:  # annotations only: `tulving run --help` lists MODES without loading books
    from engine.benchmark.evaluation.questions import Question
    from engine.benchmark.generation.bookdir import Book

SYSTEM_PROMPT = "You are an expert in memory tests."

IN_CONTEXT = "in-context"
RAG_PARAGRAPH = "rag-paragraph"
RAG_CHAPTER = "rag-chapter"
FINETUNED = "finetuned"
NO_MEMORY = "no-memory"
MODES = (IN_CONTEXT, RAG_PARAGRAPH, RAG_CHAPTER, FINETUNED, NO_MEMORY)
RAG_MODES = (RAG_PARAGRAPH, RAG_CHAPTER)

# Title of the published book, as the fine-tuned models were trained with it.
PUBLISHED_TITLE = "Synaptic Echoes 2026: The Neuro-Temporal Paradox of Episodic Precognition"

_IN_CONTEXT_TEMPLATE = """# Episodic Memory Benchmark

You are participating in an episodic memory test. You will be presented with a text to read and internalize as if you had personally experienced the events described. After the text, you will find a question about the content. Please answer this question based solely on the information provided in the text.

## The Text to Memorize:

{book_content}

## Question:

{question}

Please answer the question to the best of your ability, based only on the information provided in the text above. If you are unsure about an answer, it's okay to say so. Do not invent or assume information that was not explicitly stated in the text.
"""

_RAG_TEMPLATE = """# Episodic Memory Benchmark

You are participating in an episodic memory test, based on the data below, which was retrieved from a book. You need to read it and internalize as if you had personally experienced the events described. After the text, you will find a question about the content. Please answer this question based solely on the information provided in the retrieved data.

## Retrieved Relevant Chunks from the Book:

{book_chunks}

## Question:

{question}

Please answer the question to the best of your ability, based only on the information provided in the relevant chunks above. If you are unsure about an answer, it's okay to say so. Do not invent or assume information that was not explicitly stated in the text.
"""

# reference: epbench/src/generation/benchmark_generation_wrapper.py,
# get_user_prompt_for_finetuning, verbatim: f"{preprompt}/n/n Question: {question}", with a
# literal "/n/n " (not newlines) -- the string the published fine-tuned models were
# trained on and queried with (protocol.md, Answers).
_FINETUNED_TEMPLATE = (
    'This question is about the book "{title}". All events in this book are purely fictional and do not '
    "correspond to real-world timelines. Please answer based solely on the content of this fictional story."
    "/n/n Question: {question}"
)

# reference: benchmark_generation_wrapper.py, fine_tuning_system_prompt (training data only:
# answering calls keep SYSTEM_PROMPT, as the reference's generate_answers_func does).
_FINETUNING_SYSTEM_TEMPLATE = 'You are an expert in memory tests regarding the fictional book "{title}".'


def check_mode(mode: str) -> str:
    if mode not in MODES:
        guess = did_you_mean(mode, MODES)
        raise TulvingError(f"unknown memory mode {mode!r}{': ' + guess if guess else ''} (known: {', '.join(MODES)})")
    return mode


def in_context_prompt(book_text: str, question: str) -> str:
    return _IN_CONTEXT_TEMPLATE.format(book_content=book_text, question=question)


def in_context_prefix_chars(book_text: str) -> int:
    """Characters of an in-context prompt shared by every question of the
    book: the preamble and the book, up to the question (which comes last, so
    the providers' prompt caches hold the book once for all questions)."""
    head = _IN_CONTEXT_TEMPLATE[:_IN_CONTEXT_TEMPLATE.index("{question}")]
    return len(head) - len("{book_content}") + len(book_text)


def format_chunks(chunks: Sequence[str]) -> str:
    """Retrieved chunks, most similar first, as the reference implementation joined them."""
    return "".join(f'\n\n"""\n{chunk}\n"""' for chunk in chunks)


def rag_prompt(chunks: Sequence[str], question: str) -> str:
    return _RAG_TEMPLATE.format(book_chunks=format_chunks(chunks), question=question)


def book_title(book: Book) -> str:
    """The title a fine-tuned model knows the book by."""
    title = getattr(book, "title", None)
    if title:
        return str(title)
    name = str(getattr(book, "name", "") or "")
    if name.startswith("synaptic-echoes"):
        return PUBLISHED_TITLE
    return name or "the book"


def finetuned_prompt(question: str, title: str = PUBLISHED_TITLE) -> str:
    """The user turn of a fine-tuning example, and of a `finetuned` answering call."""
    return _FINETUNED_TEMPLATE.format(title=title, question=question)


def finetuning_system_prompt(title: str = PUBLISHED_TITLE) -> str:
    """The system turn of the fine-tuning examples (it names the book)."""
    return _FINETUNING_SYSTEM_TEMPLATE.format(title=title)


def messages(user_prompt: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user_prompt}]


def answer_requests(questions: Iterable[Question], *, model: str, mode: str, book: Book,
                    chunks_for: Callable[[Question], Sequence[str]] | None = None,
                    tag: Callable[[Question], object] = lambda q: q.q_idx, draw: int = 0,
                    settings: RequestSettings | None = None) -> Iterator[ChatRequest]:
    """One answering request per question, built only when the consumer asks
    for it. `chunks_for(question)` gives the retrieved chunks (RAG modes);
    `draw`: the repeat (`--repeats`), an independent sample cached on its own;
    `settings`: the run's --temperature / --max-tokens, on every request."""
    check_mode(mode)
    if mode in RAG_MODES and chunks_for is None:
        raise ValueError(f"mode {mode} needs chunks_for")
    title = book_title(book)
    # In-context: the user turn's book part is the prefix every question shares.
    shared = (1, in_context_prefix_chars(book.text)) if mode == IN_CONTEXT else None
    for q in questions:
        if mode == IN_CONTEXT:
            prompt = in_context_prompt(book.text, q.question)
        elif mode == FINETUNED:
            prompt = finetuned_prompt(q.question, title)
        elif mode == NO_MEMORY:
            prompt = rag_prompt([], q.question)
        else:
            assert chunks_for is not None  # a RAG mode: checked above
            prompt = rag_prompt(chunks_for(q), q.question)
        request = ChatRequest(model=model, messages=messages(prompt), tag=tag(q), prefix_end=shared, draw=draw)
        yield settings.apply(request) if settings is not None else request
