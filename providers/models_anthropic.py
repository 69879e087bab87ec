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
RECHECKED = "2026-11-28"  # the 5.5 rows, the Haiku 4.5 status and the retirement dates

# Claude 5.5 models take no sampling parameters: a non-default temperature/top_p/top_k is a 400 on
# every version, and API version 2026-10-21 (the SDKs' default since 2026-10-21) refuses them
# even at their defaults ("temperature: Extra inputs are not permitted"); OpenRouter's Claude 5.5
# migration guide and Anthropic's versioning page (checked 2026-11-28). Sent: the output limit only.
# Opus 5.5 always thinks (adaptive thinking cannot be turned off: 400) and Sonnet and Haiku 5.5
# think by default; max_tokens bounds thinking and answer together (Anthropic's model pages, checked
# 2026-11-28). The answer keeps the paper's 4,096 tokens; THINKING_TOKENS more are allowed for
# the thinking before it, so a long answer is not cut by the thinking that preceded it.
THINKING_TOKENS = 12_288
_THINKING = {"max_tokens": 4096 + THINKING_TOKENS}


def _claude(model: str, price_in: float, cache_read: float, price_out: float, context: int,
            cache_write: float | None = None, **status: object) -> Table:
    write = round(price_in * 1.25, 4) if cache_write is None else cache_write
    return {"endpoint": "anthropic", "model": model, "params": PAPER_PARAMS, "price_in": price_in,
            "price_cached_in": cache_read, "price_cache_write": write, "price_out": price_out,
            "batch_discount": 0.5, "context_tokens": context, "checked": CHECKED, **status}


ANTHROPIC_MODELS: dict[str, Table] = {
    # -- current ----------------------------------------------------------------------
    # Sonnet 5.5: $2 / $10, 5m write $2.50, 1h write $4; cache read $0.10 since 2026-10-07 (it was
    # $0.20 before: the band below prices calls of earlier days); 1M context (flat price), 128K output.
    "claude-sonnet-5-5": _claude("claude-sonnet-5-5", 2.0, 0.10, 10.0, 1_000_000, price_cache_write_1h=4.0,
                                 params=_THINKING, checked=RECHECKED,
                                 prices=[{"until": "2026-10-06", "price_cached_in": 0.20,
                                          "source": "Anthropic cut Sonnet 5.5 cache reads from $0.20 to $0.10 "
                                                    "on 2026-10-07 (checked 2026-11-28)"}]),
    # Opus 5.5: $4 / $20, cache read $0.20, 5m write $5, 1h write $8; 1M context; thinking always on.
    "claude-opus-5-5": _claude("claude-opus-5-5", 4.0, 0.20, 20.0, 1_000_000, price_cache_write_1h=8.0,
                               params=_THINKING, checked=RECHECKED),
    # Haiku 5.5 (2026-10-07), priced by prompt length (input + cache reads + writes): up to 100,000
    # tokens $0.10 / $0.50, 5m/1h writes $0.125 / $0.20, reads $0.01; above, every token of the request
    # at $0.50 / $2.50, writes $0.625 / $1.00, reads $0.05 (pricing page as quoted 2026-10-24; checked 2026-11-28).
    "claude-haiku-5-5": _claude("claude-haiku-5-5", 0.10, 0.01, 0.50, 200_000, cache_write=0.125,
                                price_cache_write_1h=0.20, params=_THINKING, checked=RECHECKED,
                                prices=[{"above": 100_000, "price_in": 0.50, "price_out": 2.50,
                                         "price_cached_in": 0.05, "price_cache_write": 0.625,
                                         "price_cache_write_1h": 1.00,
                                         "source": "Anthropic: Haiku 5.5 prompts over 100,000 tokens "
                                                   "(checked 2026-11-28)"}]),
    # Haiku 4.5: $1 / $5, cache read $0.10; 200K context. Legacy: Haiku 5.5 is its successor (the
    # models overview, checked 2026-11-28); no retirement date announced.
    "claude-haiku-4-5": _claude("claude-haiku-4-5-20251001", 1.0, 0.10, 5.0, 200_000, legacy=True,
                                replacement="claude-haiku-5-5", checked=RECHECKED),
    # -- the paper's and the leaderboard's, retired -------------------------------------
    # Retired 2025-10-28 by Anthropic's release notes ("We've retired the Claude Sonnet 3.5 models",
    # October 28, 2025; 2025-10-22 was the date first announced). Checked 2026-11-28.
    "claude-3-5-sonnet": _claude("claude-3-5-sonnet-20240620", 3.0, 0.30, 15.0, 200_000,
                                 retired="2025-10-28", replacement="claude-sonnet-5-5", checked=RECHECKED),
    "claude-sonnet-4": _claude("claude-sonnet-4-20250514", 3.0, 0.30, 15.0, 200_000,
                               retired="2026-06-15", replacement="claude-sonnet-5-5"),
    # Retired 2026-04-20 by Anthropic's release notes; the date is disputed: third-party pages say
    # 2026-04-19 (checked 2026-11-28: both are found; the release notes' is kept).
    # Haiku 3 was priced $0.25 / $1.25, cache writes $0.30 and reads $0.03.
    "claude-3-haiku": _claude("claude-3-haiku-20240307", 0.25, 0.03, 1.25, 200_000, cache_write=0.30,
                              retired="2026-04-20", replacement="claude-haiku-5-5"),
}
