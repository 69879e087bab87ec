"""Token counting for the engine and the benchmark: the providers' one
implementation (providers/tokens.py: cl100k_base offline, and a model's own
encoding where its provider publishes one), named here so that the upper
layers keep importing `engine.tokens`."""
from __future__ import annotations

from providers.tokens import CL100K_BASE, O200K_BASE, count_chat_tokens, count_tokens, encoding_of_model

__all__ = ["CL100K_BASE", "O200K_BASE", "count_chat_tokens", "count_tokens", "encoding_of_model"]
