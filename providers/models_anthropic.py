"""The Anthropic aliases Tulving ships: today's models and the published
leaderboard's, each dated (the `anthropic` kind's `default_models`).

Checked 2026-11-26 through the search index of Anthropic's pages (not fetched live):
- models overview and model-deprecations (platform.claude.com/docs/en/about-claude/...);
  the anthropic SDK's own list of deprecated models (anthropic/_data/deprecated_models.py)
  agrees: claude-sonnet-4-5 retires 2026-11-30, claude-opus-4-5 2027-01-22;
- prices (platform.claude.com/docs/en/about-claude/pricing), USD per million tokens:
  5-minute cache writes 1.25x input, Message Batches half price (batch_discount 0.5).
Model ids: the reference's (ahstat/episodic-memory-benchmark,
epbench/src/models/models_wrapper.py and the paper): claude-3-5-sonnet-20240620,
claude-sonnet-4-20250514, claude-3-haiku-20240307.
A `replacement` names a shipped alias: today's model of the same tier. At
retirement Anthropic recommended claude-sonnet-4-6 for claude-sonnet-4 and a
Claude 4.5 model for claude-3-5-sonnet; claude-haiku-4-5 for claude-3-haiku.
"""
from __future__ import annotations

from providers.models_common import PAPER_PARAMS, Table

CHECKED = "2026-11-26"


def _claude(model: str, price_in: float, cache_read: float, price_out: float, context: int,
            cache_write: float | None = None, **status: str) -> Table:
    write = round(price_in * 1.25, 4) if cache_write is None else cache_write
    return {"endpoint": "anthropic", "model": model, "params": PAPER_PARAMS, "price_in": price_in,
            "price_cached_in": cache_read, "price_cache_write": write, "price_out": price_out,
            "batch_discount": 0.5, "context_tokens": context, "checked": CHECKED, **status}


ANTHROPIC_MODELS: dict[str, Table] = {
    # -- current ----------------------------------------------------------------------
    # Sonnet 5.5: $2 / $10, 5m write $2.50, cache read $0.10 since 2026-10-07 (was $0.20); 1M context.
    "claude-sonnet-5-5": _claude("claude-sonnet-5-5", 2.0, 0.10, 10.0, 1_000_000),
    # Opus 5.5: $4 / $20, cache read $0.20; 1M context.
    "claude-opus-5-5": _claude("claude-opus-5-5", 4.0, 0.20, 20.0, 1_000_000),
    # Haiku 4.5: $1 / $5, cache read $0.10; 200K context. (Haiku 5.5 is priced in two
    # bands by prompt length, which one price per alias cannot say: not shipped.)
    "claude-haiku-4-5": _claude("claude-haiku-4-5-20251001", 1.0, 0.10, 5.0, 200_000),
    # -- the paper's and the leaderboard's, retired -------------------------------------
    "claude-3-5-sonnet": _claude("claude-3-5-sonnet-20240620", 3.0, 0.30, 15.0, 200_000,
                                 retired="2025-10-22", replacement="claude-sonnet-5-5"),
    "claude-sonnet-4": _claude("claude-sonnet-4-20250514", 3.0, 0.30, 15.0, 200_000,
                               retired="2026-06-15", replacement="claude-sonnet-5-5"),
    # Retired 2026-04-20 by Anthropic's release notes (some third-party pages say 04-19).
    # Haiku 3 was priced $0.25 / $1.25, cache writes $0.30 and reads $0.03.
    "claude-3-haiku": _claude("claude-3-haiku-20240307", 0.25, 0.03, 1.25, 200_000, cache_write=0.30,
                              retired="2026-04-20", replacement="claude-haiku-4-5"),
}
