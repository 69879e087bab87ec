"""How identities and responses are written into the cache file and read back.

Identity: the canonical identity (cache/keys.py) as JSON, where every string
longer than `blob_min_chars` is replaced by `{"$chunks": [sha256, ...]}`, the
digests of its chunks (cache/chunks.py) kept in the `blobs` table. A real
dict with a key starting with "$" is wrapped as `{"$literal": {...}}`, so
decoding is exact whatever the request holds.

Response (`result_to_record` / `result_from_record`, used by cache/store.py
only: the engine hands the cache ChatResult/EmbedResult and gets them back):
the result fields as JSON (`ChatRecord` / `EmbedRecord`), except an embedding reply's `vectors`
(a list of equal-length float lists), which go into a BLOB as little-endian
float32 when every value survives the float32 round trip exactly (local
models, OpenAI's base64 embeddings), float64 otherwise -- so the decoded
floats always equal the stored ones, at 4 (or 8) bytes a number instead of
~20 characters of JSON.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Container, Iterable, Mapping
from typing import Required, TypedDict, cast, final

import numpy as np
import orjson

from cache.chunks import chunk_bounds
from providers.base import ChatResult, EmbedResult, JSONValue, Result

CHUNKS = "$chunks"
LITERAL = "$literal"


@final  # no other keys: `"vectors" in record` tells an EmbedRecord
class ChatRecord(TypedDict, total=False):
    """A chat reply as the `response` column holds it (older records may lack the optional fields)."""

    text: Required[str]
    finish_reason: str
    input_tokens: int
    output_tokens: int
    latency: float
    request_id: str | None
    cache_read_tokens: int   # only when non-zero
    cache_write_tokens: int  # only when non-zero
    cache_write_1h_tokens: int  # only when non-zero: the part written to Anthropic's 1-hour cache
    reasoning: str           # only when the reply carried some (older records have none: read as None)


@final
class EmbedRecord(TypedDict, total=False):
    """An embedding reply: `vectors` packed into the `vectors` BLOB when they are a float matrix."""

    vectors: Required[list[list[float]]]
    input_tokens: int
    latency: float
    request_id: str | None


Record = ChatRecord | EmbedRecord


# -- identity -------------------------------------------------------------------
# An identity's values as orjson reads them back: exact dicts, lists and scalars.
def encode_identity(identity: JSONValue, blob_min_chars: int, known: Container[str] = frozenset()
                    ) -> tuple[JSONValue, dict[str, tuple[str, int]]]:
    """(encoded identity, {digest: (chunk text, size in UTF-8 bytes)}).
    `identity` must already be canonical (keys.normalize). Chunks whose digest
    is in `known` (already stored) are referred to but not returned: each is
    sliced, hashed and dropped, so a book-sized text costs one chunk at a time."""
    blobs: dict[str, tuple[str, int]] = {}

    def encode(value: JSONValue) -> JSONValue:
        if type(value) is str:
            if len(value) <= blob_min_chars:
                return value
            digests: list[JSONValue] = []
            for start, end in chunk_bounds(value):
                piece = value[start:end]
                raw = piece.encode("utf-8")
                digest = hashlib.sha256(raw).hexdigest()
                if digest not in known:
                    blobs[digest] = (piece, len(raw))
                digests.append(digest)
            return {CHUNKS: digests}
        if type(value) is dict:
            out: JSONValue = {k: encode(v) for k, v in value.items()}
            return {LITERAL: out} if any(k.startswith("$") for k in value) else out
        if type(value) is list:
            return [encode(v) for v in value]
        return value

    return encode(identity), blobs


def chunk_list(value: JSONValue) -> list[str]:
    """The digests of a `{"$chunks": [...]}`; TypeError when they are not a list of strings (a damaged entry)."""
    digests = [d for d in value if type(d) is str] if type(value) is list else []
    if type(value) is not list or len(digests) != len(value):
        raise TypeError(f"{CHUNKS} is not a list of digests")
    return digests


def _literal(value: JSONValue) -> dict[str, JSONValue]:
    """The object a `{"$literal": {...}}` wraps; TypeError when it is not one (a damaged entry)."""
    if type(value) is not dict:
        raise TypeError(f"{LITERAL} does not wrap an object")
    return value


def chunk_digests(encoded: JSONValue) -> set[str]:
    """Every blob digest an encoded identity refers to."""
    found: set[str] = set()

    def walk(value: JSONValue) -> None:
        if type(value) is dict:
            if CHUNKS in value and len(value) == 1:
                found.update(chunk_list(value[CHUNKS]))
                return
            for v in (_literal(value[LITERAL]) if LITERAL in value and len(value) == 1 else value).values():
                walk(v)
        elif type(value) is list:
            for v in value:
                walk(v)

    walk(encoded)
    return found


def decode_identity(encoded: JSONValue, fetch: Callable[[Iterable[str]], dict[str, str]]) -> JSONValue:
    """The identity, rebuilt exactly. `fetch(digests)` returns {digest: text};
    a missing chunk raises KeyError (a damaged cache)."""
    texts = fetch(chunk_digests(encoded))

    def decode(value: JSONValue) -> JSONValue:
        if type(value) is dict:
            if len(value) == 1 and CHUNKS in value:
                return "".join(texts[d] for d in chunk_list(value[CHUNKS]))
            if len(value) == 1 and LITERAL in value:
                return {k: decode(v) for k, v in _literal(value[LITERAL]).items()}
            return {k: decode(v) for k, v in value.items()}
        if type(value) is list:
            return [decode(v) for v in value]
        return value

    return decode(encoded)


# -- response -------------------------------------------------------------------
def encode_response(response: Mapping[str, object]) -> tuple[str, bytes | None, str | None, int | None]:
    """(JSON text, packed vectors or None, dtype "<f4"/"<f8" or None, vector count or None).
    `response`: a Record, or a record as exported (kept as it is)."""
    vectors = response.get("vectors")
    if type(vectors) is list and vectors and (packed := _pack_vectors(vectors)) is not None:
        rest = {k: v for k, v in response.items() if k != "vectors"}
        blob, dtype = packed
        return orjson.dumps(rest).decode(), blob, dtype, len(vectors)
    return orjson.dumps(response).decode(), None, None, None


def decode_response(text: str | bytes, vectors: bytes | None, dtype: str | None, count: int | None) -> Record:
    if vectors is None:
        response: Record = orjson.loads(text)
        return response
    embedding: EmbedRecord = orjson.loads(text)
    array = np.frombuffer(vectors, dtype=dtype).astype(np.float64)
    embedding["vectors"] = array.reshape(count, -1).tolist() if count else []
    return embedding


def _pack_vectors(vectors: list[object]) -> tuple[bytes, str] | None:
    try:
        array = np.asarray(vectors)
    except ValueError:  # ragged
        return None
    if array.ndim != 2 or array.shape[1] == 0 or array.dtype.kind != "f":
        return None  # not a matrix of floats: keep it in the JSON as it is
    array = array.astype(np.float64, copy=False)
    single = array.astype(np.float32)
    if np.array_equal(single, array):
        return single.astype("<f4").tobytes(), "<f4"
    return array.astype("<f8").tobytes(), "<f8"


# -- results ----------------------------------------------------------------------
def result_to_record(result: Result) -> Record:
    """The cache's response: the result's fields (an embedding has `vectors`)."""
    if isinstance(result, ChatResult):
        record: ChatRecord = {"text": result.text, "finish_reason": result.finish_reason,
                  "input_tokens": result.input_tokens, "output_tokens": result.output_tokens,
                  "latency": result.latency, "request_id": result.request_id}
        # Prompt-cache counts only when there are some: older records stay as they were.
        if result.cache_read_tokens:
            record["cache_read_tokens"] = result.cache_read_tokens
        if result.cache_write_tokens:
            record["cache_write_tokens"] = result.cache_write_tokens
        if result.cache_write_1h_tokens:
            record["cache_write_1h_tokens"] = result.cache_write_1h_tokens
        if result.reasoning is not None:
            record["reasoning"] = result.reasoning
        return record
    return {"vectors": result.vectors, "input_tokens": result.input_tokens,
            "latency": result.latency, "request_id": result.request_id}


# The keys a chat record may hold (ChatRecord's): a record of only these is
# passed to ChatResult as keywords, in one call (read for every cache hit).
_CHAT_RECORD_KEYS = frozenset(ChatRecord.__annotations__)
# What result_to_record writes for a reply with no prompt-cache counts and no
# reasoning: nearly every hit. Taken by name and passed positionally, in
# ChatResult's field order (0.45 us, against 1.1 for ChatResult(**record)).
_PLAIN_CHAT_KEYS = frozenset(("text", "finish_reason", "input_tokens", "output_tokens", "latency", "request_id"))


def result_from_record(record: Record) -> Result:
    if record.keys() == _PLAIN_CHAT_KEYS:  # a set comparison: any key order
        r = cast(ChatRecord, record)
        return ChatResult(r["text"], r["finish_reason"], r["input_tokens"], r["output_tokens"], r["latency"],
                          r["request_id"])
    if record.keys() <= _CHAT_RECORD_KEYS:
        try:
            return ChatResult(**record)
        except TypeError:  # no "text": the lookups below say so (KeyError)
            pass
    if "vectors" in record:
        return EmbedResult(vectors=record["vectors"], input_tokens=record.get("input_tokens", 0),
                           latency=record.get("latency", 0.0), request_id=record.get("request_id"))
    r = record  # read for every cache hit: positional, in ChatResult's field order
    return ChatResult(r["text"], r.get("finish_reason", "stop"), r.get("input_tokens", 0), r.get("output_tokens", 0),
                      r.get("latency", 0.0), r.get("request_id"), r.get("cache_read_tokens", 0),
                      r.get("cache_write_tokens", 0), r.get("cache_write_1h_tokens", 0), reasoning=r.get("reasoning"))
