"""Looking after a cache file: statistics, why a request missed, pruning,
export and import. Plain synchronous functions over a `sqlite3` connection;
cache/command.py puts them behind `tulving cache ...`.

Export format (JSON Lines, UTF-8), one object a line:

    {"format": "tulving-cache-export", "version": 1}
    {"blob": "<sha256>", "text": "<chunk>"}                 -- every chunk the entries use, first
    {"key": ..., "op": ..., "model": ..., "kind": ..., "base_url": ..., "created_at": ...,
     "identity": {...}, "response": {...}}                    -- then one line per entry

An entry's identity keeps its long strings as {"$chunks": [digest, ...]}
(cache/codec.py), so a book shared by 686 prompts is written once; vectors
are plain float lists. Import checks every chunk against its digest and every
key against its rebuilt identity, then merges in one transaction (existing
keys are kept), so a damaged file imports nothing.
"""
from __future__ import annotations

import hashlib
import os
import sqlite3
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import orjson

from cache.codec import (
    CHUNKS,
    Record,
    chunk_digests,
    chunk_list,
    decode_identity,
    decode_response,
    encode_identity,
    encode_response,
)
from cache.keys import Identity, normalize, request_key
from cache.store import ENTRY_COLUMNS, INSERT_BLOB, INSERT_ENTRY, CacheError, connect, iso_utc
from providers.base import JSONObject, JSONValue, TulvingError

EXPORT_FORMAT = "tulving-cache-export"
EXPORT_VERSION = 1
SNIPPET = 60  # characters of context shown around a difference


# -- reading entries back -------------------------------------------------------
def fetch_blobs(conn: sqlite3.Connection, digests: Iterable[str]) -> dict[str, str]:
    digests = list(digests)
    found: dict[str, str] = {}
    for i in range(0, len(digests), 500):
        batch = digests[i:i + 500]
        sql = f"SELECT digest, text FROM blobs WHERE digest IN ({','.join('?' * len(batch))})"
        found.update(conn.execute(sql, batch))
    missing = set(digests) - found.keys()
    if missing:
        raise CacheError(f"the cache is damaged: chunk {sorted(missing)[0]} is missing (and {len(missing) - 1} more)")
    return found


def rebuild_identity(conn: sqlite3.Connection, identity_json: str) -> JSONObject:
    """A stored identity with its long texts put back (an identity is always a JSON object)."""
    identity = decode_identity(orjson.loads(identity_json), lambda d: fetch_blobs(conn, d))
    if not isinstance(identity, dict):
        raise CacheError("the cache is damaged: a stored identity is not a JSON object")
    return identity


SQLValue = str | bytes | int | float | None  # what an SQLite column gives back


@dataclass
class Entry:
    key: str
    op: str
    model: str
    kind: str | None
    base_url: str | None
    created_at: str
    identity: JSONObject
    response: Record


def load_entry(conn: sqlite3.Connection, key: str) -> Entry | None:
    row = conn.execute("SELECT key, op, model, kind, base_url, created_at, response, vectors, vector_dtype, "
                       "vector_count, identity FROM entries WHERE key = ?", (key,)).fetchone()
    if row is None:
        return None
    key, op, model, kind, base_url, created_at, text, vectors, dtype, count, identity = row
    return Entry(key, op, model, kind, base_url, created_at, rebuild_identity(conn, identity),
                 decode_response(text, vectors, dtype, count))


def open_existing(path: str | os.PathLike[str] | None) -> sqlite3.Connection:
    if path is None:
        raise TulvingError("no cache file given: pass --cache PATH")
    return connect(path, create=False)


def _file_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


# -- stats ----------------------------------------------------------------------
class ModelStats(TypedDict):
    """The entries of one (op, model)."""

    op: str
    model: str
    entries: int
    oldest: str
    newest: str


class CacheStats(TypedDict):
    """What `tulving cache stats` prints of a cache file."""

    path: str
    file_bytes: int
    entries: int
    oldest: str | None  # None: no entries
    newest: str | None
    by_model: list[ModelStats]
    blobs: int
    blob_bytes: int


def stats(path: str | os.PathLike[str]) -> CacheStats:
    conn = open_existing(path)
    try:
        by_model: list[ModelStats] = [{"op": op, "model": model, "entries": n, "oldest": lo, "newest": hi}
                    for op, model, n, lo, hi in conn.execute(
                        "SELECT op, model, count(*), min(created_at), max(created_at) FROM entries "
                        "GROUP BY op, model ORDER BY op, model")]
        entries, oldest, newest = conn.execute("SELECT count(*), min(created_at), max(created_at) FROM entries").fetchone()
        blobs, blob_bytes = conn.execute("SELECT count(*), coalesce(sum(size), 0) FROM blobs").fetchone()
    finally:
        conn.close()
    return {"path": str(path), "file_bytes": _file_bytes(Path(path)), "entries": entries, "oldest": oldest,
            "newest": newest, "by_model": by_model, "blobs": blobs, "blob_bytes": blob_bytes}


def format_stats(s: CacheStats) -> str:
    lines = [f"cache {s['path']}: {_size(s['file_bytes'])}",
             f"entries: {s['entries']:,}" + (f" (oldest {s['oldest']}, newest {s['newest']})" if s["entries"] else "")]
    width = max((len(m["model"]) for m in s["by_model"]), default=0)
    for m in s["by_model"]:
        lines.append(f"  {m['op']:<5}  {m['model']:<{width}}  {m['entries']:>9,}   newest {m['newest']}")
    lines.append(f"blobs: {s['blobs']:,} chunks of long texts, {_size(s['blob_bytes'])}")
    return "\n".join(lines)


def _size(n: float) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} bytes"  # pragma: no cover


# -- explain --------------------------------------------------------------------
@dataclass
class Explanation:
    key: str
    hit: bool
    op: str
    candidates: int = 0  # cached entries of the same op
    nearest: str | None = None  # its key
    nearest_model: str | None = None
    nearest_created_at: str | None = None
    agree: int = 0
    fields: int = 0
    differences: list[str] = field(default_factory=list)
    unrelated: str | None = None  # why the nearest entry was not shown: it shares no model/provider

    def format(self) -> str:
        if self.hit:
            return f"hit: key {self.key} is cached"
        lines = [f"miss: key {self.key} is not cached"]
        if self.nearest is None and self.unrelated:
            lines.append(f"nothing close: none of the {self.candidates:,} cached {self.op} entries is of the same "
                         f"model and provider ({self.unrelated})")
            return "\n".join(lines)
        if self.nearest is None:
            lines.append(f"the cache holds no {self.op} entries")
            return "\n".join(lines)
        lines.append(f"nearest of {self.candidates:,} cached {self.op} entries: {self.nearest} "
                     f"({self.nearest_model}, {self.nearest_created_at}); {self.agree} of {self.fields} fields agree")
        lines.extend(f"  {d}" for d in self.differences)
        return "\n".join(lines)


def explain(path: str | os.PathLike[str], identity: Identity) -> Explanation:
    """Why the request with this identity is (not) cached: a hit, or the
    nearest cached entry of the same op and the fields that differ."""
    normalized: JSONObject = normalize(identity)
    key = request_key(normalized)
    op = str(normalized.get("op", "chat"))
    conn = open_existing(path)
    try:
        if conn.execute("SELECT 1 FROM entries WHERE key = ?", (key,)).fetchone():
            return Explanation(key=key, hit=True, op=op)
        # Rank on the stored (chunked) form: equal long texts have equal digest
        # lists. Ties go to the entry whose differing texts share the longest
        # prefix with the request's (the same book, the nearest question), then
        # to the newest.
        encoded, query_chunks = _encoded(normalized)
        texts = _ChunkTexts(conn, {d: text for d, (text, _) in query_chunks.items()})
        query_fields = _fields(encoded)
        candidates = 0
        best_rank: tuple[int, int, str] | None = None
        best: tuple[str, str, str] | None = None
        for cand_key, model, created_at, cand_identity in conn.execute(
                "SELECT key, model, created_at, identity FROM entries WHERE op = ?", (op,)):
            candidates += 1
            cand_fields = _fields(orjson.loads(cand_identity))
            names = query_fields.keys() | cand_fields.keys()
            agree = sum(1 for n in names if query_fields.get(n, _ABSENT) == cand_fields.get(n, _ABSENT))
            if best_rank is not None and agree < best_rank[0]:
                continue
            shared = sum(_shared_prefix(query_fields[n], cand_fields[n], texts)
                         for n in query_fields.keys() & cand_fields.keys() if query_fields[n] != cand_fields[n])
            if best_rank is None or (agree, shared, created_at) > best_rank:
                best_rank, best = (agree, shared, created_at), (cand_key, created_at, model)
        result = Explanation(key=key, hit=False, op=op, candidates=candidates)
        if best is None:
            return result
        cand_key, created_at, model = best
        (cand_identity,) = conn.execute("SELECT identity FROM entries WHERE key = ?", (cand_key,)).fetchone()
        cached = _fields(rebuild_identity(conn, cand_identity))
        wanted = _fields(normalized)
        apart = [n for n in ("model", "kind", "base_url") if wanted.get(n, _ABSENT) != cached.get(n, _ABSENT)]
        if apart:  # an entry of another model or provider is not "near": say so rather than compare
            result.unrelated = f"the nearest differs in {', '.join(apart)}"
            return result
        ordered = sorted(wanted.keys() | cached.keys(), key=_field_order)
        result.nearest, result.nearest_model, result.nearest_created_at = cand_key, model, created_at
        result.fields = len(ordered)
        result.agree = sum(1 for n in ordered if wanted.get(n, _ABSENT) == cached.get(n, _ABSENT))
        result.differences = [_describe(n, cached.get(n, _ABSENT), wanted.get(n, _ABSENT))
                              for n in ordered if wanted.get(n, _ABSENT) != cached.get(n, _ABSENT)]
        return result
    finally:
        conn.close()


def _encoded(identity: JSONObject) -> tuple[JSONObject, dict[str, tuple[str, int]]]:
    """An identity as the cache stores it (its long texts as chunk digests), and those chunks."""
    encoded, chunks = encode_identity(identity, 4096)
    assert isinstance(encoded, dict)  # an object encodes as an object
    return encoded, chunks


class _ChunkTexts:
    """Chunk texts by digest: the request's own, else read from the cache once."""

    def __init__(self, conn: sqlite3.Connection, known: dict[str, str]):
        self.conn, self.known = conn, known

    def __getitem__(self, digest: str) -> str:
        if digest not in self.known:
            self.known.update(fetch_blobs(self.conn, [digest]))
        return self.known[digest]


def _shared_prefix(a: JSONValue, b: JSONValue, texts: _ChunkTexts) -> int:
    """How many leading characters two encoded values have in common (texts,
    chunked texts, or messages by their content); 0 for anything else."""
    if isinstance(a, dict) and isinstance(b, dict) and "content" in a and "content" in b:
        return _shared_prefix(a["content"], b["content"], texts)
    if isinstance(a, str) and isinstance(b, str):
        return _common_prefix(a, b)
    if isinstance(a, dict) and isinstance(b, dict) and CHUNKS in a and CHUNKS in b:
        shared = 0
        for da, db in zip(chunk_list(a[CHUNKS]), chunk_list(b[CHUNKS])):
            if da != db:
                return shared + _common_prefix(texts[da], texts[db])
            shared += len(texts[da])
        return shared
    return 0


def _common_prefix(a: str, b: str, step: int = 4096) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i:i + step] == b[i:i + step]:
        i += step
    end = min(i + step, n)
    while i < end and a[i] == b[i]:
        i += 1
    return min(i, n)


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


_ABSENT = _Absent()


def _fields(identity: JSONObject) -> dict[str, JSONValue]:
    """The identity as named fields: kind, base_url, model, params.<name>,
    messages[i], texts[i], draw (and any other top-level key as itself)."""
    out: dict[str, JSONValue] = {}
    for name, value in identity.items():
        if name == "op":
            continue
        if name == "params" and isinstance(value, dict):
            out.update((f"params.{k}", v) for k, v in value.items())
        elif name in ("messages", "texts") and isinstance(value, list):
            out.update((f"{name}[{i}]", v) for i, v in enumerate(value))
        else:
            out[name] = value
    return out


def _field_order(name: str) -> tuple[int, int, str]:
    head = name.split("[")[0].split(".")[0]
    order = {"kind": 0, "base_url": 1, "model": 2, "params": 3, "messages": 4, "texts": 4, "draw": 5}
    index = int(name.split("[")[1].rstrip("]")) if "[" in name else -1
    return order.get(head, 6), index, name


def _describe(name: str, cached: JSONValue | _Absent, wanted: JSONValue | _Absent) -> str:
    if cached is _ABSENT:
        return f"{name}: only in the request: {_show(wanted)}"
    if wanted is _ABSENT:
        return f"{name}: only in the cached entry: {_show(cached)}"
    if isinstance(cached, dict) and isinstance(wanted, dict) and "content" in cached and "content" in wanted:
        parts = []
        if cached.get("role") != wanted.get("role"):
            parts.append(f"{name}.role: cached {cached.get('role')!r}, request {wanted.get('role')!r}")
        if cached["content"] != wanted["content"]:  # text, or (a list of blocks) described as any value is
            parts.append(_describe(f"{name}.content", cached["content"], wanted["content"]))
        others = (cached.keys() | wanted.keys()) - {"role", "content"}
        parts.extend(f"{name}.{k}: cached {_show(cached.get(k, _ABSENT))}, request {_show(wanted.get(k, _ABSENT))}"
                     for k in sorted(others) if cached.get(k, _ABSENT) != wanted.get(k, _ABSENT))
        return "\n  ".join(parts)
    if isinstance(cached, str) and isinstance(wanted, str):
        return _describe_text(name, cached, wanted)
    return f"{name}: cached {_show(cached)}, request {_show(wanted)}"


def _describe_text(name: str, cached: str, wanted: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(cached, wanted)) if a != b), min(len(cached), len(wanted)))
    start = max(0, at - SNIPPET // 3)
    return (f"{name}: differs at character {at:,} (cached {len(cached):,} chars, request {len(wanted):,} chars)\n"
            f"      cached:  {_snippet(cached, start)}\n"
            f"      request: {_snippet(wanted, start)}")


def _snippet(text: str, start: int) -> str:
    piece = text[start:start + SNIPPET]
    return ("…" if start > 0 else "") + repr(piece) + ("…" if start + SNIPPET < len(text) else "")


def _show(value: JSONValue | _Absent) -> str:
    text = repr(value) if not isinstance(value, (dict, list)) else orjson.dumps(value).decode()
    return text if len(text) <= 2 * SNIPPET else text[:2 * SNIPPET] + f"… ({len(text):,} chars)"


def show_entry(path: str | os.PathLike[str], key: str, *, full: bool = False) -> str:
    """One entry as indented JSON (long texts shortened unless `full`)."""
    conn = open_existing(path)
    try:
        entry = load_entry(conn, key)
    finally:
        conn.close()
    if entry is None:
        raise TulvingError(f"no entry with key {key} in {path}")
    data = {"key": entry.key, "op": entry.op, "model": entry.model, "kind": entry.kind, "base_url": entry.base_url,
            "created_at": entry.created_at, "identity": entry.identity, "response": entry.response}
    return orjson.dumps(data if full else _shorten(data), option=orjson.OPT_INDENT_2).decode()


def _shorten(value: object, limit: int = 300) -> object:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit // 2] + f" …[{len(value) - limit:,} chars]… " + value[-limit // 2:]
    if isinstance(value, dict):
        if "vectors" in value and isinstance(value["vectors"], list) and value["vectors"]:
            vectors = value["vectors"]
            width = len(vectors[0]) if isinstance(vectors[0], list) else 0
            return {**{k: _shorten(v, limit) for k, v in value.items() if k != "vectors"},
                    "vectors": f"[{len(vectors)} vectors of {width} floats]"}
        return {k: _shorten(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [_shorten(v, limit) for v in value]
    return value


# -- prune ----------------------------------------------------------------------
@dataclass
class PruneReport:
    entries: dict[str, int]  # removed, by op
    blobs: int
    blob_bytes: int
    bytes_before: int
    bytes_after: int

    def format(self) -> str:
        removed = ", ".join(f"{n:,} {op}" for op, n in sorted(self.entries.items())) or "none"
        return (f"removed entries: {removed}; orphaned chunks: {self.blobs:,} ({_size(self.blob_bytes)}); "
                f"file {_size(self.bytes_before)} -> {_size(self.bytes_after)}")


def prune(path: str | os.PathLike[str], *, older_than_days: float | None = None, models: Iterable[str] = (),
          now: float | None = None) -> PruneReport:
    """Delete the entries older than `older_than_days` and/or of the given
    model names (both filters: entries matching both), then the chunks no
    entry uses, then VACUUM. With no filter only orphaned chunks go.
    Run it while no engine writes to the same file."""
    models = list(models)
    path = Path(path)
    conn = open_existing(path)
    try:
        before = _file_bytes(path)
        where, args = [], []
        if older_than_days is not None:
            if older_than_days < 0:
                raise TulvingError(f"--older-than must be >= 0 days, got {older_than_days}")
            where.append("created_at < ?")
            args.append(iso_utc((time.time() if now is None else now) - older_than_days * 86400))
        if models:
            where.append(f"model IN ({','.join('?' * len(models))})")
            args.extend(models)
        removed: dict[str, int] = {}
        conn.execute("BEGIN IMMEDIATE")
        try:
            if where:
                condition = " AND ".join(where)
                removed = dict(conn.execute(f"SELECT op, count(*) FROM entries WHERE {condition} GROUP BY op", args))
                conn.execute(f"DELETE FROM entries WHERE {condition}", args)
            used: set[str] = set()
            for (identity,) in conn.execute("SELECT identity FROM entries WHERE instr(identity, ?) > 0", (CHUNKS,)):
                used |= chunk_digests(orjson.loads(identity))
            orphans = [(d, size) for d, size in conn.execute("SELECT digest, size FROM blobs") if d not in used]
            conn.executemany("DELETE FROM blobs WHERE digest = ?", [(d,) for d, _ in orphans])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return PruneReport(entries=removed, blobs=len(orphans), blob_bytes=sum(s for _, s in orphans),
                           bytes_before=before, bytes_after=_file_bytes(path))
    finally:
        conn.close()


# -- export / import ------------------------------------------------------------
def export_jsonl(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> dict[str, int]:
    """Write the whole cache to `out` (JSON Lines, see the module docstring);
    `out` "-" is stdout. Returns {"entries": n, "blobs": m}."""
    conn = open_existing(path)
    try:
        used: set[str] = set()
        for (identity,) in conn.execute("SELECT identity FROM entries WHERE instr(identity, ?) > 0", (CHUNKS,)):
            used |= chunk_digests(orjson.loads(identity))
        stream = sys.stdout.buffer if str(out) == "-" else open(out, "wb")
        entries = 0
        try:
            stream.write(orjson.dumps({"format": EXPORT_FORMAT, "version": EXPORT_VERSION}) + b"\n")
            for digest in sorted(used):
                (text,) = conn.execute("SELECT text FROM blobs WHERE digest = ?", (digest,)).fetchone() or (None,)
                if text is None:
                    raise CacheError(f"the cache is damaged: chunk {digest} is missing")
                stream.write(orjson.dumps({"blob": digest, "text": text}) + b"\n")
            for row in conn.execute("SELECT key, op, model, kind, base_url, created_at, response, vectors, "
                                    "vector_dtype, vector_count, identity FROM entries ORDER BY created_at, key"):
                key, op, model, kind, base_url, created_at, text, vectors, dtype, count, identity = row
                stream.write(orjson.dumps({
                    "key": key, "op": op, "model": model, "kind": kind, "base_url": base_url,
                    "created_at": created_at, "identity": orjson.Fragment(identity),
                    "response": decode_response(text, vectors, dtype, count)}) + b"\n")
                entries += 1
        finally:
            if stream is not sys.stdout.buffer:
                stream.close()
        return {"entries": entries, "blobs": len(used)}
    finally:
        conn.close()


def import_jsonl(path: str | os.PathLike[str], source: str | os.PathLike[str]) -> dict[str, int]:
    """Merge an export into the cache at `path` (created if missing). Existing
    keys are kept. Returns {"imported": n, "skipped": m, "blobs": k}."""
    source_path = Path(source) if str(source) != "-" else None
    if source_path is not None and not source_path.is_file():
        raise TulvingError(f"no export file at {source_path}")
    stream = sys.stdin.buffer if source_path is None else open(source_path, "rb")
    name = "stdin" if source_path is None else str(source_path)
    conn = connect(path, create=True)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            counts = _import_items(conn, _export_items(stream, name), name)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
        conn.close()
    return counts


def _export_items(stream: Iterable[bytes], name: str) -> Iterator[tuple[int, object]]:
    """(line number, parsed JSON) for every non-blank line of an export, its
    header checked first."""
    header = False
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise TulvingError(f"{name}: line {number} is not valid JSON ({exc})") from None
        if header:
            yield number, item
            continue
        header = True
        if not isinstance(item, dict) or item.get("format") != EXPORT_FORMAT:
            raise TulvingError(f"{name} is not a Tulving cache export (no header line)")
        if item.get("version") != EXPORT_VERSION:
            raise TulvingError(f"{name}: unsupported export version {item.get('version')!r}")
    if not header:
        raise TulvingError(f"{name} is empty, not a Tulving cache export")


def _import_items(conn: sqlite3.Connection, items: Iterable[tuple[int, object]], name: str) -> dict[str, int]:
    counts = {"imported": 0, "skipped": 0, "blobs": 0}
    for number, item in items:
        if isinstance(item, dict) and "blob" in item:
            counts["blobs"] += _import_blob(conn, item, name, number)
        elif isinstance(item, dict) and "key" in item:
            counts["imported" if _import_entry(conn, item, name, number) else "skipped"] += 1
        else:
            raise TulvingError(f"{name}: line {number} is neither a chunk nor an entry")
    return counts


def _import_blob(conn: sqlite3.Connection, item: dict[str, object], name: str, number: int) -> int:
    digest, text = item.get("blob"), item.get("text")
    if not isinstance(text, str) or not isinstance(digest, str):
        raise TulvingError(f"{name}: line {number}: a chunk needs a digest and a text")
    raw = text.encode("utf-8")
    if hashlib.sha256(raw).hexdigest() != digest:
        raise TulvingError(f"{name}: line {number}: chunk {digest[:12]}… does not match its digest")
    return conn.execute(INSERT_BLOB, (digest, len(raw), text)).rowcount


def _import_entry(conn: sqlite3.Connection, item: dict[str, object], name: str, number: int) -> bool:
    try:
        key, identity, response = item["key"], item["identity"], item["response"]
        created_at = item.get("created_at") or iso_utc(time.time())
        if not isinstance(identity, dict) or not isinstance(response, dict):
            raise TypeError("identity and response must be objects")
        rebuilt = decode_identity(identity, lambda digests: fetch_blobs(conn, digests))
        if not isinstance(rebuilt, dict):
            raise TypeError("the identity does not decode to an object")
    except (KeyError, TypeError) as exc:
        raise TulvingError(f"{name}: line {number}: malformed entry ({exc})") from None
    except CacheError:
        raise TulvingError(f"{name}: line {number}: entry {str(key)[:12]}… uses a chunk the file does not hold") from None
    if request_key(rebuilt) != key:
        raise TulvingError(f"{name}: line {number}: key {str(key)[:12]}… does not match its identity")
    if conn.execute("SELECT 1 FROM entries WHERE key = ?", (key,)).fetchone():
        return False
    text, vectors, dtype, count = encode_response(response)  # as exported: kept as it is
    conn.execute(INSERT_ENTRY, (key, str(rebuilt.get("op", "chat")), str(rebuilt.get("model", "")),
                                rebuilt.get("kind"), rebuilt.get("base_url"), str(created_at), text, vectors,
                                dtype, count, orjson.dumps(identity).decode()))
    return True


# -- check and recover -----------------------------------------------------------
@dataclass
class CheckReport:
    path: str
    entries: int = 0
    verified: int = 0          # checksum present and matching
    unverified: int = 0        # written before checksums: decoded fine, nothing to compare
    damaged: list[str] = field(default_factory=list)  # keys whose row does not match its checksum
    integrity: list[str] = field(default_factory=list)  # SQLite's own findings ("ok" when none)
    error: str | None = None   # the file could not be read through

    @property
    def ok(self) -> bool:
        return not self.damaged and self.error is None and self.integrity in ([], ["ok"])

    def format(self) -> str:
        lines = [f"cache {self.path}: {self.entries} entries, {self.verified} verified by checksum, "
                 f"{self.unverified} without one (written before checksums)"]
        if self.damaged:
            lines.append(f"{len(self.damaged)} damaged entries (read as misses, rewritten when asked again): "
                         + ", ".join(k[:16] for k in self.damaged[:10]) + (" ..." if len(self.damaged) > 10 else ""))
        if self.integrity not in ([], ["ok"]):
            lines.append("SQLite integrity check: " + "; ".join(self.integrity[:5]))
        if self.error:
            lines.append(f"reading stopped: {self.error}")
        lines.append("ok" if self.ok else f"damaged: run `tulving --cache {self.path} cache recover` to copy the "
                                          f"readable entries into a new file")
        return "\n".join(lines)


def _matches(checksum: SQLValue, key: str, raw: SQLValue, vectors: SQLValue) -> bool:
    """Whether a row's checksum matches its response and vectors (a row whose
    columns hold the wrong types, e.g. edited by hand, does not)."""
    from cache.store import stored_checksum

    if not isinstance(raw, bytes) or not (vectors is None or isinstance(vectors, bytes)):
        return False
    return checksum == stored_checksum(key, raw, vectors)


def check(path: str | os.PathLike[str]) -> CheckReport:
    """Read every entry of the cache and compare it with its checksum, plus
    SQLite's quick_check. Raises CacheError for a file that cannot be opened."""
    conn = open_existing(path)
    report = CheckReport(path=str(path))
    try:
        try:
            report.integrity = [row[0] for row in conn.execute("PRAGMA quick_check(20)")]
            has_sum = "checksum" in {row[1] for row in conn.execute("PRAGMA table_info(entries)")}
            column = "checksum" if has_sum else "NULL"
            # The response as its stored bytes: one that is not UTF-8 is a damaged
            # entry, listed, not the end of the check.
            for key, raw, vectors, checksum in conn.execute(
                    f"SELECT key, CAST(response AS BLOB), vectors, {column} FROM entries"):
                report.entries += 1
                if checksum is None:
                    try:
                        orjson.loads(raw)
                        report.unverified += 1
                    except (orjson.JSONDecodeError, TypeError):
                        report.damaged.append(str(key))
                elif _matches(checksum, str(key), raw, vectors):
                    report.verified += 1
                else:
                    report.damaged.append(str(key))
        except sqlite3.DatabaseError as exc:
            report.error = str(exc)
    finally:
        conn.close()
    return report


@dataclass
class RecoverReport:
    source: str
    target: str
    recovered: int = 0
    damaged: int = 0       # rows read but failing their checksum or not decodable
    unreadable: int = 0    # rows SQLite could not read
    blobs: int = 0

    def format(self) -> str:
        return (f"recovered {self.recovered} entries and {self.blobs} chunks from {self.source} into {self.target} "
                f"({self.damaged} damaged and {self.unreadable} unreadable rows left behind); use it with "
                f"--cache {self.target}, or move it over the damaged file")


def _rows(conn: sqlite3.Connection, table: str, columns: str) -> Iterator[tuple[Any, ...] | None]:
    """Every row of `table` SQLite can still read, by rowid; None for a row
    (or a stretch of rows) it cannot."""
    try:
        rowids: Sequence[int] = [r[0] for r in conn.execute(f"SELECT rowid FROM {table} ORDER BY rowid")]
    except sqlite3.DatabaseError:
        try:
            top = conn.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0
        except sqlite3.DatabaseError:
            top = 0
        rowids = range(1, top + 1)
    for rowid in rowids:
        try:
            row = conn.execute(f"SELECT {columns} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            yield None
            continue
        if row is not None:
            yield row


def recover(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> RecoverReport:
    """Copy every readable, undamaged entry (and chunk) of the cache at `path`
    into a new cache at `out`, which must not exist."""
    from cache.store import entry_checksum

    source, target = Path(path), Path(out)
    if not source.is_file():
        raise CacheError(f"no cache file at {source}")
    if target.exists():
        raise CacheError(f"{target} already exists: give `cache recover` a new file (--out)")
    report = RecoverReport(source=str(source), target=str(target))
    try:
        src = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
        tables = {row[0] for row in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise CacheError(f"{source} cannot be read as SQLite at all ({exc}): nothing to recover; "
                         f"use --cache elsewhere") from None
    if "entries" not in tables:
        raise CacheError(f"{source} holds no entries table: nothing to recover")
    has_sum = "checksum" in {row[1] for row in src.execute("PRAGMA table_info(entries)")}
    dst = connect(target, create=True)
    try:
        dst.execute("BEGIN IMMEDIATE")
        if "blobs" in tables:
            for row in _rows(src, "blobs", "digest, size, text"):
                if row is None:
                    continue
                digest, size, text = row
                if isinstance(text, str) and hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest() == digest:
                    dst.execute(INSERT_BLOB, (digest, size, text))
                    report.blobs += 1
        columns = ", ".join(("key", "op", "model", "kind", "base_url", "created_at", "response", "vectors",
                             "vector_dtype", "vector_count", "identity", "checksum" if has_sum else "NULL"))
        for row in _rows(src, "entries", columns):
            if row is None:
                report.unreadable += 1
                continue
            key, text, vectors, checksum = row[0], row[6], row[7], row[11]
            try:
                if checksum is not None and checksum != entry_checksum(key, text, vectors):
                    raise ValueError("checksum")
                orjson.loads(text)
            except Exception:  # noqa: BLE001 -- damaged: left behind
                report.damaged += 1
                continue
            dst.execute(f"INSERT OR IGNORE INTO entries ({', '.join(ENTRY_COLUMNS)}) VALUES "
                        f"({', '.join('?' * len(ENTRY_COLUMNS))})", (*row[:11], entry_checksum(key, text, vectors)))
            report.recovered += 1
        dst.execute("COMMIT")
    finally:
        src.close()
        dst.close()
    return report
