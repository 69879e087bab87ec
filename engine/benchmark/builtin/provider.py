"""Deterministic built-in "models": baselines and test instruments, not LLMs.

- writer (engine/benchmark/builtin/writer.py): writes chapters that obey the chapter
  prompt, with a configurable share of flawed candidates; answers the
  verification prompt.
- reader (engine/benchmark/builtin/reader.py): answers from the given context by
  lexical matching only.
- judge (engine/benchmark/builtin/judge.py): the judge contracts, by fuzzy matching.

Each module exposes `respond(messages, params) -> str`. Replies depend only on
the request, so they cache and replay like any model's.
"""
from __future__ import annotations

import asyncio
import importlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from providers.base import CONFIG, ChatResult, Provider, ProviderError

MODELS = {
    "writer": "engine.benchmark.builtin.writer",
    "reader": "engine.benchmark.builtin.reader",
    "judge": "engine.benchmark.builtin.judge",
}

# Replies for big prompts (a whole book) take a few ms of CPU: run those in a
# thread so the event loop keeps serving other calls.
_INLINE_CHARS = 20_000


class BuiltinProvider(Provider):
    kind = "builtin"

    async def chat(self, model: str, messages: Sequence[Mapping[str, str]], *,
                   params: Mapping[str, Any], timeout: float, stream: bool = False) -> ChatResult:
        try:
            module = importlib.import_module(MODELS[model])
        except KeyError:
            raise ProviderError(CONFIG, f"unknown built-in model {model!r} (known: {', '.join(MODELS)})") from None
        start = time.perf_counter()
        size = sum(len(m["content"]) for m in messages)
        if size > _INLINE_CHARS:
            text = await asyncio.to_thread(module.respond, messages, params)
        else:
            text = module.respond(messages, params)
        return ChatResult(text=text, finish_reason="stop", input_tokens=size // 4 + 1,
                          output_tokens=len(text) // 4 + 1, latency=time.perf_counter() - start,
                          request_id=None)
