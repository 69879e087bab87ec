"""Shared prompt prefixes: marking them for the provider, and warming its cache first.

In-context evaluation sends the same book before each of hundreds of
questions. The providers cache prompt prefixes (Anthropic where a block is
marked `cache_control`, OpenAI automatically), but a prefix is cached only
once the first request carrying it has *finished*: requests sent together
before that all pay full price (and Anthropic's cache writes cost 1.25x).
So for each (model, shared prefix) the engine sends one request, waits for it
to finish, then fans out the others (`Warmup`); the same ordering idea as
prefix reuse for llama.cpp (engine/dispatch.py).

A request says where its shared prefix ends with `ChatRequest.prefix_end`
(message index, characters); `marked` puts that on the message the provider
gets (providers.base.PREFIX_END), outside the cache key.

    warmup = Warmup()
    if not warmup.hold(job, key):       # the first of its prefix, or already warm: send it
        pool.push(job)
    for job in warmup.finished(job, ok=True):   # when it ends: the ones it held back
        job.pool.push(job)
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, Generic, TypeVar

from providers.base import PREFIX_END

# Prefixes shorter than this are not worth a wait: the providers cache
# nothing under 1,024 tokens (about 4 characters a token in English).
MIN_PREFIX_CHARS = 4 * 1024


J = TypeVar("J", bound=Hashable)  # a held call (the engine's `Job`)

def prefix_parts(messages: Sequence[Mapping[str, str]], end: tuple[int, int]) -> Iterator[tuple[str, str]]:
    """(role, text) of each message up to `end`, the last one cut at it."""
    index, chars = end
    for i, message in enumerate(messages[: index + 1]):
        content = message["content"]
        yield message["role"], content[:chars] if i == index else content


def prefix_chars(messages: Sequence[Mapping[str, str]], end: tuple[int, int]) -> int:
    return sum(len(text) for _, text in prefix_parts(messages, end))


def prefix_key(model: str, messages: Sequence[Mapping[str, str]], end: tuple[int, int]) -> bytes:
    """A digest of the model and the prompt up to `end` (byte-identical
    prefixes give the same key)."""
    hasher = hashlib.blake2b(model.encode(), digest_size=16)
    for role, text in prefix_parts(messages, end):
        hasher.update(b"\x1e" + role.encode() + b"\x1f")
        hasher.update(text.encode("utf-8", "surrogatepass"))
    return hasher.digest()


def marked(messages: Sequence[Mapping[str, str]], end: tuple[int, int]) -> list[Mapping[str, Any]]:
    """The messages with PREFIX_END on the one where the shared prefix ends
    (a copy: the resolved messages are the cache identity's)."""
    index, chars = end
    out: list[Mapping[str, Any]] = list(messages)
    if 0 <= index < len(out):
        message = out[index]
        out[index] = {"role": message["role"], "content": message["content"],
                      PREFIX_END: min(chars, len(message["content"]))}
    return out


class Warmup(Generic[J]):
    """Holds back calls sharing a prompt prefix until one of them has warmed
    the provider's cache. Keys are whatever identifies (endpoints, model,
    prefix); jobs are any hashable objects (the engine's `Job`)."""

    def __init__(self) -> None:
        self._warm: set[Hashable] = set()                # prefixes whose first call succeeded
        self._held: dict[Hashable, list[J]] = {}         # prefix being warmed -> calls waiting for it
        self._warming: dict[J, Hashable] = {}            # the call warming each prefix -> its key
        self.held_total = 0                              # calls ever held back (for tests and reports)

    def hold(self, job: J, key: Hashable) -> bool:
        """True: `job` waits for the call warming its prefix (do not queue
        it now). False: queue it (it warms the prefix, or the prefix is warm)."""
        if key in self._warm:
            return False
        waiting = self._held.get(key)
        if waiting is None:
            self._held[key] = []
            self._warming[job] = key
            return False
        waiting.append(job)
        self.held_total += 1
        return True

    def finished(self, job: J, *, ok: bool, alive: Callable[[J], bool] | None = None) -> list[J]:
        """`job` has ended (for good: not a retry). Returns the calls to queue
        now: every call it held back when it succeeded; else the next one
        (`alive(job)` true), which warms the prefix in its place."""
        key = self._warming.pop(job, None)
        if key is None:
            return []
        waiting = self._held.pop(key, [])
        if ok:
            self._warm.add(key)
            return waiting
        for i, nxt in enumerate(waiting):
            if alive is None or alive(nxt):
                rest = waiting[i + 1:]
                if rest:
                    self._held[key] = rest
                self._warming[nxt] = key
                return [nxt]
        return []

    def is_warm(self, key: Hashable) -> bool:
        """Whether a call with this prefix has succeeded (the provider's cache holds it)."""
        return key in self._warm

    def waiting(self) -> int:
        return sum(map(len, self._held.values()))
