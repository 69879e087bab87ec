"""`tulving finetune`: the fine-tuning data of a book, and an OpenAI job on it.

Training data (protocol.md, Answers; paper, appendix "Selection of the
fine-tuning questions"): one chat example per single-event question (a cue
matching exactly one chapter), `{"messages": [system, user, assistant]}`,
with the reference's strings (benchmark_generation_wrapper.py): the system
turn names the book ('You are an expert in memory tests regarding the
fictional book "<title>".'), the user turn is exactly the prompt the
`finetuned` memory mode sends (engine/benchmark/evaluation/answers.py, literal "/n/n "
included) and the assistant turn lists the ground-truth items ("a, b, and
c"), or is the chapter text for full-detail questions.

The job goes through the OpenAI fine-tuning API (providers/openai_finetune.py,
official SDK); the resulting model id is recorded in a JSON file, with the
config snippet that declares it as a model alias for `--modes finetuned`.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from engine.benchmark.evaluation.answers import book_title, finetuned_prompt, finetuning_system_prompt
from engine.benchmark.evaluation.questions import Question
from engine.benchmark.evaluation.templates import FULL_DETAILS
from engine.benchmark.generation.bookdir import Book
from engine.config import Config, ModelAlias
from providers.base import TulvingError
from providers.kinds import kind_of
from providers.openai_finetune import submit_finetune
from providers.tokens import count_chat_tokens


def format_items(items: list[str]) -> str:
    """"a", "a, and b", "a, b, and c" -- as the published training answers."""
    if not items:
        return ""
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + f", and {items[-1]}"


# One chat example of the fine-tuning file: {"messages": [{"role": ..., "content": ...}, ...]}
ChatExample = dict[str, list[dict[str, str]]]


def training_examples(book: Book, questions: Iterable[Question]) -> list[ChatExample]:
    title = book_title(book)
    system = finetuning_system_prompt(title)
    examples = []
    for q in questions:
        if q.retrieval_type == FULL_DETAILS:
            answer = book.chapter_texts[q.chapters[0] - 1]
        else:
            answer = format_items(list(q.correct_answer))
        examples.append({"messages": [{"role": "system", "content": system},
                                      {"role": "user", "content": finetuned_prompt(q.question, title)},
                                      {"role": "assistant", "content": answer}]})
    return examples


def write_training_file(path: str | os.PathLike[str], examples: Iterable[ChatExample]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as fh:
        for example in examples:
            fh.write(json.dumps(example, ensure_ascii=False) + "\n")
    return path


# OpenAI's fine-tuning prices by base model, USD per million tokens: the
# pricing page's "Fine-tuning" table (Standard), checked 2026-11-26 (a stored
# copy of developers.openai.com/api/docs/pricing, found through the search
# index, not fetched live). A fine-tuned model is billed more than its base:
# these inference prices (in, cached in, out), not the base model's, are what
# calls to it cost. Training is billed per training token (the file's tokens
# times the epochs). The same page says OpenAI is winding the fine-tuning
# platform down: closed to new users, existing users may create jobs "for the
# coming months", and fine-tuned models stay callable until their base model
# is deprecated.
FINETUNED_PRICES: dict[str, tuple[float, float, float]] = {
    "gpt-4o-mini-2024-07-18": (0.30, 0.15, 1.20),
    "gpt-4o-2024-08-06": (3.75, 1.875, 15.00),
    "gpt-4.1-2025-04-14": (3.00, 0.75, 12.00),
    "gpt-4.1-mini-2025-04-14": (0.80, 0.20, 3.20),
    "gpt-4.1-nano-2025-04-14": (0.20, 0.05, 0.80),
}
TRAINING_PRICES: dict[str, float] = {  # USD per million training tokens
    "gpt-4o-mini-2024-07-18": 3.00,
    "gpt-4o-2024-08-06": 25.00,
    "gpt-4.1-2025-04-14": 25.00,
    "gpt-4.1-mini-2025-04-14": 5.00,
    "gpt-4.1-nano-2025-04-14": 1.50,
}
FINETUNED_PRICES_CHECKED = "2026-11-26"
FINETUNING_WIND_DOWN = ("OpenAI is winding its fine-tuning platform down (pricing page, checked 2026-11-26): it "
                        "no longer takes new users; fine-tuned models stay callable until their base model is "
                        "deprecated")


def training_tokens(examples: Iterable[ChatExample]) -> int:
    """Tokens of one pass over the training file (cl100k_base, what the
    estimate can count locally; OpenAI's own count may differ a little)."""
    return sum(count_chat_tokens(example["messages"]) for example in examples)


def training_cost(base_model: str, tokens_per_epoch: int, epochs: int) -> float | None:
    """Estimated USD of training `base_model` (None when its price is not known)."""
    price = TRAINING_PRICES.get(base_model)
    return None if price is None else tokens_per_epoch * epochs * price / 1e6


def alias_snippet(alias_name: str, endpoint: str, model_id: str, base_alias: ModelAlias | None = None,
                  base_model: str | None = None) -> str:
    """TOML declaring the fine-tuned model as an alias, with the prices of a
    model fine-tuned from `base_model` (FINETUNED_PRICES); when they are not
    known, commented price keys to fill in (never the base model's prices:
    a fine-tuned model is billed more)."""
    lines = [f'[models."{alias_name}"]', f'endpoint = "{endpoint}"', f'model = "{model_id}"',
             "params = { temperature = 1.0, max_tokens = 4096 }"]
    base = base_model or (base_alias.model if base_alias is not None else None)
    prices = FINETUNED_PRICES.get(base or "")
    if prices is not None:
        price_in, cached_in, price_out = prices
        lines += [f"price_in = {price_in}", f"price_cached_in = {cached_in}", f"price_out = {price_out}",
                  f'checked = "{FINETUNED_PRICES_CHECKED}"  # fine-tuned {base} prices']
    else:
        lines += [f"# fine-tuned prices of {base or 'this base model'} are not known to Tulving: set them from "
                  "your provider's pricing page", "# price_in = ...", "# price_out = ..."]
    if base_alias is not None and base_alias.context_tokens is not None:
        lines.append(f"context_tokens = {base_alias.context_tokens}")
    return "\n".join(lines) + "\n"


# The paper's fine-tuning settings: 30 epochs, batch size 64, learning-rate multiplier 1.8.
PAPER_HYPERPARAMETERS = {"n_epochs": 30, "batch_size": 64, "learning_rate_multiplier": 1.8}


async def run_finetune(config: Config, *, endpoint: str, model: str, training_file: Path,
                       suffix: str | None, poll_interval: float, timeout: float,
                       hyperparameters: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = config.endpoints.get(endpoint)
    if spec is None:
        raise TulvingError(f"unknown endpoint {endpoint!r} (known: {', '.join(sorted(config.endpoints))})")
    if not kind_of(spec).capabilities.fine_tuning or not spec.base_url:
        raise TulvingError(f"endpoint {endpoint!r} cannot fine-tune: its kind {spec.kind!r} has no fine-tuning API "
                           "or it has no base_url")
    api_key = config.api_key(spec) or "none"
    return await submit_finetune(base_url=spec.base_url, api_key=api_key, training_file=training_file,
                                 model=model, suffix=suffix, poll_interval=poll_interval, timeout=timeout,
                                 hyperparameters=PAPER_HYPERPARAMETERS if hyperparameters is None else hyperparameters)
