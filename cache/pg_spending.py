"""The spending ledger (cache/spending_ledger.py) in the PostgreSQL cache:
the same table (`spending`, schema `tulving`), so every machine sharing the
database counts what the others spent on the same run. Every write commits
before it returns."""
from __future__ import annotations

import time
from typing import cast

from cache.pg_side_table import PostgresSideTable
from cache.spending_ledger import RUNS, RunRow, RunSpending, run_rows
from cache.store import iso_utc

UPSERT = ("INSERT INTO spending (run, invocation, label, spent_usd, calls, started_at, updated_at) "
          "VALUES ($1, $2, $3, $4, $5, $6, $6) ON CONFLICT (run, invocation) DO UPDATE SET "
          "spent_usd = excluded.spent_usd, calls = excluded.calls, updated_at = excluded.updated_at")


class PostgresSpending(PostgresSideTable):
    def __init__(self, url: str):
        super().__init__(url, max_size=1)

    async def record_spending(self, run: str, invocation: str, *, usd: float, calls: int, label: str = "") -> None:
        await (await self._db()).execute(UPSERT, run, invocation, label, usd, calls, iso_utc(time.time()))

    async def ledger_total(self, run: str) -> RunSpending:
        found = await self._select(" WHERE run = $1 GROUP BY run", run)
        return found[0] if found else RunSpending(run=run)

    async def runs(self) -> list[RunSpending]:
        return await self._select(" GROUP BY run ORDER BY max(updated_at)")

    async def _select(self, where: str, *params: str) -> list[RunSpending]:
        rows = await (await self._db()).fetch(RUNS + where, *params)
        return run_rows(cast(list[RunRow], [tuple(row) for row in rows]))
