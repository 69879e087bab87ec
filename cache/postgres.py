"""The response cache on PostgreSQL (`--cache postgresql://user@host/db`):
the SQLite store's keys, rows, checksums and chunked blobs (cache/store.py)
in a database many processes and machines share, with claims so that none
of them pays for a call another is making (cache/backend.py).

Driver: asyncpg, on the event loop (benchmarks/pg_drivers.py measured it
against psycopg 3's async pool: about twice as fast at a batched lookup of
1,000 keys and at a put of 1,000 rows; docs/shared-cache.md has the figures).

Writes are queued by `put` and committed in batches (up to `batch_rows`, or
`batch_seconds` after the first) by a writer task, in one transaction that
also ends the claims of the keys stored. When the database goes away, the
batches that could not be written go to a local spill file (a SQLite cache,
`tulving-spill-HOST-PID.sqlite` in $TULVING_SPILL_DIR or the current folder)
and are written back as soon as it answers again; reads and claims wait for
it up to `outage_seconds` ($TULVING_CACHE_OUTAGE, default 60). A run whose
database does not come back stops with exit 5, naming the spill file and the
command that stores it (`tulving cache copy SPILL URL`).
"""
from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Self, TypeVar

from cache.claims import LeaseRenewer, lease_seconds, owner_name, wait_claimed
from cache.codec import Record, result_from_record, result_to_record
from cache.keys import Identity
from cache.location import redact
from cache.pg_schema import CacheUnavailable, insert_rows, open_pool
from cache.store import (
    INSERT_BLOB,
    CacheError,
    _Entry,
    _identity_chars,
    _insert_entries,
    connect,
    decode_entry,
    encode_row,
    read_results,
)
from providers.base import Result

if TYPE_CHECKING:
    import asyncpg

T = TypeVar("T")
log = logging.getLogger("tulving.cache")
SPILL_PREFIX = "tulving-spill-"  # + HOST-PID.sqlite: a run's spill file


def _spill_abandoned(path: Path) -> bool:
    """Whether the spill file `path` (SPILL_PREFIX + HOST-PID.sqlite) belongs
    to no running process: its process is gone from this machine. A file of
    another machine, or of a live process, is not ours to take."""
    host, _, pid = path.stem.removeprefix(SPILL_PREFIX).rpartition("-")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False

READ_BATCH = 5000  # keys per `key = ANY($1)`
_Row = tuple[str, Identity, bytes | None, Record, float, int]  # as cache/store.py queues them
_Blobs = dict[str, tuple[str, int]]  # digest -> (text, bytes)

def outage_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean "the database is not answering" (not "it refused this").
    InternalClientError: a connection the server dropped in the middle of a
    statement ("cannot switch to state ...; another operation is in progress"):
    its rows were never stored, so they go to the spill file, not away."""
    import asyncpg

    return (OSError, TimeoutError, asyncpg.PostgresConnectionError, asyncpg.exceptions.OperatorInterventionError,
            asyncpg.InterfaceError, asyncpg.exceptions.InternalClientError)


def read_row(row: Sequence[object]) -> Record:
    key, text, vectors, dtype, count, checksum = row
    return decode_entry(str(key), str(text), bytes(vectors) if isinstance(vectors, (bytes, memoryview)) else None,
                        dtype if isinstance(dtype, str) else None, count if isinstance(count, int) else None,
                        checksum if isinstance(checksum, str) else None)


class PostgresCache:
    """The async cache on PostgreSQL; the same interface as cache.store.ResponseCache."""

    def __init__(self, url: str, *, spill_dir: str | os.PathLike[str] | None = None, blob_min_chars: int = 4096,
                 batch_rows: int = 512, batch_seconds: float = 0.02):
        self.url = url
        self.blob_min_chars, self.batch_rows, self.batch_seconds = blob_min_chars, batch_rows, batch_seconds
        self.write_errors = 0
        self.corrupt_keys: set[str] = set()
        self.owner = owner_name()
        self.lease = lease_seconds()
        self.outage_seconds = float(os.environ.get("TULVING_CACHE_OUTAGE") or 60)
        folder = Path(spill_dir or os.environ.get("TULVING_SPILL_DIR") or ".")
        self.spill_path = folder / f"{SPILL_PREFIX}{socket.gethostname()}-{os.getpid()}.sqlite"
        self.spilled = 0  # entries in the spill file not written back yet
        self._claimed: set[str] = set()
        self._renewer = LeaseRenewer(self._renew, self.lease, lambda: bool(self._claimed))
        self._pool: asyncpg.Pool | None = None
        self._rows: list[_Row] = []
        self._pending: dict[str, Record] = {}
        self._queued_chars = self._written_chars = 0
        self._known_blobs: set[str] = set()
        self._wake: asyncio.Event | None = None
        self._write_lock: asyncio.Lock | None = None
        self._writer: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._open = self._closed = False
        self._outage_since: float | None = None  # monotonic time the database stopped answering (None: it answers)

    @property
    def location(self) -> str:
        return redact(self.url)

    # -- lifecycle ----------------------------------------------------------------
    async def open(self) -> Self:
        if self._open:
            return self
        self._pool = await open_pool(self.url)
        self._wake, self._write_lock = asyncio.Event(), asyncio.Lock()
        self._writer = asyncio.get_running_loop().create_task(self._writer_main(), name="tulving-pg-writer")
        self._open = True
        await self._adopt_spills()  # before any call: what an earlier run paid for and could not store
        return self

    async def _adopt_spills(self) -> None:
        """Spill files an earlier run left in the spill folder (its database
        stayed away to the end: exit 5) are written back before any call and
        removed, with one line each, so rerunning the same command pays for
        none of their calls again. A file of a process still running on this
        machine is its own; one of another machine is left for it (or for
        `tulving cache copy`)."""
        from cache.copy import copy_cache

        for path in sorted(self.spill_path.parent.glob(f"{SPILL_PREFIX}*.sqlite")):
            if path == self.spill_path or not _spill_abandoned(path):
                continue
            report = await self._retrying(functools.partial(copy_cache, str(path), self.url, pool=self._db()))
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            log.warning("cache: wrote back %d results an earlier run kept in %s while %s was away (%d already "
                        "there); the file is removed", report.copied, path, self.location, report.present)

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Flush, end this process's claims, write a spill back (or stop
        with exit 5 naming it), close the pool. Idempotent."""
        if not self._open or self._closed:
            return
        try:
            await self.flush()
            await self._renewer.stop()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._quietly(self._end_claims())
            if self.spilled:
                await self._retrying(self._write_back)
        finally:
            self._closed = True
            if self._writer is not None:
                self._writer.cancel()
            pool, self._pool = self._pool, None
            if pool is not None:
                errors: tuple[type[BaseException], ...] = (TimeoutError, *outage_errors())
                try:
                    async with asyncio.timeout(10):  # not wait_for: it may swallow a Ctrl-C on 3.11
                        await pool.close()
                except errors:
                    pool.terminate()

    async def _quietly(self, work: Awaitable[None]) -> None:
        try:
            await work
        except outage_errors() as exc:
            log.warning("cache: %s did not answer (%s); this process's claims lapse in %g s",
                        self.location, exc, self.lease)

    async def _end_claims(self) -> None:
        if self._claimed:
            await self._db().execute("DELETE FROM claims WHERE owner = $1", self.owner)
            self._claimed.clear()

    def _db(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("PostgresCache is not open: use `async with` or `await cache.open()`")
        return self._pool

    def _check_open(self) -> None:
        if not self._open:
            raise RuntimeError("PostgresCache is not open: use `async with` or `await cache.open()`")
        if self._closed:
            raise RuntimeError("PostgresCache is closed")

    async def _retrying(self, work: Callable[[], Awaitable[T]]) -> T:
        """`work()`, tried again while the database does not answer, for up
        to `outage_seconds`; then CacheUnavailable (exit 5). One line when an
        outage starts, not one per try."""
        deadline = time.monotonic() + self.outage_seconds
        delay = 0.2
        while True:
            try:
                answer = await work()
                self._outage_since = None
                return answer
            except outage_errors() as exc:
                if self._outage_since is None:
                    self._outage_since = time.monotonic()
                    log.warning("cache: %s does not answer (%s); trying again for up to %g s", self.location, exc,
                                self.outage_seconds)
                if time.monotonic() + delay > deadline:
                    raise self._unavailable(exc) from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _unavailable(self, exc: BaseException) -> CacheUnavailable:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        kept = (f"; {self.spilled:,} results of this run are kept in {self.spill_path}: rerun the same command "
                f"once it is back (it writes them back first), or store them with "
                f"`tulving cache copy {self.spill_path} {self.location}`") if self.spilled else ""
        waited = time.monotonic() - (self._outage_since or time.monotonic())
        return CacheUnavailable(f"the cache database {self.location} is unreachable ({reason}): gave up after "
                                f"{waited:.0f} s without an answer{kept}")

    # -- reads ---------------------------------------------------------------------
    async def get_many(self, keys: Sequence[str]) -> dict[str, Result]:
        self._check_open()
        found: dict[str, Result] = {}
        missing = []
        for key in keys:
            record = self._pending.get(key)
            if record is None:
                missing.append(key)
            else:
                found[key] = result_from_record(record)
        if missing:
            for key, record in (await self._retrying(lambda: self._read(missing))).items():
                try:
                    found[key] = result_from_record(record)
                except Exception:  # noqa: BLE001 -- a record without its fields is a miss
                    self.corrupt_keys.add(key)
        if self.spilled:  # results kept locally while the database was away, not written back yet
            found.update(self._read_spill([k for k in missing if k not in found]))
        return found

    def _read_spill(self, keys: list[str]) -> dict[str, Result]:
        if not keys or not self.spill_path.exists():
            return {}
        conn = connect(self.spill_path, create=False)
        try:
            return read_results(conn, keys, [])
        finally:
            conn.close()

    async def _read(self, keys: list[str]) -> dict[str, Record]:
        found: dict[str, Record] = {}
        for i in range(0, len(keys), READ_BATCH):
            rows = await self._db().fetch("SELECT key, response, vectors, vector_dtype, vector_count, checksum "
                                          "FROM entries WHERE key = ANY($1::text[])", keys[i:i + READ_BATCH])
            for row in rows:
                try:
                    found[row[0]] = read_row(tuple(row))
                except Exception:  # noqa: BLE001 -- a damaged row is a miss, never a wrong answer
                    self.corrupt_keys.add(row[0])
        return found

    async def get(self, key: str) -> Result | None:
        return (await self.get_many([key])).get(key)

    # -- writes --------------------------------------------------------------------
    def put(self, key: str, identity: Identity, result: Result, *, canonical: bytes | None = None) -> None:
        self._check_open()
        record = result_to_record(result)
        self._pending[key] = record
        size = _identity_chars(identity)
        self._queued_chars += size
        self._rows.append((key, identity, canonical, record, time.time(), size))
        assert self._wake is not None  # open
        self._wake.set()

    @property
    def backlog_chars(self) -> int:
        return self._queued_chars - self._written_chars

    async def wait_for_room(self, max_chars: int) -> None:
        if self.backlog_chars > max_chars:
            await self.flush()

    async def flush(self) -> None:
        """Everything put so far is in the database (or, while it is away, in the spill file)."""
        if not self._open or self._write_lock is None:
            return
        async with self._write_lock:
            while self._rows:
                rows, self._rows = self._rows[:self.batch_rows], self._rows[self.batch_rows:]
                await self._write(rows)

    async def _writer_main(self) -> None:
        assert self._wake is not None  # open
        while True:
            await self._wake.wait()
            self._wake.clear()
            if len(self._rows) < self.batch_rows:
                await asyncio.sleep(self.batch_seconds)  # gather a batch
            try:
                await self.flush()
                if self.spilled:
                    await self._write_back()
            except outage_errors():
                self._wake.set()  # the spill is tried again after a pause
                await asyncio.sleep(1.0)
            except Exception:  # never let the writer die
                log.exception("cache: the writer of %s failed", self.location)

    async def _write(self, rows: list[_Row]) -> None:
        entries: list[_Entry] = []
        every_chunk: _Blobs = {}
        for key, identity, canonical, record, created, _size in rows:
            try:
                entry, chunks = encode_row(key, identity, canonical, record, created, self.blob_min_chars)
            except Exception as exc:  # noqa: BLE001 -- a value JSON cannot hold: counted, logged
                self.write_errors += 1
                log.error("cache: cannot store the response for key %s: %s", key, exc)
                continue
            entries.append(entry)
            every_chunk.update(chunks)
        try:
            await self._insert(entries, {d: c for d, c in every_chunk.items() if d not in self._known_blobs})
        except outage_errors() as exc:
            self._spill(entries, every_chunk, exc)
        except Exception as exc:  # noqa: BLE001 -- the run goes on; the rows are counted as not stored
            self.write_errors += len(entries)
            log.error("cache: could not write %d responses to %s: %s", len(entries), self.location, exc)
        finally:
            self._written_chars += sum(row[5] for row in rows)
            for key, _identity, _canonical, record, _created, _size in rows:
                if self._pending.get(key) is record:
                    del self._pending[key]

    async def _insert(self, entries: list[_Entry], blobs: _Blobs) -> None:
        keys = [e[0] for e in entries]
        async with self._db().acquire() as conn, conn.transaction():
            await insert_rows(conn, entries, blobs, [k for k in keys if k in self.corrupt_keys])
            ended = [k for k in keys if k in self._claimed]
            if ended:  # stored: their claims end in the same transaction
                await conn.execute("DELETE FROM claims WHERE owner = $1 AND key = ANY($2::text[])", self.owner, ended)
        self._claimed.difference_update(keys)
        self.corrupt_keys.difference_update(keys)
        self._known_blobs.update(blobs)

    # -- the spill file --------------------------------------------------------------
    def _spill(self, entries: list[_Entry], chunks: _Blobs, exc: BaseException) -> None:
        """The database is away: keep the rows (with every chunk they use) in the local spill file."""
        if not self.spilled:
            log.warning("cache: %s is unreachable (%s): results are kept in %s until it is back",
                        self.location, exc, self.spill_path)
        if self._outage_since is None:  # the outage began with this write
            self._outage_since = time.monotonic()
        try:
            conn = connect(self.spill_path, create=True)
        except CacheError as error:
            self.write_errors += len(entries)
            log.error("cache: could not keep %d results in %s: %s", len(entries), self.spill_path, error)
            return
        try:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(INSERT_BLOB, [(d, size, text) for d, (text, size) in chunks.items()])
                _insert_entries(conn, entries)
            self.spilled += len(entries)
        except sqlite3.Error as error:
            self.write_errors += len(entries)
            log.error("cache: could not keep %d results in %s: %s", len(entries), self.spill_path, error)
        finally:
            conn.close()

    async def _write_back(self) -> None:
        """The database answers again: the spill file's rows go back to it, then the file is removed."""
        from cache.copy import copy_cache

        assert self._write_lock is not None  # open
        async with self._write_lock:  # no batch spills while the file is copied and removed
            if not self.spilled:
                return
            report = await copy_cache(str(self.spill_path), self.url, pool=self._db())
            log.warning("cache: %s is back: %d results written back from %s", self.location, report.copied,
                        self.spill_path)
            self.spilled = 0
            self._outage_since = None
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.spill_path}{suffix}").unlink(missing_ok=True)

    # -- claims --------------------------------------------------------------------
    async def claim(self, keys: Sequence[str]) -> set[str]:
        self._check_open()
        if not keys:
            return set()
        wanted = list(dict.fromkeys(keys))
        mine = await self._retrying(lambda: self._claim_rows(wanted))
        self._claimed.update(mine)
        if mine:
            self._renewer.start()
        return mine

    async def _claim_rows(self, keys: list[str]) -> set[str]:
        async with self._db().acquire() as conn, conn.transaction():
            await conn.execute("DELETE FROM claims WHERE key = ANY($1::text[]) AND lease_until < now()", keys)
            rows = await conn.fetch(
                "INSERT INTO claims (key, owner, lease_until) SELECT k, $2, now() + make_interval(secs => $3) "
                "FROM unnest($1::text[]) AS k WHERE k = ANY($4::text[]) "  # damaged rows: paid again
                "OR NOT EXISTS (SELECT 1 FROM entries AS e WHERE e.key = k) "
                "ON CONFLICT (key) DO UPDATE SET lease_until = EXCLUDED.lease_until "
                "WHERE claims.owner = EXCLUDED.owner RETURNING key", keys, self.owner, self.lease,
                [k for k in keys if k in self.corrupt_keys])
            mine = {row[0] for row in rows}
            # READ COMMITTED: the insert's snapshot may predate a result (and the end of its
            # claim) committed while it ran; a statement of its own sees it, and the key is not ours.
            stored = await conn.fetch("SELECT key FROM entries WHERE key = ANY($1::text[])",
                                      [k for k in mine if k not in self.corrupt_keys])
            if stored:
                late = [row[0] for row in stored]
                await conn.execute("DELETE FROM claims WHERE owner = $1 AND key = ANY($2::text[])", self.owner, late)
                mine.difference_update(late)
        return mine

    def release(self, keys: Sequence[str]) -> None:
        held = [k for k in keys if k in self._claimed]
        if not held or self._pool is None or self._closed:
            return
        self._claimed.difference_update(held)
        task = asyncio.get_running_loop().create_task(self._quietly(self._delete_claims(held)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_claims(self, keys: list[str]) -> None:
        await self._db().execute("DELETE FROM claims WHERE owner = $1 AND key = ANY($2::text[])", self.owner, keys)

    async def _renew(self) -> None:
        await self._db().execute("UPDATE claims SET lease_until = now() + make_interval(secs => $2) "
                                 "WHERE owner = $1", self.owner, self.lease)

    def wait_for(self, keys: Sequence[str]) -> AsyncIterator[tuple[dict[str, Result], set[str]]]:
        return wait_claimed(self, keys)
