"""The response cache: one SQLite file (WAL mode) of successful replies, keyed
by the sha256 of the canonical request identity (cache/keys.py).

Only successful responses are cached: the engine calls `put` once a provider
returned a result; errors are never stored, so a rerun retries them.

Schema (query it with plain SQL, e.g. `sqlite3 runs/cache.sqlite`)::

    meta    (name TEXT PRIMARY KEY, value TEXT)   -- format = 'tulving-cache', version = '1'
    entries (                                     -- one row per cached request
      key          TEXT PRIMARY KEY,  -- sha256 hex of the canonical identity
      op           TEXT NOT NULL,     -- 'chat' | 'embed'
      model        TEXT NOT NULL,     -- the provider's model name (not the alias)
      kind         TEXT,              -- provider kind: openai | anthropic | local | builtin ...
      base_url     TEXT,              -- the alias's first endpoint
      created_at   TEXT NOT NULL,     -- UTC, ISO 8601: '2026-11-22T16:20:01.123456Z'
      response     TEXT NOT NULL,     -- JSON: text, finish_reason, input_tokens, output_tokens, ...
      vectors      BLOB,              -- embed only: the vectors, row-major little-endian floats
      vector_dtype TEXT,              --   '<f4' (exact float32 values) or '<f8'
      vector_count INTEGER,           --   number of vectors (rows)
      identity     TEXT NOT NULL      -- JSON: the request identity (params, messages/texts, draw);
    )                                 --   long strings as {"$chunks": [blob digest, ...]}
    blobs   (                         -- chunks of long texts (books inside prompts), stored once
      digest TEXT PRIMARY KEY,        -- sha256 hex of the chunk's UTF-8 bytes
      size   INTEGER NOT NULL,        -- bytes
      text   TEXT NOT NULL
    )

For example, every reply of one model:
    SELECT created_at, json_extract(response, '$.text') FROM entries WHERE model = 'gpt-4o-2024-08-06';
the tokens spent per model:
    SELECT model, sum(json_extract(response, '$.input_tokens')) FROM entries GROUP BY model;
and a long prompt put back together from its chunks (`tulving cache explain
--key KEY` shows an entry with its texts rebuilt):
    SELECT (SELECT group_concat(text, '') FROM (
              SELECT b.text FROM json_each(e.identity, '$.messages[1].content."$chunks"') AS j
              JOIN blobs AS b ON b.digest = j.value ORDER BY j.key))
    FROM entries AS e WHERE key = '...';

Batch mode adds two tables of its own, `batches` and `batch_keys` (the batch
ledger: which provider batches still owe which keys; see cache/batches.py),
created when first used; they leave `entries` as it is, so the format version
stays 1.

The spending ledger adds a `spending` table (what each invocation of a run
paid; see cache/spending_ledger.py), created when first written, format
version unchanged.

Claims (cache/backend.py): a `claims` table, created when first used
(format version unchanged), holds the keys a process is paying for now:

    claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL, lease_until REAL NOT NULL)  -- Unix time

A claim is taken in a `BEGIN IMMEDIATE` transaction (a lapsed lease is
taken over), renewed while its owner runs, and deleted in the transaction
that stores the key's result. A process alone on the file (no other live
row in the `sessions` table, cache/sessions.py) writes no claim rows: it
holds its keys in memory until another process joins.

Concurrency: any number of processes may share one file. Writes go through
one writer thread per cache that commits batches (up to 512 rows or 20 ms) in
`BEGIN IMMEDIATE` transactions with `INSERT OR IGNORE`, waiting up to 30 s
for a lock (busy_timeout). A process killed mid-run loses at most its
uncommitted batch; WAL keeps the file intact. Reads use their own
connection and look keys up in batches of 500: on the event loop's thread
while each lookup is fast (a batch of keys, under 5 ms), on a dedicated
reader thread otherwise.
"""
from __future__ import annotations

import asyncio
import atexit
import dataclasses
import hashlib
import logging
import math
import os
import queue
import sqlite3
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable, Container, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, TypeVarTuple, cast

import orjson

from cache import sessions
from cache.claims import LeaseRenewer, cancel_and_wait, lease_seconds, owner_name, wait_claimed
from cache.codec import Record, decode_response, encode_identity, encode_response, result_from_record, result_to_record
from cache.keys import Identity, dumps_normalized, normalize
from providers.base import Result, TulvingError

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
log = logging.getLogger("tulving.cache")

FORMAT = "tulving-cache"
VERSION = 1
BUSY_TIMEOUT_MS = 30_000
READ_MMAP_BYTES = 256 * 1024 * 1024  # of the file the reader maps (PRAGMA mmap_size)
READ_BATCH = 500  # keys per `WHERE key IN (...)`; under SQLite's oldest variable limit (999)
# Lookups of up to this many keys run on the event loop's own thread until
# INLINE_SLOW_READS of them in a row each took over INLINE_READ_SECONDS
# (see ResponseCache._read_inline).
INLINE_READ_KEYS = 512
INLINE_READ_SECONDS = 0.005
INLINE_SLOW_READS = 3

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    op TEXT NOT NULL,
    model TEXT NOT NULL,
    kind TEXT,
    base_url TEXT,
    created_at TEXT NOT NULL,
    response TEXT NOT NULL,
    vectors BLOB,
    vector_dtype TEXT,
    vector_count INTEGER,
    identity TEXT NOT NULL,
    checksum TEXT
);
CREATE INDEX IF NOT EXISTS entries_by_model ON entries (op, model);
CREATE INDEX IF NOT EXISTS entries_by_time ON entries (created_at);
CREATE TABLE IF NOT EXISTS blobs (
    digest TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    text TEXT NOT NULL
);
"""
_BASE_COLUMNS = ("key", "op", "model", "kind", "base_url", "created_at", "response", "vectors",
                 "vector_dtype", "vector_count", "identity")
# `checksum` (added in place to caches written before it): entry_checksum of
# the row; a row whose checksum does not match is a miss, never a wrong answer.
ENTRY_COLUMNS = _BASE_COLUMNS + ("checksum",)
INSERT_ENTRY = (f"INSERT OR IGNORE INTO entries ({', '.join(_BASE_COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(_BASE_COLUMNS))})")
INSERT_BLOB = "INSERT OR IGNORE INTO blobs (digest, size, text) VALUES (?, ?, ?)"
CLAIMS_SCHEMA = "CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL, lease_until REAL NOT NULL)"


# Entries go in as multi-row INSERTs: one statement step (during which
# sqlite3 releases the GIL) per up to ENTRY_ROWS_PER_INSERT rows instead of one
# per row, so the writer thread takes the GIL back from the event loop once
# per statement rather than once per row.
ENTRY_ROWS_PER_INSERT = (999 if sqlite3.sqlite_version_info < (3, 32) else 32766) // len(ENTRY_COLUMNS)
_ROW_PLACEHOLDERS = f"({', '.join('?' * len(ENTRY_COLUMNS))})"


def _insert_entries_sql(rows: int) -> str:
    return (f"INSERT OR IGNORE INTO entries ({', '.join(ENTRY_COLUMNS)}) VALUES "
            + ", ".join([_ROW_PLACEHOLDERS] * rows))


# An `entries` row in ENTRY_COLUMNS order; `kind` and `base_url` as the identity holds them.
_Entry = tuple[str, str, str, object, object, str, str, bytes | None, str | None, int | None, str, str]
# What `put` queues for the writer: key, identity, canonical bytes, record, time put, request characters.
_Row = tuple[str, Identity, bytes | None, Record, float, int]


def _insert_entries(conn: sqlite3.Connection, entries: Sequence[_Entry]) -> None:
    for start in range(0, len(entries), ENTRY_ROWS_PER_INSERT):
        part = entries[start:start + ENTRY_ROWS_PER_INSERT]
        conn.execute(_insert_entries_sql(len(part)), [value for row in part for value in row])


class CacheError(TulvingError):
    """The cache file is missing, damaged or not a Tulving cache."""


def damaged(path: Path | str, exc: BaseException) -> CacheError:
    """The one line for a cache SQLite cannot read or write as it is."""
    text = str(exc)
    if "readonly" in text or "read-only" in text or "unable to open" in text:
        return CacheError(f"cannot write the cache {path} ({text}): the file or its folder is read-only; "
                          f"use --cache elsewhere")
    return CacheError(f"the cache {path} is damaged ({text}): run `tulving --cache {path} cache check`, "
                      f"`tulving --cache {path} cache recover` to keep its readable entries, or use --cache elsewhere")


def entry_checksum(key: str, response: str, vectors: bytes | None) -> str:
    """What the `checksum` column holds: sha256 over the key, the response
    JSON and the vectors, 32 hex digits."""
    return stored_checksum(key, response.encode("utf-8", "surrogatepass"), vectors)


def stored_checksum(key: str, raw: bytes, vectors: bytes | None) -> str:
    """`entry_checksum` of a response as its UTF-8 bytes (a lookup reads them
    as stored, `CAST(response AS BLOB)`, with no decode and encode; bytes
    that are not UTF-8 simply do not match)."""
    h = hashlib.sha256(b"%s\0%s" % (key.encode(), raw))
    if vectors:
        h.update(b"\0")
        h.update(vectors)
    return h.hexdigest()[:32]


def connect(path: str | os.PathLike[str], *, create: bool) -> sqlite3.Connection:
    """An autocommit connection to the cache at `path`, checked to be a Tulving
    cache. With `create`, a missing file (and its parent directories) is made
    and the schema written; without, a missing file is a CacheError."""
    path = Path(path)
    if create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create the cache directory {path.parent}: {exc.strerror}") from None
    elif not path.is_file():
        raise CacheError(f"no cache file at {path}")
    if path.is_dir():
        raise CacheError(f"the cache {path} is a folder: give --cache a file path")
    if create and path.exists() and not os.access(path, os.W_OK):
        raise CacheError(f"the cache {path} is read-only: make it writable or use --cache elsewhere")
    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                               check_same_thread=False)
    except sqlite3.Error as exc:
        raise CacheError(f"cannot open the cache {path}: {exc}") from None
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _check_or_create_retrying(conn, path, create)
        conn.execute("PRAGMA synchronous = NORMAL")  # with WAL: a crash never corrupts, commits survive a kill
    except sqlite3.OperationalError as exc:
        conn.close()
        raise damaged(path, exc) from None
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise CacheError(f"{path} is not a Tulving cache or is damaged ({exc}): run `tulving --cache {path} "
                         f"cache recover` to keep its readable entries, or use --cache elsewhere") from None
    except BaseException:
        conn.close()
        raise
    return conn


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _check_or_create_retrying(conn: sqlite3.Connection, path: Path, create: bool) -> None:
    """Two processes opening a new cache file at the same moment: switching
    to WAL (and creating the schema) can answer "database is locked" at once,
    without SQLite's busy handler; wait and look again, as long as a busy
    timeout would have."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    delay = 0.01
    while True:
        try:
            return _check_or_create(conn, path, create)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.2)


def _check_or_create(conn: sqlite3.Connection, path: Path, create: bool) -> None:
    tables = _tables(conn)
    if not tables and create:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute("INSERT OR IGNORE INTO meta (name, value) VALUES ('format', ?), ('version', ?)",
                         (FORMAT, str(VERSION)))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        tables = _tables(conn)
    if "meta" not in tables:
        what = "an empty SQLite database" if not tables else f"a SQLite database with tables {sorted(tables)}"
        raise CacheError(f"{path} is not a Tulving cache: it is {what}")
    meta = dict(conn.execute("SELECT name, value FROM meta"))
    if meta.get("format") != FORMAT:
        raise CacheError(f"{path} is not a Tulving cache (meta format is {meta.get('format')!r})")
    try:
        version = int(meta.get("version", ""))
    except ValueError:
        raise CacheError(f"{path} is not a Tulving cache (bad version {meta.get('version')!r})") from None
    if version > VERSION:
        raise CacheError(f"{path} was written by a newer Tulving (cache format {version}, this one reads {VERSION})")
    if create and conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        conn.execute("PRAGMA journal_mode = WAL")
    if create and "checksum" not in {row[1] for row in conn.execute("PRAGMA table_info(entries)")}:
        conn.execute("ALTER TABLE entries ADD COLUMN checksum TEXT")  # a cache written before checksums


_second_text: tuple[int, str] = (-1, "")  # the last whole second formatted, reused by iso_utc


def iso_utc(timestamp: float) -> str:
    """'2026-11-22T16:20:01.123456Z' (what datetime would print, rounding to
    the microsecond alike), formatting each whole second once."""
    global _second_text
    whole = math.floor(timestamp)
    micros = round((timestamp - whole) * 1e6)
    if micros >= 1_000_000:
        whole, micros = whole + 1, micros - 1_000_000
    second, text = _second_text
    if second != whole:
        text = datetime.fromtimestamp(whole, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second_text = (whole, text)
    return f"{text}.{micros:06d}Z"


def _identity_chars(identity: Identity) -> int:
    messages = identity.get("messages")
    if messages:
        chars = 0
        for m in cast(list[dict[str, str]], messages):  # a loop, not a generator: once per reply put
            chars += len(m.get("content") or "")
        return chars
    texts = identity.get("texts")
    return sum(map(len, cast(list[str], texts))) if texts else 0


def encode_row(key: str, identity: Identity, canonical: bytes | None, response: Record, created: float,
               blob_min_chars: int, known: Container[str] = frozenset()) -> tuple[_Entry, dict[str, tuple[str, int]]]:
    """The `entries` row of a result (ENTRY_COLUMNS order) and the chunks
    {digest: (text, bytes)} its long texts were cut into, but those whose
    digest is in `known` (both backends)."""
    chunks: dict[str, tuple[str, int]] = {}
    if not canonical:  # not handed over (None, or b"" for a book-sized request)
        # Encoded from the identity itself, not from its serialisation parsed
        # back: a book-sized prompt is hashed chunk by chunk, never copied whole.
        encoded, chunks = encode_identity(normalize(identity), blob_min_chars, known)
        stored = dumps_normalized(encoded)  # sorted keys: the bytes the old path stored
    elif len(canonical) > blob_min_chars or b'"$' in canonical:  # else: no long text, no "$" key
        encoded, chunks = encode_identity(orjson.loads(canonical), blob_min_chars, known)
        stored = orjson.dumps(encoded)
    else:
        stored = canonical
    text, vectors, dtype, count = encode_response(response)
    get = identity.get
    return (key, str(get("op", "chat")), str(get("model", "")), get("kind"), get("base_url"), iso_utc(created),
            text, vectors, dtype, count, stored.decode(), entry_checksum(key, text, vectors)), chunks


class EitherOf:
    """Digests in either of two containers (the writer's stored ones and its
    batch's new ones), without merging them into a third."""

    __slots__ = ("first", "second")

    def __init__(self, first: Container[str], second: Container[str]):
        self.first, self.second = first, second

    def __contains__(self, digest: object) -> bool:
        return digest in self.first or digest in self.second


def decode_entry(key: str, text: str, vectors: bytes | None, dtype: str | None, count: int | None,
                 checksum: str | None) -> Record:
    """A stored response back, its checksum checked (ValueError when it does not match)."""
    if checksum is not None and checksum != entry_checksum(key, text, vectors):
        raise ValueError("checksum mismatch")
    if vectors is None:
        record: Record = orjson.loads(text)
        return record
    return decode_response(text, vectors, dtype, count)


# key, response, vectors, vector_dtype, vector_count, checksum
_EntryRow = tuple[str, str, bytes | None, str | None, int | None, str | None]
_BlobEntryRow = tuple[str, bytes, bytes | None, str | None, int | None, str | None]  # the response as its bytes


def _entry_rows(conn: sqlite3.Connection, keys: Sequence[str], response: str = "response") -> Iterator[_EntryRow]:
    """The entries rows (key, response, vectors, vector_dtype, vector_count,
    checksum) of the keys present, `READ_BATCH` keys a query (`response`: the
    SQL of the response column)."""
    for i in range(0, len(keys), READ_BATCH):
        batch = keys[i:i + READ_BATCH]
        sql = (f"SELECT key, {response}, vectors, vector_dtype, vector_count, checksum FROM entries "
               f"WHERE key IN ({','.join('?' * len(batch))})")
        yield from conn.execute(sql, batch)


def read_results(conn: sqlite3.Connection, keys: Sequence[str], corrupt: list[str]) -> dict[str, Result]:
    """{key: result} for the keys present, decoded in one pass over the rows
    (what `decode_entry` then `result_from_record` give: a damaged row or a
    record without its fields is a miss, its key in `corrupt`).

    Read for every cache hit, so the response comes as its stored UTF-8 bytes,
    checksummed and parsed as they are: `entry_checksum` of the text decoded
    would hash the same bytes after a decode and an encode (10-15% of a
    lookup's time). A response that is not UTF-8 is then a checksum mismatch
    (a miss), where decoding it would have failed the whole lookup."""
    found: dict[str, Result] = {}
    checksum_of, loads = stored_checksum, orjson.loads
    rows = cast(Iterator[_BlobEntryRow], _entry_rows(conn, keys, "CAST(response AS BLOB)"))
    for key, raw, vectors, dtype, count, checksum in rows:
        try:
            if checksum is not None and checksum != checksum_of(key, raw, vectors):
                raise ValueError("checksum mismatch")
            record = loads(raw) if vectors is None else decode_response(raw, vectors, dtype, count)
            found[key] = result_from_record(record)
        except Exception:  # noqa: BLE001 -- a damaged row is a miss, never a wrong answer
            corrupt.append(key)
    return found


# -- the async cache ------------------------------------------------------------
class _Flush:
    __slots__ = ("loop", "future", "event")

    def __init__(self, loop: asyncio.AbstractEventLoop | None, future: asyncio.Future[None] | None):
        self.loop, self.future, self.event = loop, future, threading.Event()

    def done(self) -> None:
        self.event.set()
        if self.loop is not None and self.future is not None:
            try:
                self.loop.call_soon_threadsafe(_settle_future, self.future, None, False)
            except RuntimeError:  # the loop is closed
                pass


_ReaderItem = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Any, tuple[Any, ...]]  # loop, future, fn, args


class _ReaderThread:
    """One thread running the cache's reads, one at a time, in order.
    A lighter hand-off than ThreadPoolExecutor.run_in_executor (no work item,
    no idle semaphore): a SimpleQueue in, `call_soon_threadsafe` out. The
    engine makes one lookup per batch of requests it pulls."""

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue[_ReaderItem | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[[*Ts], T], *args: *Ts) -> asyncio.Future[T]:
        """`fn(*args)` on the thread; a future of its result in the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((loop, future, fn, args))
        return future

    def stop(self, wait: bool = True) -> None:
        self._queue.put(None)
        if wait:
            self._thread.join()

    def _main(self) -> None:
        get = self._queue.get
        while (item := get()) is not None:
            loop, future, fn, args = item
            try:
                outcome, failed = fn(*args), False
            except BaseException as exc:  # handed to the awaiting caller
                outcome, failed = exc, True
            try:
                loop.call_soon_threadsafe(_settle_future, future, outcome, failed)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass


def _settle_future(future: asyncio.Future[Any], outcome: Any, failed: bool) -> None:
    if future.done():  # the caller was cancelled
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


_STOP = object()
_OPEN_CACHES: weakref.WeakSet[ResponseCache] = weakref.WeakSet()


@atexit.register
def _commit_at_exit() -> None:
    """A cache left open at interpreter exit still commits what it was given."""
    for cache in list(_OPEN_CACHES):
        cache._stop_writer(timeout=30)


class ResponseCache:
    """Async cache of successful replies in one SQLite file.

        async with ResponseCache("runs/cache.sqlite") as cache:
            found = await cache.get_many(keys)      # {key: ChatResult | EmbedResult} for the hits
            cache.put(key, identity, result)        # queued; committed in batches
            await cache.flush()                     # everything put so far is on disk

    `key` must be `cache.keys.request_key(identity)`; `result` a ChatResult or
    EmbedResult, turned into the stored record (cache/codec.py) at once. `put`
    takes ownership of `identity`: do not change it afterwards. A key put and
    not yet committed is already returned by `get`/`get_many` (from memory).
    """

    def __init__(self, path: str | os.PathLike[str], *, blob_min_chars: int = 4096,
                 batch_rows: int = 512, batch_seconds: float = 0.02,
                 inline_read_seconds: float = INLINE_READ_SECONDS):
        self.path = Path(path)
        # 0: every lookup goes to the reader thread (see get_many).
        self.inline_read_seconds = inline_read_seconds
        self.blob_min_chars = blob_min_chars
        self.batch_rows = batch_rows
        self.batch_seconds = batch_seconds
        self.write_errors = 0  # rows that could not be written (logged)
        self.corrupt_keys: set[str] = set()  # entries read back damaged: replaced when put again
        # Rows, flush markers and _STOP, in order. The event loop appends; the
        # writer wakes on `_wake` (set by the first item after it went idle),
        # gathers for up to batch_seconds unless `_urgent` (a full batch, a
        # flush, a stop), then takes everything queued at once.
        self._items: deque[_Row | _Flush | object] = deque()  # row tuples, _Flush markers, _STOP
        self._wake = threading.Event()
        self._urgent = threading.Event()
        self._pending: dict[str, Record] = {}  # put, not yet committed
        # Request text queued for the writer (back-pressure for the engine: a
        # slow disk must not let book-sized prompts pile up in memory). Two
        # counters, each written by one thread only, so no lock is needed.
        self._queued_chars = 0   # event loop
        self._written_chars = 0  # writer thread
        self._known_blobs: set[str] = set()  # digests committed by this writer (writer thread only)
        self._writer: threading.Thread | None = None
        self._write_conn: sqlite3.Connection | None = None
        self._read_conn: sqlite3.Connection | None = None
        self._reader: _ReaderThread | None = None
        self._thread_reads = 0  # lookups on the reader thread now (none inline meanwhile: one connection)
        self._slow_inline_reads = 0  # inline reads in a row that took over inline_read_seconds
        self._last_read_hit = True  # the last lookup read found at least half its keys
        self._get_waiters: dict[str, list[asyncio.Future[Result | None]]] = {}
        self._get_tasks: set[asyncio.Task[None]] = set()
        self._open = False
        self._closed = False
        # Claims (cache/backend.py): on a connection and thread of their own.
        self.owner = owner_name()
        self.lease = lease_seconds()
        self._claimed: set[str] = set()  # keys this process holds in the claims table (the writer reads it)
        # cache/sessions.py: None until the first claim; True while no other
        # process claims in this file (claims are then taken in memory, in
        # `_held_solo`, until a newcomer makes this process write them down).
        self._solo: bool | None = None
        self._held_solo: set[str] = set()  # keys claimed while solo, not stored or released yet (the writer reads it)
        self._switching: set[str] = set()  # held keys being written down by go_shared, not released since
        self._joining: asyncio.Future[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._claims_failed = False      # claiming failed once (said once; later calls go uncoordinated too)
        self._claims_thread: _ReaderThread | None = None
        self._claims_conn: sqlite3.Connection | None = None
        self._claims_by_json = True  # claims inserted from a JSON array of keys (see _claims)
        self._renewer = LeaseRenewer(self._renew, self.lease, lambda: self._solo is not None or bool(self._claimed))

    @property
    def location(self) -> str:
        return str(self.path)

    # -- lifecycle ----------------------------------------------------------------
    async def open(self) -> ResponseCache:
        """Create the file (and parent directories) and schema if needed, and
        connect. Raises CacheError for a file that is not a cache.

        Both connections open here, on the caller's thread: a millisecond of
        SQLite, where handing each to a thread and back cost a cached rerun
        more than all its reads on a busy host (benchmarks/engine_bench.py
        part 3 prints the opening). The writer thread starts with the first
        row to write, the reader thread with the first lookup sent to it: a
        rerun whose lookups all read inline starts neither."""
        if self._open:
            return self
        try:
            self._write_conn = self._open_writer()
            self._read_conn = self._open_reader()
        except BaseException:
            if self._write_conn is not None:
                self._write_conn.close()
                self._write_conn = None
            raise
        self._open = True
        _OPEN_CACHES.add(self)
        return self

    def _start_writer(self) -> None:
        self._writer = threading.Thread(target=self._writer_main, name="tulving-cache-write", daemon=True)
        self._writer.start()

    def _reader_thread(self) -> _ReaderThread:
        if self._reader is None:
            self._reader = _ReaderThread("tulving-cache-read")
        return self._reader

    def _open_writer(self) -> sqlite3.Connection:
        conn = connect(self.path, create=True)
        # Keys are random: every insert touches a random page of the key
        # index, which the default 2 MB page cache stops holding past ~40k
        # entries; then each insert reads its page back from the file.
        conn.execute("PRAGMA cache_size = -65536")
        # Checkpoint every 32 MB of WAL instead of 4 MB: a page rewritten by
        # many commits (the key index again) is copied into the file once.
        conn.execute("PRAGMA wal_autocheckpoint = 8192")
        conn.execute(CLAIMS_SCHEMA)
        conn.execute(sessions.SESSIONS_SCHEMA)
        return conn

    def _open_reader(self) -> sqlite3.Connection:
        conn = connect(self.path, create=False)
        conn.execute("PRAGMA query_only = 1")
        conn.execute("PRAGMA cache_size = -65536")  # 64 MiB of pages for lookups
        # Lookups read the file's pages through a memory map rather than a
        # pread() call a page (a fifth of a cached rerun's SELECT time); the
        # connection only reads (query_only), and pages past the map are read as before.
        conn.execute(f"PRAGMA mmap_size = {READ_MMAP_BYTES}")
        return conn

    async def __aenter__(self) -> ResponseCache:
        return await self.open()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def flush(self) -> None:
        """Wait until everything put so far is committed."""
        if not self._open or self._closed and self._writer is None:
            return
        if self._writer is None and not self._items:
            return  # nothing was ever put: nothing to commit
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._send(_Flush(loop, future))
        await future

    async def close(self) -> None:
        """Flush, stop the writer, close both connections. Idempotent."""
        if not self._open or self._closed:
            return
        await self.flush()
        await self._end_claims()
        self._closed = True
        if self._writer is not None:
            await asyncio.to_thread(self._stop_writer)
        elif self._write_conn is not None:  # never written: the writer never started
            self._write_conn.close()
        self._write_conn = None
        _OPEN_CACHES.discard(self)
        if self._reader is not None:
            if self._read_conn is not None:
                await self._reader.run(self._read_conn.close)
            self._reader.stop()  # idle by now: it exits at once
        elif self._read_conn is not None:
            self._read_conn.close()

    def _stop_writer(self, timeout: float | None = None) -> None:
        writer = self._writer
        if writer is None:
            return
        self._closed = True
        self._send(_STOP)
        writer.join(timeout)
        self._writer = None

    # -- reads ----------------------------------------------------------------------
    async def get_many(self, keys: Sequence[str]) -> dict[str, Result]:
        """{key: result} for the keys that are cached (misses are absent); a
        new result object for every key and call."""
        self._check_open()
        found: dict[str, Result] = {}
        if self._pending:
            missing = []
            for key in keys:
                record = self._pending.get(key)
                if record is None:
                    missing.append(key)
                else:
                    found[key] = result_from_record(record)
        else:
            missing = list(keys)
        if missing:
            corrupt: list[str] = []
            try:
                if (len(missing) <= INLINE_READ_KEYS and self.inline_read_seconds > 0 and not self._thread_reads
                        and self._last_read_hit):
                    read = self._read_inline(missing, corrupt)
                else:
                    assert self._read_conn is not None  # open
                    self._thread_reads += 1
                    try:
                        read = await self._reader_thread().run(read_results, self._read_conn, missing, corrupt)
                    finally:
                        self._thread_reads -= 1
                # A lookup that mostly missed is followed by calls: the next one
                # reads on the thread, beside the loop's calls (see _read_inline).
                self._last_read_hit = 2 * len(read) >= len(missing)
                found.update(read)
            except sqlite3.DatabaseError as exc:
                raise damaged(self.path, exc) from None
            if corrupt:
                self.corrupt_keys.update(corrupt)
                log.warning("cache: %d damaged entries in %s are treated as misses and will be rewritten "
                            "(`tulving cache check` lists them)", len(corrupt), self.path)
        return found

    def _read_inline(self, keys: list[str], corrupt: list[str]) -> dict[str, Result]:
        """`read_results` on the event loop's thread, blocking it for the read.
        A lookup of a batch's keys in a file the OS has cached takes well under
        a millisecond, and handing it to the reader thread and back cost more
        than the read (a cached rerun of 10,000 requests: 30,209 -> 35,850
        requests/s side by side, benchmarks/results/rerun_inline_reads.txt).
        Slow storage (a cold disk, a network file system) must not stall the
        loop's calls: after INLINE_SLOW_READS reads in a row that each took
        over `inline_read_seconds`, every later lookup goes to the thread.
        In a row, because slow storage is slow on every read, while a garbage
        collection that lands in a read or one moment of a busy host is not
        (switching on the first slow read sent most reruns to the thread after
        a few lookups: benchmarks/results/rerun_inline_switch.txt). Wall
        time only: on a busy host `time.thread_time` cost 0.6-0.8 ms a call
        inside a rerun on this machine's VM (2-3 us when quiet), more than
        the read.
        One thread uses the read connection at a time: a lookup goes inline
        only when no lookup is running on the reader thread."""
        assert self._read_conn is not None  # open
        start = time.perf_counter()
        try:
            return read_results(self._read_conn, keys, corrupt)
        finally:
            if time.perf_counter() - start <= self.inline_read_seconds:
                self._slow_inline_reads = 0
            else:
                self._slow_inline_reads += 1
                if self._slow_inline_reads >= INLINE_SLOW_READS:
                    self.inline_read_seconds = 0.0

    async def get(self, key: str) -> Result | None:
        """The result for `key` or None. Concurrent calls are looked up together."""
        self._check_open()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Result | None] = loop.create_future()
        first = not self._get_waiters
        self._get_waiters.setdefault(key, []).append(future)
        if first:
            loop.call_soon(self._dispatch_gets)
        return await future

    def _dispatch_gets(self) -> None:
        waiters, self._get_waiters = self._get_waiters, {}
        task = asyncio.ensure_future(self._answer_gets(waiters))
        self._get_tasks.add(task)
        task.add_done_callback(self._get_tasks.discard)

    async def _answer_gets(self, waiters: dict[str, list[asyncio.Future[Result | None]]]) -> None:
        try:
            found = await self.get_many(list(waiters))
        except BaseException as exc:
            for futures in waiters.values():
                for future in futures:
                    if not future.done():
                        future.set_exception(exc)
            return
        for key, futures in waiters.items():
            result = found.get(key)
            for i, future in enumerate(futures):
                if not future.done():
                    future.set_result(result if i == 0 or result is None else dataclasses.replace(result))

    # -- writes ---------------------------------------------------------------------
    def put(self, key: str, identity: Identity, result: Result, *, canonical: bytes | None = None) -> None:
        """Queue a successful result for the writer; returns at once.
        `canonical` may pass `cache.keys.canonical_bytes(identity)` when the
        caller already has it (the engine does: it hashed them for the key),
        so the writer does not serialise the identity again."""
        self._check_open()
        response = result_to_record(result)
        self._pending[key] = response
        size = _identity_chars(identity)
        self._queued_chars += size
        items = self._items
        items.append((key, identity, canonical, response, time.time(), size))
        if self._writer is None:
            self._start_writer()
        # Wake the writer once per batch, not once per row: a thread switch
        # per put costs more than the row itself.
        if not self._wake.is_set():
            self._wake.set()
        if len(items) >= self.batch_rows and not self._urgent.is_set():
            self._urgent.set()

    @property
    def backlog_chars(self) -> int:
        """Characters of request text put but not yet written."""
        return self._queued_chars - self._written_chars

    async def wait_for_room(self, max_chars: int) -> None:
        """Wait until the writer's backlog holds at most `max_chars` of request
        text (returns at once when it already does)."""
        while self.backlog_chars > max_chars and self._writer is not None and self._writer.is_alive():
            self._urgent.set()
            self._wake.set()
            await asyncio.sleep(0.005)

    def _send(self, item: _Flush | object) -> None:
        """A flush marker or _STOP: handled as soon as the writer sees it."""
        if self._writer is None and item is not _STOP:
            self._start_writer()
        self._items.append(item)
        self._urgent.set()
        self._wake.set()

    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError("ResponseCache is not open: use `async with` or `await cache.open()`")
        if self._closed:
            raise RuntimeError("ResponseCache is closed")

    def _writer_main(self) -> None:
        conn = self._write_conn
        assert conn is not None
        items = self._items
        stopping = False
        while not stopping:
            self._wake.wait()
            if not self._urgent.is_set():
                self._urgent.wait(self.batch_seconds)  # gather a batch
            # Clear before taking: anything appended from here on sets them again.
            self._wake.clear()
            self._urgent.clear()
            rows: list[_Row] = []
            while items:
                item = items.popleft()
                if item is _STOP:
                    stopping = True
                    break
                if isinstance(item, _Flush):
                    self._commit_rows(conn, rows)
                    rows = []
                    item.done()
                    continue
                rows.append(cast(_Row, item))  # neither _STOP nor a flush marker: a row
                if len(rows) >= self.batch_rows:
                    self._commit_rows(conn, rows)
                    rows = []
            self._commit_rows(conn, rows)
        conn.close()
        # Flush markers that raced with the stop still get their answer.
        while items:
            item = items.popleft()
            if isinstance(item, _Flush):
                item.done()

    def _commit_rows(self, conn: sqlite3.Connection, rows: list[_Row]) -> None:
        if not rows:
            return
        try:
            self._commit(conn, rows)
        except Exception:  # never let the writer die: flushes would wait forever
            self.write_errors += len(rows)
            log.exception("cache: could not write %d responses to %s", len(rows), self.path)
        finally:
            self._written_chars += sum(row[5] for row in rows)

    def _commit(self, conn: sqlite3.Connection, rows: list[_Row]) -> None:
        entries, blobs = self._encode_rows(rows)
        if not self._insert(conn, entries, blobs):
            blobs = {}
        if len(self._known_blobs) > 1_000_000:
            self._known_blobs.clear()
        self._known_blobs.update(blobs)
        pending = self._pending
        for key, _identity, _canonical, response, _created, _size in rows:
            if pending.get(key) is response:
                pending.pop(key, None)

    def _encode_rows(self, rows: list[_Row]) -> tuple[list[_Entry], dict[str, tuple[str, int]]]:
        """The `entries` rows to insert and the chunks not yet stored by this
        writer; a row that cannot be encoded is counted and logged."""
        entries: list[_Entry] = []
        blobs: dict[str, tuple[str, int]] = {}
        known = EitherOf(self._known_blobs, blobs)  # stored, or already in this batch
        for key, identity, canonical, response, created, _size in rows:
            try:
                entry, chunks = self._encode_row(key, identity, canonical, response, created, known)
            except Exception as exc:  # a value JSON cannot hold, a non-dict identity, ...
                self.write_errors += 1
                log.error("cache: cannot store the response for key %s: %s", key, exc)
                continue
            entries.append(entry)
            blobs.update(chunks)
        return entries, blobs

    def _encode_row(self, key: str, identity: Identity, canonical: bytes | None, response: Record,
                    created: float, known: Container[str]) -> tuple[_Entry, dict[str, tuple[str, int]]]:
        return encode_row(key, identity, canonical, response, created, self.blob_min_chars, known)

    def _insert(self, conn: sqlite3.Connection, entries: list[_Entry], blobs: dict[str, tuple[str, int]]) -> bool:
        """One transaction, tried again twice while another process holds the
        lock; False (counted, logged) when it could not be written."""
        for attempt in range(3):
            try:
                conn.execute("BEGIN IMMEDIATE")
                replaced = [(e[0],) for e in entries if e[0] in self.corrupt_keys]
                if replaced:  # damaged rows read as misses: the new reply replaces them
                    conn.executemany("DELETE FROM entries WHERE key = ?", replaced)
                conn.executemany(INSERT_BLOB, [(d, size, text) for d, (text, size) in blobs.items()])
                _insert_entries(conn, entries)
                claimed = self._claimed
                ended = [(e[0], self.owner) for e in entries if e[0] in claimed]
                if ended:  # stored: the claims end in the same transaction
                    conn.executemany("DELETE FROM claims WHERE key = ? AND owner = ?", ended)
                    claimed.difference_update(key for key, _ in ended)
                conn.execute("COMMIT")
                if self._held_solo:  # held in memory (solo): stored, so no longer held
                    self._held_solo.difference_update(e[0] for e in entries)
                return True
            except sqlite3.Error as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc) and attempt < 2:
                    continue
                self.write_errors += len(entries)
                log.error("cache: could not write %d responses to %s: %s", len(entries), self.path, exc)
                return False
        return False

    # -- claims ---------------------------------------------------------------------
    async def claim(self, keys: Sequence[str]) -> set[str]:
        """The keys of `keys` this process now holds (see cache/backend.py)."""
        self._check_open()
        if not keys:
            return set()
        if self._solo is None and not self._claims_failed:
            await self._join()
        if self._solo:  # no other process claims in this file: nothing to ask it (cache/sessions.py)
            self._held_solo.update(keys)
            return set(keys)
        thread = self._claims_worker()
        try:
            mine = await thread.run(self._claim_rows, list(keys))
        except sqlite3.OperationalError as exc:
            # The file cannot take a write now (disk full, I/O error, a lock held
            # too long): the calls go ahead uncoordinated rather than not at all;
            # their replies meet the same storage failure, reported as such (exit 5).
            if not self._claims_failed:
                log.warning("cache: could not claim calls in %s (%s): they are made without checking other "
                            "processes", self.path, exc)
                self._claims_failed = True
            return set(keys)
        except sqlite3.DatabaseError as exc:
            raise damaged(self.path, exc) from None
        self._claimed.update(mine)
        if mine:
            self._renewer.start()
        return mine

    async def _join(self) -> None:
        """Join the file's sessions once (concurrent first claims share the
        join): solo, or shared once every solo process has written down what it holds."""
        if self._joining is None:
            self._joining = asyncio.ensure_future(self._join_once())
        await asyncio.shield(self._joining)

    async def _join_once(self) -> None:
        thread = self._claims_worker()
        try:
            alone = await thread.run(self._join_rows)
            delay = sessions.WATCH_SECONDS / 4
            while not alone:
                waiting: int = await thread.run(self._unacked_rows)
                if not waiting:
                    break
                await asyncio.sleep(delay)  # a solo process writes down its keys within WATCH_SECONDS
                delay = min(delay * 1.5, sessions.WATCH_SECONDS)
        except sqlite3.OperationalError as exc:
            if not self._claims_failed:
                log.warning("cache: could not claim calls in %s (%s): they are made without checking other "
                            "processes", self.path, exc)
                self._claims_failed = True
            self._solo = False
            return
        except sqlite3.DatabaseError as exc:
            raise damaged(self.path, exc) from None
        self._solo = alone
        self._renewer.start()
        if alone:
            self._watcher = asyncio.get_running_loop().create_task(self._watch(), name="tulving-cache-sessions")

    async def _watch(self) -> None:
        """While solo: look for a newcomer every WATCH_SECONDS; on the first,
        write down every key held and claim in the table from then on."""
        thread = self._claims_thread
        assert thread is not None
        warned = False
        while True:
            await asyncio.sleep(sessions.WATCH_SECONDS)
            if self._solo:
                try:
                    if not await thread.run(self._others_present):
                        continue
                except sqlite3.Error as exc:
                    log.warning("cache: could not look for other processes in %s (%s)", self.path, exc)
                    continue
                # From here on `claim` asks the file: it queues behind go_shared on
                # the claims thread, and no key is added to _held_solo any more.
                self._solo = False
            held = list(self._held_solo)
            self._switching = set(held)
            try:
                await thread.run(self._go_shared_rows, held)
            except sqlite3.Error as exc:  # tried again at the next beat; the newcomer waits meanwhile
                self._switching = set()
                if not warned:
                    log.warning("cache: could not write this process's claims in %s (%s); another process "
                                "waits until they are", self.path, exc)
                    warned = True
                continue
            # Keys stored meanwhile lost their hold: their new rows go too (those
            # released meanwhile went at their release, see `release`).
            still = {k for k in held if k in self._held_solo}
            self._claimed.update(still)
            self._held_solo.difference_update(held)
            gone = [k for k in self._switching if k not in still]
            self._switching = set()
            if gone:
                thread.run(self._delete_claims, gone).add_done_callback(_log_failure)
            return

    def _claims_worker(self) -> _ReaderThread:
        """The thread that runs claims and sessions, started at first use."""
        if self._claims_thread is None:
            self._claims_thread = _ReaderThread("tulving-cache-claims")
        return self._claims_thread

    # cache/sessions.py on the claims connection (the claims thread only)
    def _join_rows(self) -> bool:
        return sessions.join(self._claims(), self.owner, self.lease)

    def _unacked_rows(self) -> int:
        return sessions.unacked(self._claims(), self.owner)

    def _others_present(self) -> bool:
        return sessions.others_present(self._claims(), self.owner)

    def _go_shared_rows(self, held: list[str]) -> None:
        sessions.go_shared(self._claims(), self.owner, self.lease, held, by_json=self._claims_by_json)

    def _leave_rows(self) -> None:
        sessions.leave(self._claims(), self.owner)

    def _claims(self) -> sqlite3.Connection:
        if self._claims_conn is None:
            self._claims_conn = connect(self.path, create=False)
            try:
                self._claims_conn.execute("SELECT value FROM json_each('[]')")
            except sqlite3.OperationalError:  # "no such table": JSON functions left out of this SQLite
                self._claims_by_json = False
        return self._claims_conn

    def _claim_rows(self, keys: list[str]) -> set[str]:
        conn = self._claims()
        now = time.time()
        mine: set[str] = set()
        conn.execute("BEGIN IMMEDIATE")
        try:
            for i in range(0, len(keys), READ_BATCH):
                part = keys[i:i + READ_BATCH]
                marks = ",".join("?" * len(part))
                conn.execute(f"DELETE FROM claims WHERE lease_until < ? AND key IN ({marks})", [now, *part])
                # One statement for the chunk's keys, passed as a JSON array (an
                # executemany of a row a key cost 5.7-7.9 us a key, this 4.2-4.8:
                # benchmarks/results/cache_claims_sqlite.py); a key whose stored row is damaged
                # (read as a miss) is claimed whatever `entries` holds, to be paid again.
                damaged_keys = [k for k in part if k in self.corrupt_keys] if self.corrupt_keys else []
                if self._claims_by_json:
                    conn.execute("INSERT OR IGNORE INTO claims (key, owner, lease_until) SELECT value, ?, ? "
                                 "FROM json_each(?) WHERE NOT EXISTS (SELECT 1 FROM entries WHERE key = value)",
                                 (self.owner, now + self.lease, orjson.dumps(part)))
                else:  # an SQLite built without JSON functions
                    conn.executemany("INSERT OR IGNORE INTO claims (key, owner, lease_until) SELECT ?, ?, ? "
                                     "WHERE NOT EXISTS (SELECT 1 FROM entries WHERE key = ?)",
                                     [(k, self.owner, now + self.lease, k) for k in part])
                if damaged_keys:
                    conn.executemany("INSERT OR IGNORE INTO claims (key, owner, lease_until) VALUES (?, ?, ?)",
                                     [(k, self.owner, now + self.lease) for k in damaged_keys])
                mine.update(k for (k,) in conn.execute(
                    f"SELECT key FROM claims WHERE owner = ? AND key IN ({marks})", [self.owner, *part]))
            if len(mine) < len(keys) and self._dead_owners_released(conn, keys, mine):
                return self._claim_rows_again(conn, keys)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:  # SQLite may have rolled back already (a failed write)
                conn.execute("ROLLBACK")
            raise
        return mine

    def _dead_owners_released(self, conn: sqlite3.Connection, keys: list[str], mine: set[str]) -> bool:
        """Some keys are claimed by another process (or stored): when a claimer is
        a process gone from this machine, its claims are released at once
        (cache/sessions.py `release_dead`: a look at the few session rows and a
        signal-0 per other process, a few microseconds)."""
        if self._solo:
            return False
        return sessions.release_dead(conn, self.owner) > 0

    def _claim_rows_again(self, conn: sqlite3.Connection, keys: list[str]) -> set[str]:
        """Commit the release of a dead process's claims, then claim again."""
        conn.execute("COMMIT")
        return self._claim_rows(keys)

    def release(self, keys: Sequence[str]) -> None:
        if self._held_solo:
            self._held_solo.difference_update(keys)
        if self._switching and self._claims_thread is not None:
            # Being written down by go_shared right now: their rows are deleted
            # behind it on the claims thread, and before a claim of them made
            # after this release (which must find them free, not this process's).
            switching = [k for k in keys if k in self._switching]
            if switching:
                self._switching.difference_update(switching)
                self._claims_thread.run(self._delete_claims, switching).add_done_callback(_log_failure)
        held = [k for k in keys if k in self._claimed]
        if not held or self._claims_thread is None:
            return
        self._claimed.difference_update(held)
        future = self._claims_thread.run(self._delete_claims, held)
        future.add_done_callback(_log_failure)

    def _delete_claims(self, keys: list[str] | None) -> None:
        conn = self._claims()
        if keys is None:
            conn.execute("DELETE FROM claims WHERE owner = ?", (self.owner,))
            return
        conn.executemany("DELETE FROM claims WHERE key = ? AND owner = ?", [(k, self.owner) for k in keys])

    async def _renew(self) -> None:
        thread = self._claims_thread
        if thread is not None:
            await thread.run(self._renew_rows)

    def _renew_rows(self) -> None:
        conn = self._claims()
        conn.execute("UPDATE claims SET lease_until = ? WHERE owner = ?", (time.time() + self.lease, self.owner))
        if self._solo is not None:
            sessions.renew(conn, self.owner, self.lease)

    def wait_for(self, keys: Sequence[str]) -> AsyncIterator[tuple[dict[str, Result], set[str]]]:
        return wait_claimed(self, keys)

    async def _end_claims(self) -> None:
        """At close: every claim of this process ends (its stored results are committed)."""
        await self._renewer.stop()
        watcher, self._watcher = self._watcher, None
        await cancel_and_wait(watcher)
        thread, self._claims_thread = self._claims_thread, None
        if thread is None:
            return
        try:
            await thread.run(self._delete_claims, None)
            if self._solo is not None:
                await thread.run(self._leave_rows)
        except sqlite3.Error as exc:
            log.warning("cache: could not end this process's claims in %s (%s); they lapse in %g s",
                        self.path, exc, self.lease)
        finally:
            self._claimed.clear()
            self._held_solo.clear()
            if self._claims_conn is not None:
                await thread.run(self._claims_conn.close)
                self._claims_conn = None
            thread.stop(wait=False)


def _log_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("cache: could not end claims (%s); they lapse at their lease's end", future.exception())
