"""Token counting for the engine and the benchmark: the providers' one
implementation (providers/tokens.py, cl100k_base offline), named here so
that the upper layers keep importing `engine.tokens`."""
from __future__ import annotations

from providers.tokens import count_chat_tokens, count_tokens

__all__ = ["count_chat_tokens", "count_tokens"]
