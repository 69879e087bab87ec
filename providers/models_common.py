"""What the shipped model registries (providers/models_*.py) share: the
paper's parameters, and the call settings a model id implies when no
registry entry names it."""
from __future__ import annotations

import re
from typing import TypedDict

# A TOML-like table of one alias, as a kind declares it in `default_models`.
Table = dict[str, object]

# The settings behind the published numbers: temperature 1.0, 4096 output tokens.
PAPER_PARAMS = {"temperature": 1.0, "max_tokens": 4096}

# OpenAI ids of reasoning models called with the user message only (o1, o3, o4 and their variants).
_O_SERIES = re.compile(r"o[134](?:$|[-.])")
# OpenAI ids that refuse `max_tokens` and take `max_completion_tokens`.
_COMPLETION_TOKENS = re.compile(r"gpt-(?:[5-9]|\d\d|4\.1)")


class InferredSettings(TypedDict, total=False):
    """What a model id implies of its calls (absent: the default)."""

    reasoning: bool      # called with the user message only
    token_param: str     # the parameter carrying max_tokens


def inferred_settings(kind: str, model: str) -> InferredSettings:
    """The call settings an OpenAI model id implies (checked 2026-11-26 against
    OpenAI's reasoning and chat-completions docs): o1/o3/o4 are reasoning
    models; gpt-4.1 and gpt-5 onwards take max_completion_tokens. Nothing for
    other kinds or ids."""
    if kind != "openai":
        return {}
    if _O_SERIES.match(model):
        return {"reasoning": True}
    if _COMPLETION_TOKENS.match(model):
        return {"token_param": "max_completion_tokens"}
    return {}

# Who retires a kind's models, as the one-line errors name them.
PROVIDER_NAMES = {"openai": "OpenAI", "anthropic": "Anthropic"}
