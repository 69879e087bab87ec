"""Content-defined chunking of long texts, so that prompts sharing a long
prefix (the same 500 KB book followed by each of 686 questions) store the
prefix once.

A text is cut only at paragraph breaks (a run of two or more newlines; the
cut falls after the whole run), so every cut depends on the text before it,
never on its offset from the end of some other prompt:

* the body is cut greedily: a chunk closes at the first paragraph break once
  it holds `CHUNK_MIN` characters (or hard at `CHUNK_MAX` if no break comes);
  two texts with the same prefix get the same chunks over that prefix;
* the tail (the chunk that would reach into the last `TAIL` characters and
  everything after it) is cut at every paragraph break once a piece holds
  `TAIL_MIN` characters. The tail is where prompts that share a prefix
  diverge (book + question): fine cuts there mean only the question itself is
  stored per prompt, not the end of the book with it.

Concatenating the chunks gives back the text exactly.
"""
from __future__ import annotations

import re
from collections.abc import Iterator

CHUNK_MIN = 16 * 1024
CHUNK_MAX = 64 * 1024
TAIL = 8 * 1024
TAIL_MIN = 256

_BREAK = re.compile(r"\n\n+")


def split_text(text: str) -> list[str]:
    """The chunks of `text`, in order; `"".join(split_text(t)) == t`."""
    return [text[start:end] for start, end in chunk_bounds(text)]


def chunk_bounds(text: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each chunk of `text`, in order, found lazily: the cache's
    writer slices, hashes and drops one chunk at a time instead of holding a
    book-sized list of them."""
    n = len(text)
    start = 0
    tail_start = n - TAIL
    while start < tail_start:
        end = _cut(text, start, CHUNK_MIN)
        if end > tail_start:
            break  # this chunk would reach into the tail: the tail starts here
        yield start, end
        start = end
    while start < n:
        end = _cut(text, start, TAIL_MIN)
        yield start, end
        start = end


def _cut(text: str, start: int, min_len: int) -> int:
    """End of the chunk starting at `start`: after the first paragraph break at
    or beyond `start + min_len`, or `CHUNK_MAX` characters on, or the end."""
    limit = min(start + CHUNK_MAX, len(text))
    if start + min_len >= limit:
        return limit
    found = _BREAK.search(text, start + min_len, limit)
    return found.end() if found else limit
