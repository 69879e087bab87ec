"""The spending ledger: what each invocation of a run paid, in the cache's
own SQLite file, so `--max-cost` can count every earlier invocation of the
same run, whatever folder (or machine, on a shared cache) it ran from, and
one killed before it wrote its run folder.

A run is named by its key (a digest of what makes its results, computed by
the caller: engine/benchmark/evaluation/run_record.py `run_key`); each
invocation by a fresh id. The engine writes the invocation's totals as its
calls are paid (engine/spending_feed.py), every fraction of a second and at
exit, so a killed invocation loses at most the last moment's spending.

Table (added to any cache file, old or new, when first used; it changes
nothing of `entries`, so the cache format version stays 1 and older
Tulvings ignore it):

    spending (
      run        TEXT NOT NULL,     -- the run's key (hex digest of its configuration)
      invocation TEXT NOT NULL,     -- one `tulving run`: a fresh id
      label      TEXT NOT NULL,     -- what the run is, fit to print (book: models)
      spent_usd  REAL NOT NULL,     -- what this invocation's paid calls cost so far
      calls      INTEGER NOT NULL,  -- calls paid (replies received) so far
      started_at TEXT NOT NULL,     -- UTC ISO 8601
      updated_at TEXT NOT NULL,
      PRIMARY KEY (run, invocation)
    )

    SELECT run, label, sum(spent_usd), sum(calls), count(*) FROM spending GROUP BY run;
"""
from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cache.side_table import SideTableFile
from cache.store import connect, damaged, iso_utc

SCHEMA = """
CREATE TABLE IF NOT EXISTS spending (
    run TEXT NOT NULL,
    invocation TEXT NOT NULL,
    label TEXT NOT NULL,
    spent_usd REAL NOT NULL,
    calls INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (run, invocation)
)
"""
UPSERT = ("INSERT INTO spending (run, invocation, label, spent_usd, calls, started_at, updated_at) "
          "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run, invocation) DO UPDATE SET "
          "spent_usd = excluded.spent_usd, calls = excluded.calls, updated_at = excluded.updated_at")
# One row per run: every invocation added up (`label`: the latest invocation's).
RUNS = ("SELECT run, (SELECT label FROM spending AS l WHERE l.run = s.run ORDER BY updated_at DESC LIMIT 1), "
        "sum(spent_usd), sum(calls), count(*), min(started_at), max(updated_at) FROM spending AS s")


@dataclass(frozen=True, slots=True)
class RunSpending:
    """Every invocation of one run, added up."""

    run: str
    label: str = ""
    spent_usd: float = 0.0
    calls: int = 0
    invocations: int = 0
    started_at: str = ""   # the first invocation's start ('' when none)
    updated_at: str = ""   # the latest update


# run, label, spent_usd, calls, invocations, started_at, updated_at
RunRow = tuple[str, str | None, float | None, int | None, int, str | None, str | None]


def run_rows(rows: Sequence[RunRow]) -> list[RunSpending]:
    """RunSpending of RUNS' rows (either backend)."""
    return [RunSpending(run=r[0], label=r[1] or "", spent_usd=float(r[2] or 0.0), calls=int(r[3] or 0),
                        invocations=int(r[4]), started_at=r[5] or "", updated_at=r[6] or "") for r in rows]


class SpendingLedger(SideTableFile):
    """The ledger of one cache file. A write commits before it returns; the
    work runs in order on a thread of its own. Reading a file without the
    table (or no file at all) finds nothing, and creates nothing."""

    def __init__(self, path: str | os.PathLike[str]):
        super().__init__(path, "tulving-spending-ledger")
        self._has_table = False

    def _open(self, *, write: bool) -> sqlite3.Connection | None:
        if self._conn is None:
            if not write and not self.path.is_file():
                return None
            self._conn = connect(self.path, create=write)
        if write and not self._has_table:
            try:
                self._conn.execute(SCHEMA)
            except sqlite3.Error as exc:
                raise damaged(self.path, exc) from None
            self._has_table = True
        elif not self._has_table:
            self._has_table = self._conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'spending'").fetchone() is not None
            if not self._has_table:
                return None
        return self._conn

    async def record_spending(self, run: str, invocation: str, *, usd: float, calls: int, label: str = "") -> None:
        """This invocation's totals so far (they replace the ones recorded before)."""
        await self._run(self._record, run, invocation, usd, calls, label)

    def _record(self, run: str, invocation: str, usd: float, calls: int, label: str) -> None:
        conn = self._open(write=True)
        assert conn is not None  # opened for writing
        now = iso_utc(time.time())
        conn.execute(UPSERT, (run, invocation, label, usd, calls, now, now))

    async def ledger_total(self, run: str) -> RunSpending:
        """Every invocation of `run` added up (zeros when none is recorded)."""
        found = await self._run(self._select, " WHERE run = ? GROUP BY run", (run,))
        return found[0] if found else RunSpending(run=run)

    async def runs(self) -> list[RunSpending]:
        """Every run recorded, the latest updated last."""
        return list(await self._run(self._select, " GROUP BY run ORDER BY max(updated_at)", ()))

    def _select(self, where: str, params: tuple[str, ...]) -> list[RunSpending]:
        conn = self._open(write=False)
        return [] if conn is None else run_rows(conn.execute(RUNS + where, params).fetchall())
