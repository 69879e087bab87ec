"""Provider prompt caching for the loopback server, reported as each API does.

Contract:
- `PromptCache.anthropic(body, count)` / `.openai(body, count)` look a chat
  request up and return a `CacheLookup`: tokens read from the cache, tokens
  written to it, and what to store. Looking up changes nothing; the server
  calls `commit(lookup)` once the reply has *finished*, because a provider's
  cache is warm only after the first request with a prefix has completed
  (concurrent first requests all miss, as they do for real).
- Anthropic (opt-in): a content block carrying `cache_control:
  {"type": "ephemeral"[, "ttl": "5m" | "1h"]}` in `system` or in a message's
  content marks a breakpoint; the prefix up to and including it is cacheable
  when it holds at least `min_tokens`. A request reads the longest prefix
  still live, found at its breakpoints or at most 20 blocks before one (the
  API's lookback), and writes the rest up to its last breakpoint. At most 4
  breakpoints, and a `ttl` other than "5m" / "1h" is refused (the API's 400). Keys are the byte-identical prefix
  (model, tools, roles, blocks) without the cache_control markers. A hit
  refreshes the entry's lifetime. Tools are part of every key but, as in the
  server's input count, carry no tokens.
- OpenAI (automatic): prompts of at least `min_tokens` (1,024 on the real
  API) are cached; a later prompt reads the longest previously seen identical
  prefix, rounded down to a multiple of 128 tokens (and only if that is at
  least `min_tokens`). prompt_tokens still counts every token.
- Token counts of a prefix use the server's counter on the same text the
  server counts for `input_tokens`, so cached tokens never exceed it.
- Memory is bounded: past `max_entries` prefix hashes, expired entries are
  dropped, then the oldest written (a long benchmark keeps running).
- `clock` is injectable (tests expire entries without sleeping).
"""
from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

_LOOKBACK = 20       # blocks Anthropic checks before a breakpoint for a hit
_MAX_BREAKPOINTS = 4
_OPENAI_STEP = 128   # tokens
_OPENAI_GRAIN = 128  # characters between the prefix hashes kept per prompt (and one at each message's end)


class CacheError(ValueError):
    """The request's cache_control is invalid (the API answers 400)."""


@dataclass
class CacheLookup:
    read: int = 0                     # tokens served from the cache
    write: int = 0                    # tokens written (Anthropic only)
    write_1h: int = 0                 # ...of which with the 1-hour lifetime
    store: dict[bytes, float] = field(default_factory=dict)  # key -> lifetime (s) to set at commit


NO_CACHE = CacheLookup()


def _content_text(content: object) -> str:
    # The same text the server counts (loopback_server._content_text).
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _strip(block: object) -> object:
    if isinstance(block, dict) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


# (prefix tokens, key, cache_control or None) at the end of each content block
_Boundary = tuple[int, bytes, "Mapping[str, object] | None"]


def _anthropic_boundaries(body: Mapping[str, Any], count: Callable[[str], int]) -> list[_Boundary]:
    """Every content block's prefix, in prompt order: the system prompt, then each message."""
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(orjson.dumps([body.get("model"), [_strip(t) for t in body.get("tools") or []]]))
    system = body.get("system")
    groups: list[tuple[str, object]] = [("system", system)] if system else []
    groups += [(m.get("role", ""), m.get("content")) for m in body.get("messages") or [] if isinstance(m, dict)]
    boundaries: list[_Boundary] = []
    done_tokens = 0
    for role, content in groups:
        hasher.update(b"\x1e" + role.encode() + b"\x1f")
        blocks = content if isinstance(content, list) else [content]
        for j, block in enumerate(blocks):
            hasher.update(orjson.dumps(_strip(block)))
            partial = content if not isinstance(content, list) else blocks[: j + 1]
            control = block.get("cache_control") if isinstance(block, dict) else None
            boundaries.append((done_tokens + count(_content_text(partial)), hasher.copy().digest(),
                               control if isinstance(control, dict) else None))
        done_tokens += count(_content_text(content))
    return boundaries


class PromptCache:
    def __init__(self, min_tokens: int = 1024, ttl: float = 300.0, clock: Callable[[], float] = time.monotonic,
                 max_entries: int = 1_000_000):
        self.min_tokens = min_tokens
        self.ttl = ttl
        self.clock = clock
        self.max_entries = max_entries
        self._expiry: dict[bytes, float] = {}

    def _live(self, key: bytes, now: float) -> bool:
        expiry = self._expiry.get(key)
        if expiry is None:
            return False
        if expiry <= now:
            del self._expiry[key]
            return False
        return True

    def commit(self, lookup: CacheLookup) -> None:
        now = self.clock()
        for key, lifetime in lookup.store.items():
            self._expiry[key] = max(self._expiry.get(key, 0.0), now + lifetime)
        if len(self._expiry) > self.max_entries:
            self._expiry = {k: t for k, t in self._expiry.items() if t > now}
            excess = len(self._expiry) - self.max_entries * 9 // 10
            for key in list(itertools.islice(self._expiry, max(0, excess))):  # oldest written first
                del self._expiry[key]

    # -- Anthropic ------------------------------------------------------------------------
    def anthropic(self, body: Mapping[str, Any], count: Callable[[str], int]) -> CacheLookup:
        boundaries = _anthropic_boundaries(body, count)
        marks = [i for i, (_, _, control) in enumerate(boundaries) if control is not None]
        if not marks:
            return NO_CACHE
        if len(marks) > _MAX_BREAKPOINTS:
            raise CacheError(f"A maximum of {_MAX_BREAKPOINTS} blocks with cache_control may be provided. "
                             f"Found {len(marks)}.")
        for mark in marks:  # as the API: a lifetime is "5m" or "1h", nothing else
            ttl = (boundaries[mark][2] or {}).get("ttl", "5m")
            if ttl not in ("5m", "1h"):
                raise CacheError(f"cache_control.ttl: Input should be '5m' or '1h' (got {ttl!r})")
        lookup = CacheLookup()
        hit_key, hit_lifetime = self._longest_hit(boundaries, marks, lookup)
        for mark in marks:
            tokens, key, control = boundaries[mark]
            if tokens >= self.min_tokens:
                lookup.store[key] = self._lifetime(control)
        if hit_key is not None:
            lookup.store.setdefault(hit_key, hit_lifetime)  # a hit refreshes the entry
        last_tokens, _, last_control = boundaries[marks[-1]]
        if last_tokens >= self.min_tokens and last_tokens > lookup.read:
            lookup.write = last_tokens - lookup.read
            if self._lifetime(last_control) > self.ttl:
                lookup.write_1h = lookup.write
        return lookup

    def _longest_hit(self, boundaries: list[_Boundary], marks: list[int], lookup: CacheLookup
                     ) -> tuple[bytes | None, float]:
        """Set `lookup.read` to the longest live prefix at or up to _LOOKBACK blocks before a
        breakpoint; return its key (None: no hit) and the lifetime its breakpoint asks for."""
        now = self.clock()
        hit_key, hit_lifetime = None, self.ttl
        for mark in marks:
            for i in range(mark, max(-1, mark - _LOOKBACK - 1), -1):
                tokens, key, _ = boundaries[i]
                if tokens > lookup.read and self._live(key, now):
                    lookup.read, hit_key = tokens, key
                    hit_lifetime = self._lifetime(boundaries[mark][2])
                    break
        return hit_key, hit_lifetime

    def _lifetime(self, control: Mapping[str, object] | None) -> float:
        return 3600.0 if control and control.get("ttl") == "1h" else self.ttl

    # -- OpenAI ---------------------------------------------------------------------------
    def openai(self, body: Mapping[str, Any], count: Callable[[str], int], prompt_tokens: int) -> CacheLookup:
        if prompt_tokens < self.min_tokens:
            return NO_CACHE
        hasher = hashlib.blake2b(digest_size=16)
        hasher.update(orjson.dumps([body.get("model"), body.get("tools")]))
        # Walk the prompt text, keeping a hash of the prefix every _OPENAI_GRAIN characters.
        keys: list[tuple[bytes, int, int]] = []  # (key, message index, characters into its content)
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        contents = [_content_text(m.get("content")) for m in messages]
        for index, (message, text) in enumerate(zip(messages, contents)):
            hasher.update(b"\x1e" + str(message.get("role", "")).encode() + b"\x1f")
            for start in range(0, len(text), _OPENAI_GRAIN):
                piece = text[start:start + _OPENAI_GRAIN]
                hasher.update(piece.encode())
                keys.append((hasher.copy().digest(), index, start + len(piece)))
        now = self.clock()
        lookup = CacheLookup(store={key: self.ttl for key, _, _ in keys})
        for key, index, chars in reversed(keys):
            if self._live(key, now):
                common = sum(count(t) for t in contents[:index]) + count(contents[index][:chars])
                cached = min(common, prompt_tokens) // _OPENAI_STEP * _OPENAI_STEP
                if cached >= self.min_tokens:
                    lookup.read = cached
                break
        return lookup
