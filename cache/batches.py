"""The batch ledger: which provider batches were submitted, and which cache
keys each still owes, in the cache's own SQLite file.

A batch is recorded (its id and every key it covers) the moment the provider
has created it, before anything waits on it; a key leaves the ledger once its
result is in the cache (or its failure was handed back for a retry). So a
killed run, rerun, finds the batches still owing its keys and polls them
again instead of submitting (and paying for) them twice.

Tables (added to any cache file, old or new, when first used; they change
nothing of `entries`, so the cache format version stays 1 and older Tulvings
ignore them):

    batches (
      id           TEXT PRIMARY KEY,   -- the provider's id: batch_... / msgbatch_...
      endpoint     TEXT NOT NULL,      -- the config's endpoint name
      kind         TEXT NOT NULL,      -- openai | anthropic
      base_url     TEXT,
      model        TEXT,               -- OpenAI: the one model of the file; Anthropic: may mix (first)
      state        TEXT NOT NULL,      -- the provider's status word, as last seen
      counts       TEXT,               -- JSON request counts, as last seen
      requests     INTEGER NOT NULL,   -- lines submitted
      submitted_at TEXT NOT NULL,      -- UTC ISO 8601
      updated_at   TEXT NOT NULL
    )
    batch_keys (batch_id TEXT, key TEXT, PRIMARY KEY (batch_id, key))  -- keys still owed

    SELECT id, state, requests, (SELECT count(*) FROM batch_keys WHERE batch_id = id) AS owed FROM batches;
"""
from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from cache.side_table import SideTableFile
from cache.store import connect, damaged, iso_utc

SCHEMA = """
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY,
    endpoint TEXT NOT NULL,
    kind TEXT NOT NULL,
    base_url TEXT,
    model TEXT,
    state TEXT NOT NULL,
    counts TEXT,
    requests INTEGER NOT NULL,
    submitted_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batch_keys (
    batch_id TEXT NOT NULL,
    key TEXT NOT NULL,
    PRIMARY KEY (batch_id, key)
);
CREATE INDEX IF NOT EXISTS batch_keys_by_key ON batch_keys (key);
"""
_CHUNK = 500  # keys per `IN (...)`


@dataclass(frozen=True, slots=True)
class LedgerBatch:
    id: str
    endpoint: str
    kind: str
    base_url: str | None
    model: str | None
    state: str
    counts: dict[str, int]
    requests: int
    owed: int            # keys whose result is not in the cache yet (listed and not in `entries`)
    submitted_at: str
    updated_at: str


class BatchLedger(SideTableFile):
    """The ledger of one cache file. Every method commits before it returns
    (a write is durable once awaited); the work runs, in order, on one thread
    of its own (a caller cancelled mid-write does not leave the connection to
    another thread)."""

    def __init__(self, path: str | os.PathLike[str]):
        super().__init__(path, "tulving-batch-ledger")

    def _open(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = connect(self.path, create=True)
            try:
                conn.executescript(SCHEMA)
            except sqlite3.Error as exc:
                conn.close()
                raise damaged(self.path, exc) from None
            self._conn = conn
        return self._conn

    # -- writes ------------------------------------------------------------------------
    async def record(self, batch_id: str, *, endpoint: str, kind: str, base_url: str | None, model: str | None,
                     state: str, keys: Sequence[str]) -> None:
        """A batch the provider created, with every key it covers."""
        await self._run(self._record, batch_id, endpoint, kind, base_url, model, state, list(keys))

    def _record(self, batch_id: str, endpoint: str, kind: str, base_url: str | None, model: str | None,
                state: str, keys: list[str]) -> None:
        conn = self._open()
        now = iso_utc(time.time())
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT OR REPLACE INTO batches (id, endpoint, kind, base_url, model, state, counts, "
                         "requests, submitted_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)",
                         (batch_id, endpoint, kind, base_url, model, state, len(keys), now, now))
            conn.executemany("INSERT OR IGNORE INTO batch_keys (batch_id, key) VALUES (?, ?)",
                             [(batch_id, k) for k in keys])

    async def rename(self, old_id: str, batch_id: str, state: str) -> None:
        """A batch recorded under a provisional id (before the provider gave
        its own) gets its real id, keys and all."""
        await self._run(self._rename, old_id, batch_id, state)

    def _rename(self, old_id: str, batch_id: str, state: str) -> None:
        conn = self._open()
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE batches SET id = ?, state = ?, updated_at = ? WHERE id = ?",
                         (batch_id, state, iso_utc(time.time()), old_id))
            conn.execute("UPDATE batch_keys SET batch_id = ? WHERE batch_id = ?", (batch_id, old_id))

    async def update(self, batch_id: str, state: str, counts: dict[str, int]) -> None:
        await self._run(self._update, batch_id, state, counts)

    def _update(self, batch_id: str, state: str, counts: dict[str, int]) -> None:
        conn = self._open()
        with conn:
            conn.execute("UPDATE batches SET state = ?, counts = ?, updated_at = ? WHERE id = ?",
                         (state, orjson.dumps(counts).decode(), iso_utc(time.time()), batch_id))

    async def settled(self, batch_id: str, keys: Sequence[str]) -> None:
        """These keys of the batch are handled (in the cache, or handed back
        as failures): the batch no longer owes them."""
        await self._run(self._settled, batch_id, list(keys))

    def _settled(self, batch_id: str, keys: list[str]) -> None:
        conn = self._open()
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("DELETE FROM batch_keys WHERE batch_id = ? AND key = ?", [(batch_id, k) for k in keys])

    async def settled_stored(self, batch_id: str, keys: Sequence[str]) -> None:
        """`settled` for those of these keys whose result is in the cache
        (`entries`); the others stay owed (a rerun harvests them again)."""
        await self._run(self._settled_stored, batch_id, list(keys))

    def _settled_stored(self, batch_id: str, keys: list[str]) -> None:
        conn = self._open()
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("DELETE FROM batch_keys WHERE batch_id = ? AND key = ? AND EXISTS "
                             "(SELECT 1 FROM entries AS e WHERE e.key = ?)", [(batch_id, k, k) for k in keys])

    async def forget(self, batch_id: str) -> None:
        """Drop a batch and every key it owes (the provider no longer knows it)."""
        await self._run(self._forget, batch_id)

    def _forget(self, batch_id: str) -> None:
        conn = self._open()
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DELETE FROM batch_keys WHERE batch_id = ?", (batch_id,))
            conn.execute("DELETE FROM batches WHERE id = ?", (batch_id,))

    # -- reads -------------------------------------------------------------------------
    async def owing(self, endpoint: str, keys: Sequence[str]) -> dict[str, str]:
        """{key: batch id} for the keys a recorded batch of `endpoint` still owes."""
        return dict(await self._run(self._owing, endpoint, list(keys)))

    def _owing(self, endpoint: str, keys: list[str]) -> dict[str, str]:
        conn = self._open()
        found: dict[str, str] = {}
        for i in range(0, len(keys), _CHUNK):
            part = keys[i:i + _CHUNK]
            sql = ("SELECT k.key, k.batch_id FROM batch_keys AS k JOIN batches AS b ON b.id = k.batch_id "
                   f"WHERE b.endpoint = ? AND k.key IN ({','.join('?' * len(part))}) ORDER BY b.submitted_at")
            found.update(conn.execute(sql, [endpoint, *part]).fetchall())
        return found

    async def batches(self, *, owing_only: bool = False) -> list[LedgerBatch]:
        """Every recorded batch, oldest first (`owing_only`: those still owing keys)."""
        return list(await self._run(self._batches, owing_only))

    def _batches(self, owing_only: bool) -> list[LedgerBatch]:
        conn = self._open()
        # Owed: keys still listed whose result is not in `entries` either (a run
        # killed between storing results and settling them leaves such keys).
        rows = conn.execute(
            "SELECT id, endpoint, kind, base_url, model, state, counts, requests, submitted_at, updated_at, "
            "(SELECT count(*) FROM batch_keys AS k WHERE k.batch_id = id AND NOT EXISTS "
            "(SELECT 1 FROM entries AS e WHERE e.key = k.key)) FROM batches ORDER BY submitted_at").fetchall()
        out = []
        for (batch_id, endpoint, kind, base_url, model, state, counts, requests, submitted, updated, owed) in rows:
            if owing_only and not owed:
                continue
            out.append(LedgerBatch(id=batch_id, endpoint=endpoint, kind=kind, base_url=base_url, model=model,
                                   state=state, counts=orjson.loads(counts) if counts else {}, requests=requests,
                                   owed=owed, submitted_at=submitted, updated_at=updated))
        return out
