"""The OpenAI aliases Tulving ships: today's models and the published
leaderboard's, each dated (the `openai` kind's `default_models`).

Checked 2026-11-26 through the search index of OpenAI's pages (not fetched live):
- deprecations: developers.openai.com/api/docs/deprecations (shutdown dates and
  recommended replacements; GET /v1/models carries the same `shutdown_date`);
- prices: developers.openai.com/api/docs/pricing, USD per million tokens;
  the Batch API costs half (batch_discount 0.5). Current models bill a
  cache write (price_cache_write, the 30-minute price); older ones do not
  (left unset: the plain input price).
Rules: gpt-5 / gpt-4.1 / current models take `max_completion_tokens`; o1/o3/o4
are called as the reference called them (user message only, no token limit,
no temperature: `reasoning = true`).

Model ids: the reference's (ahstat/episodic-memory-benchmark,
epbench/src/models/models_wrapper.py) where it shows them (gpt-4o-2024-08-06,
gpt-4o-mini-2024-07-18, o3-mini); otherwise OpenAI's dated snapshot of the model.
A `replacement` names a shipped alias: the model OpenAI recommends, or, where
that one has itself been deprecated since, today's successor (said beside it).
"""
from __future__ import annotations

from providers.models_common import PAPER_PARAMS, Table

CHECKED = "2026-11-26"
RECHECKED = "2026-11-28"  # the GPT-6 rows: prices, long-context bands, context windows, sampling

# GPT-6 models reason by default (none of them defaults to reasoning effort "none"; GPT-6.1 Sol does not
# support it): OpenAI's deployment checklist says "When reasoning effort is not none, remove temperature,
# top_p, and top_logprobs" (developers.openai.com/api/docs/guides/deployment-checklist, checked 2026-11-28).
_GPT6_PARAMS = {"max_completion_tokens": 4096}
# gpt-5 and gpt-4.1 take temperature 1 (the only value gpt-5 accepts), as the leaderboard called them.
_CURRENT_PARAMS = {"temperature": 1.0, "max_completion_tokens": 4096}
# Over 272K input tokens OpenAI bills the whole request at 2x the input and cache prices and 1.5x the
# output price (the GPT-6.1 and GPT-5.6 model pages, as quoted by docs.laozhang.ai and apidog.com;
# checked 2026-11-28).
LONG_PROMPT_TOKENS = 272_000


def _long(price_in: float, cached: float, write: float, price_out: float) -> dict[str, object]:
    return {"above": LONG_PROMPT_TOKENS, "price_in": 2 * price_in, "price_cached_in": 2 * cached,
            "price_cache_write": 2 * write, "price_out": 1.5 * price_out,
            "source": "OpenAI: a request over 272K input tokens at 2x input/cache, 1.5x output (checked 2026-11-28)"}


def _current(model: str, price_in: float, cached: float, write: float, price_out: float,
             context: int | None) -> Table:
    table: Table = {"endpoint": "openai", "model": model, "params": _GPT6_PARAMS,
                    "token_param": "max_completion_tokens", "price_in": price_in, "price_cached_in": cached,
                    "price_cache_write": write, "price_out": price_out, "batch_discount": 0.5,
                    "prices": [_long(price_in, cached, write, price_out)], "checked": RECHECKED}
    if context is not None:
        table["context_tokens"] = context
    return table


OPENAI_MODELS: dict[str, Table] = {
    # -- current (no shutdown announced) ----------------------------------------------
    # GPT-6.1 Sol (2026-09-29): $2 / $0.10 cached / $10, cache write $2.50; over 272K input tokens
    # $4 / $0.20 / $15 (cache write $5); 1,050,000-token context (922K input).
    "gpt-6.1-sol": _current("gpt-6.1-sol", 2.0, 0.10, 2.50, 10.0, 1_050_000),
    # GPT-6.1 Terra (2026-10-26): $1 / $0.05 / $5, cache write $1.25; over 272K $2 / $0.10 / $7.50; 1.05M context.
    "gpt-6.1-terra": _current("gpt-6.1-terra", 1.0, 0.05, 1.25, 5.0, 1_050_000),
    # GPT-6 Luna (2026-09-22): $0.10 / $0.01 / $0.50, cache write $0.125; 1,050,000-token context.
    "gpt-6-luna": _current("gpt-6-luna", 0.10, 0.01, 0.125, 0.50, 1_050_000),
    "text-embedding-3-small": {"endpoint": "openai", "model": "text-embedding-3-small", "price_in": 0.02,
                               "batch_discount": 0.5, "checked": CHECKED},
    # -- the leaderboard's, still served until their shutdown date ----------------------
    "gpt-5": {"endpoint": "openai", "model": "gpt-5-2025-08-07", "params": _CURRENT_PARAMS,
              "token_param": "max_completion_tokens", "price_in": 1.25, "price_cached_in": 0.125, "price_out": 10.0,
              "batch_discount": 0.5, "context_tokens": 400_000, "shutdown": "2026-12-11",
              "replacement": "gpt-6.1-sol", "checked": CHECKED},
    "gpt-5-mini": {"endpoint": "openai", "model": "gpt-5-mini-2025-08-07", "params": _CURRENT_PARAMS,
                   "token_param": "max_completion_tokens", "price_in": 0.25, "price_cached_in": 0.025,
                   "price_out": 2.0, "batch_discount": 0.5, "context_tokens": 400_000, "shutdown": "2026-12-11",
                   "replacement": "gpt-6.1-terra", "checked": CHECKED},
    "gpt-4o": {"endpoint": "openai", "model": "gpt-4o-2024-08-06", "params": PAPER_PARAMS,
               "price_in": 2.5, "price_cached_in": 1.25, "price_out": 10.0, "batch_discount": 0.5,
               "context_tokens": 128_000, "shutdown": "2027-01-14", "replacement": "gpt-6-luna", "checked": CHECKED},
    "gpt-4o-mini": {"endpoint": "openai", "model": "gpt-4o-mini-2024-07-18", "params": PAPER_PARAMS,
                    "price_in": 0.15, "price_cached_in": 0.075, "price_out": 0.6, "batch_discount": 0.5,
                    "context_tokens": 128_000, "shutdown": "2027-01-14", "replacement": "gpt-6-luna",
                    "checked": CHECKED},
    # -- the leaderboard's, retired ---------------------------------------------------
    # Shut down 2026-10-23; OpenAI then recommended gpt-5.6-sol (o1, o3-mini) and
    # gpt-5.6-luna (gpt-4.1-nano), since succeeded by the GPT-6 models named here.
    "o3-mini": {"endpoint": "openai", "model": "o3-mini", "reasoning": True,
                "price_in": 1.1, "price_cached_in": 0.55, "price_out": 4.4, "batch_discount": 0.5,
                "context_tokens": 200_000, "retired": "2026-10-23", "replacement": "gpt-6.1-sol", "checked": CHECKED},
    "o1": {"endpoint": "openai", "model": "o1-2024-12-17", "reasoning": True,
           "price_in": 15.0, "price_cached_in": 7.5, "price_out": 60.0, "batch_discount": 0.5,
           "context_tokens": 200_000, "retired": "2026-10-23", "replacement": "gpt-6.1-sol", "checked": CHECKED},
    "gpt-4.1-nano": {"endpoint": "openai", "model": "gpt-4.1-nano-2025-04-14", "params": _CURRENT_PARAMS,
                     "token_param": "max_completion_tokens", "price_in": 0.10, "price_cached_in": 0.025,
                     "price_out": 0.40, "batch_discount": 0.5, "context_tokens": 1_047_576,
                     "retired": "2026-10-23", "replacement": "gpt-6-luna", "checked": CHECKED},
    # Shut down 2025-10-27 (OpenAI recommended o4-mini, itself shut down 2026-10-23).
    "o1-mini": {"endpoint": "openai", "model": "o1-mini-2024-09-12", "reasoning": True,
                "price_in": 1.1, "price_cached_in": 0.55, "price_out": 4.4, "batch_discount": 0.5,
                "context_tokens": 128_000, "retired": "2025-10-27", "replacement": "gpt-6.1-terra",
                "checked": CHECKED},
}
