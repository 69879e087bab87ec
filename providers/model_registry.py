"""Look-ups in the shipped model registries (providers/models_*.py) by the
provider's model id, for messages that know only the id (a 404 at run time)."""
from __future__ import annotations

import re

from providers.models_anthropic import ANTHROPIC_MODELS
from providers.models_common import PROVIDER_NAMES
from providers.models_openai import OPENAI_MODELS

REMOTE_HINT = "`tulving models --remote` lists the models this key can use"
# The model id in a model-not-found message: OpenAI's "The model `X` does not
# exist or you do not have access to it.", Anthropic's "model: X".
_MODEL_IN_MESSAGE = re.compile(r"model `([^`]+)`|^model: (\S+)")


def model_in_message(message: str) -> str | None:
    found = _MODEL_IN_MESSAGE.search(message)
    return None if found is None else found.group(1) or found.group(2)


def not_found_hint(model: str | None) -> str:
    """What to do when the API says `model` does not exist: its shipped
    replacement when the registry knows one, else where to look."""
    for kind, table in (("openai", OPENAI_MODELS), ("anthropic", ANTHROPIC_MODELS)):
        for name, entry in table.items():
            if entry.get("model") != model or not entry.get("replacement"):
                continue
            if entry.get("retired"):
                when = f" (retired by {PROVIDER_NAMES[kind]} on {entry['retired']})"
            else:
                when = f" (shut down by {PROVIDER_NAMES[kind]} on {entry['shutdown']})" if entry.get("shutdown") else ""
            return f"{name}{when}: use {entry['replacement']}, or {REMOTE_HINT}"
    return REMOTE_HINT
