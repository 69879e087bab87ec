"""What a latency benchmark sends: synthetic prompts of a chosen length, or the
benchmark's own questions over a book.

- `synthetic(input_tokens, nonce)`: prompts of about `input_tokens` cl100k
  tokens (the server's own count is read from its usage, never this one),
  each opening with a unique tag (run nonce + index), so neither a server's
  prefix cache nor an identical call joins two requests; then an instruction
  to write at length over a fixed filler of common words. The reply's length
  is set by `max_tokens` (and, on vLLM/SGLang servers, `--ignore-eos`).
- `book_questions(book, mode)`: the book's question set (engine/benchmark/evaluation/
  questions.py) as answering prompts (engine/benchmark/evaluation/answers.py): mode
  `in-context` (the whole book, then the question: provider prompt caches see
  the shared book prefix, as in a real run) or `finetuned` (the question
  alone), taken in turn and cycled.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.benchmark.evaluation.answers import FINETUNED, IN_CONTEXT, book_title, finetuned_prompt, in_context_prompt
from engine.benchmark.evaluation.answers import messages as answer_messages
from engine.benchmark.evaluation.questions import as_book, build_questions
from engine.tokens import count_tokens
from providers.base import TulvingError

BOOK_MODES = (IN_CONTEXT, FINETUNED)

# Common English words, about one cl100k token each with their leading space.
_WORDS = ("time year people way day man thing woman life child world school state family student group country "
          "problem hand part place case week company system program question work government number night point "
          "home water room mother area money story fact month lot right study book eye job word business issue "
          "side kind head house service friend father power hour game line end member law car city community "
          "name president team minute idea kid body information back parent face others level office door "
          "health person art war history party result change morning reason research girl guy moment air "
          "teacher force education").split()

Messages = list[dict[str, str]]


@dataclass(frozen=True, slots=True)
class PromptSet:
    describe: str                       # one line for the report
    messages: Callable[[int], Messages]  # request index -> the chat messages


def _filler(tokens: int) -> str:
    words = list(itertools.islice(itertools.cycle(_WORDS), max(0, tokens)))
    return " ".join(words)


def synthetic(input_tokens: int, nonce: str) -> PromptSet:
    """Prompts of about `input_tokens` tokens (at least the instruction's ~20)."""
    if input_tokens < 1:
        raise TulvingError(f"--input-tokens must be at least 1, got {input_tokens}")
    head = f"Request {nonce}-0000. Write a long, detailed story that uses each of these words in turn:"
    overhead = count_tokens(head + " ")
    n = max(0, input_tokens - overhead)
    body = _filler(n)
    # Adjust the filler once to the tokenizer's actual count (words merge rarely).
    error = count_tokens(f"{head} {body}") - input_tokens
    if error and n - error >= 0:
        body = _filler(n - error)

    def messages(i: int) -> Messages:
        return [{"role": "user", "content": f"Request {nonce}-{i:04d}. Write a long, detailed story that uses "
                                            f"each of these words in turn: {body}"}]

    return PromptSet(describe=f"synthetic, ~{input_tokens} input tokens (cl100k)", messages=messages)


def book_questions(book_name: str, mode: str = IN_CONTEXT) -> PromptSet:
    if mode not in BOOK_MODES:
        raise TulvingError(f"--mode for the latency benchmark must be one of {', '.join(BOOK_MODES)}, got {mode!r}")
    book = as_book(book_name)
    questions: Sequence[str] = [q.question for q in build_questions(book)]
    title = book_title(book)
    text = book.text

    def messages(i: int) -> Messages:
        question = questions[i % len(questions)]
        prompt = in_context_prompt(text, question) if mode == IN_CONTEXT else finetuned_prompt(question, title)
        return answer_messages(prompt)

    return PromptSet(describe=f"{len(questions)} questions of {book_name}, {mode}", messages=messages)
