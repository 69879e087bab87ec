"""The batch ledger (cache/batches.py) in the PostgreSQL cache: the same
tables (`batches`, `batch_keys`, schema `tulving`), so a batch one machine
submitted is found owing by another, which polls and collects it instead of
submitting it again. Every method commits before it returns."""
from __future__ import annotations

import time
from collections.abc import Sequence

import orjson

from cache.batches import LedgerBatch
from cache.pg_side_table import PostgresSideTable
from cache.store import iso_utc


class PostgresLedger(PostgresSideTable):
    def __init__(self, url: str):
        super().__init__(url, max_size=2)

    async def record(self, batch_id: str, *, endpoint: str, kind: str, base_url: str | None, model: str | None,
                     state: str, keys: Sequence[str]) -> None:
        now = iso_utc(time.time())
        async with (await self._db()).acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO batches (id, endpoint, kind, base_url, model, state, counts, requests, submitted_at, "
                "updated_at) VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8, $8) ON CONFLICT (id) DO UPDATE SET "
                "endpoint = $2, kind = $3, base_url = $4, model = $5, state = $6, requests = $7, updated_at = $8",
                batch_id, endpoint, kind, base_url, model, state, len(keys), now)
            await conn.execute("INSERT INTO batch_keys (batch_id, key) SELECT $1, k FROM unnest($2::text[]) AS k "
                               "ON CONFLICT DO NOTHING", batch_id, list(keys))

    async def rename(self, old_id: str, batch_id: str, state: str) -> None:
        async with (await self._db()).acquire() as conn, conn.transaction():
            await conn.execute("UPDATE batches SET id = $1, state = $2, updated_at = $3 WHERE id = $4",
                               batch_id, state, iso_utc(time.time()), old_id)
            await conn.execute("UPDATE batch_keys SET batch_id = $1 WHERE batch_id = $2", batch_id, old_id)

    async def update(self, batch_id: str, state: str, counts: dict[str, int]) -> None:
        await (await self._db()).execute("UPDATE batches SET state = $1, counts = $2, updated_at = $3 WHERE id = $4",
                                         state, orjson.dumps(counts).decode(), iso_utc(time.time()), batch_id)

    async def settled(self, batch_id: str, keys: Sequence[str]) -> None:
        await (await self._db()).execute("DELETE FROM batch_keys WHERE batch_id = $1 AND key = ANY($2::text[])",
                                         batch_id, list(keys))

    async def settled_stored(self, batch_id: str, keys: Sequence[str]) -> None:
        await (await self._db()).execute(
            "DELETE FROM batch_keys AS k WHERE k.batch_id = $1 AND k.key = ANY($2::text[]) AND EXISTS "
            "(SELECT 1 FROM entries AS e WHERE e.key = k.key)", batch_id, list(keys))

    async def forget(self, batch_id: str) -> None:
        async with (await self._db()).acquire() as conn, conn.transaction():
            await conn.execute("DELETE FROM batch_keys WHERE batch_id = $1", batch_id)
            await conn.execute("DELETE FROM batches WHERE id = $1", batch_id)

    async def owing(self, endpoint: str, keys: Sequence[str]) -> dict[str, str]:
        rows = await (await self._db()).fetch(
            "SELECT k.key, k.batch_id FROM batch_keys AS k JOIN batches AS b ON b.id = k.batch_id "
            "WHERE b.endpoint = $1 AND k.key = ANY($2::text[]) ORDER BY b.submitted_at", endpoint, list(keys))
        return {row[0]: row[1] for row in rows}

    async def batches(self, *, owing_only: bool = False) -> list[LedgerBatch]:
        rows = await (await self._db()).fetch(
            "SELECT id, endpoint, kind, base_url, model, state, counts, requests, submitted_at, updated_at, "
            "(SELECT count(*) FROM batch_keys AS k WHERE k.batch_id = b.id AND NOT EXISTS "
            "(SELECT 1 FROM entries AS e WHERE e.key = k.key)) AS owed FROM batches AS b ORDER BY submitted_at")
        return [LedgerBatch(id=r["id"], endpoint=r["endpoint"], kind=r["kind"], base_url=r["base_url"],
                            model=r["model"], state=r["state"], counts=orjson.loads(r["counts"]) if r["counts"] else {},
                            requests=r["requests"], owed=int(r["owed"]), submitted_at=r["submitted_at"],
                            updated_at=r["updated_at"])
                for r in rows if not owing_only or r["owed"]]
