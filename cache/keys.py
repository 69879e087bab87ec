"""Canonical request keys: the sha256 of a canonical serialization of a
request identity (see engine/resolve.py for what an identity holds).

Canonical means two identities that mean the same request give the same key,
in any process, on any machine:

* dict keys are sorted; tuples and lists are the same array;
* numbers are normalised: an integral float whose magnitude is below 2**53
  becomes the integer (1.0 -> 1, -0.0 -> 0), so `temperature = 1` in a TOML
  file and `temperature=1.0` in code share one entry; booleans stay booleans;
* NaN and infinities are refused (JSON cannot say them, and no API takes them).

The serialization is compact JSON (orjson, UTF-8, no spaces) prefixed by a
format tag, so a future change of these rules can never collide with old
keys. Python's `hash()` is never used: it is salted per process.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import orjson

from providers.base import with_long_strings_copied

KEY_FORMAT = b"tulving-cache/1\n"
_EXACT_INT_LIMIT = 2 ** 53
_INT_MIN, _INT_MAX = -(2 ** 63), 2 ** 64 - 1  # what orjson can write

# A request identity (engine/resolve.py builds it): op, kind, base_url, model,
# params, messages or texts, draw; JSON-like values all through.
Identity = Mapping[str, object]


def normalize(value: Any) -> Any:
    """The canonical form of a JSON-like value. Containers that need no change
    are returned as they are (not copied): keys are computed for every request."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is dict:
        for k in value:
            _key_str(k)
        return _normalize_members(value, value.items(), dict)
    if kind is list:
        return _normalize_members(value, enumerate(value), list)
    if kind is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise ValueError(f"cannot key the integer {value}: outside the 64-bit range")
        return value
    if kind is float:
        if value.is_integer() and -_EXACT_INT_LIMIT < value < _EXACT_INT_LIMIT:
            return int(value)
        if not math.isfinite(value):
            raise ValueError(f"cannot key the non-finite number {value!r}")
        return value
    if kind is tuple:
        return [normalize(v) for v in value]
    return _normalize_other(value)


def _normalize_members(container: Any, members: Any, copy: Any) -> Any:
    """A dict's or list's canonical form: copied (by `copy`) only when a
    member changes. `members` yields (key or index, value)."""
    out = None
    for k, v in members:
        kv = type(v)
        if kv is str or kv is int and _INT_MIN <= v <= _INT_MAX:  # already canonical
            continue
        n = normalize(v)
        if n is not v:
            if out is None:
                out = copy(container)
            out[k] = n
    return container if out is None else out


def _normalize_other(value: Any) -> Any:
    """Subclasses and other containers (numpy numbers and arrays, MappingProxy, ...)."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return normalize(int(value))
    if isinstance(value, float):
        return normalize(float(value))
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return normalize({_key_str(k): v for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return [normalize(v) for v in value]
    try:
        import numpy as np

        if isinstance(value, np.generic):
            return normalize(value.item())
        if isinstance(value, np.ndarray):
            return normalize(value.tolist())
    except ImportError:  # pragma: no cover
        pass
    raise TypeError(f"cannot key a value of type {type(value).__name__}: {value!r:.80}")


def _key_str(key: object) -> str:
    if type(key) is not str:
        raise TypeError(f"cannot key a mapping with a non-string key {key!r:.80}")
    return key


def canonical_bytes(identity: Identity) -> bytes:
    """The canonical serialization of an identity (what the key hashes)."""
    return dumps_normalized(normalize(identity))


def dumps_normalized(identity: object) -> bytes:
    """`canonical_bytes` of an identity already in canonical form (every value
    `normalize` would return unchanged): for callers that normalised its parts
    once (engine/resolve.py normalises an alias's parameters once per batch)."""
    return orjson.dumps(identity, option=orjson.OPT_SORT_KEYS)


def request_key(identity: Identity) -> str:
    """sha256 hex digest of the canonical identity: the cache key."""
    return key_of_canonical(canonical_bytes(identity))


def key_of_canonical(canonical: bytes) -> str:
    """The cache key of an identity's `canonical_bytes` (for callers that keep
    those bytes, e.g. to hand them to the cache's writer)."""
    digest = _KEY_PREFIX.copy()
    digest.update(canonical)
    return digest.hexdigest()


_KEY_PREFIX = hashlib.sha256(KEY_FORMAT)


# -- keys of identities holding long texts -----------------------------------------
def key_and_canonical(identity: object, keep_bytes: int) -> tuple[str, bytes]:
    """(`key_of_canonical(dumps_normalized(identity))`, those canonical bytes
    when they hold at most `keep_bytes`, else b""), for an identity already in
    canonical form.

    Strings longer than `keep_bytes` characters (a book in a prompt) are
    serialised from a copy, dropped at once: serialising a non-ASCII string
    makes CPython cache a UTF-8 copy of it inside the string (orjson reads it
    through PyUnicode_AsUTF8AndSize), which would then live as long as the
    prompt does -- a second copy of the book for every request pulled ahead or
    waiting for the cache's writer. (A memcpy costs next to nothing beside
    the encoding and the hash; serialising and hashing in pieces cost ~30%.)"""
    canonical = dumps_normalized(with_long_strings_copied(identity, keep_bytes))
    return key_of_canonical(canonical), (canonical if len(canonical) <= keep_bytes else b"")
