"""One response-cache interface for the engine, whatever stores it.

    cache = open_cache("runs/cache.sqlite")             # the SQLite file (cache/store.py)
    cache = open_cache("postgresql://user@host/db")     # a shared PostgreSQL database (cache/postgres.py)
    async with cache:
        found = await cache.get_many(keys)              # {key: result} for the hits
        mine = await cache.claim(misses)                # the keys this process now pays for
        cache.put(key, identity, result)                # queued; the claim ends once it is stored
        cache.release([key])                            # a claimed call that failed: others may try
        async for hits, claimed in cache.wait_for(keys): ...   # keys another process is paying for

Claims keep two processes (or machines) sharing one cache from paying twice
for one call: a process claims the keys it is about to send; another that
needs a claimed key waits for its result instead of sending it. A claim has a
lease (`lease_seconds`), renewed while its owner lives; the claims of a
killed process expire at their lease's end and are then taken over. A
SQLite cache alone on its file holds its claims in memory until another
process joins (cache/sessions.py): `claim` then takes the keys as given.
"""
from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from cache.keys import Identity
from cache.location import is_postgres_url as is_postgres_url
from cache.location import redact as redact
from providers.base import Result

if TYPE_CHECKING:
    from cache.batches import LedgerBatch
    from cache.spending_ledger import RunSpending

@runtime_checkable
class ResponseStore(Protocol):
    """What the engine asks of a response cache (SQLite or PostgreSQL)."""

    write_errors: int

    @property
    def location(self) -> str:
        """Where the cache is, fit to print (a URL's password redacted)."""
        ...

    async def open(self) -> Self: ...
    async def close(self) -> None: ...
    async def flush(self) -> None: ...
    async def __aenter__(self) -> Self: ...
    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None: ...

    async def get_many(self, keys: Sequence[str]) -> dict[str, Result]: ...
    async def get(self, key: str) -> Result | None: ...
    def put(self, key: str, identity: Identity, result: Result, *, canonical: bytes | None = None) -> None: ...

    @property
    def backlog_chars(self) -> int: ...
    async def wait_for_room(self, max_chars: int) -> None: ...

    # -- claims ------------------------------------------------------------------------
    async def claim(self, keys: Sequence[str]) -> set[str]:
        """Claim the keys nobody holds (or whose lease ran out) and that are
        not cached: the set this process now holds; the others are cached or
        held by a live process (`wait_for` them)."""
        ...

    def release(self, keys: Sequence[str]) -> None:
        """End this process's claims on `keys` (calls that failed or were
        dropped); a stored result ends its claim by itself."""
        ...

    def wait_for(self, keys: Sequence[str]) -> AsyncIterator[tuple[dict[str, Result], set[str]]]:
        """Keys held by others: yields (results now cached, keys now claimed
        by this process) as they come, until every key is one or the other."""
        ...


class BatchLedgerStore(Protocol):
    """The batch ledger (cache/batches.py), on whichever backend."""

    async def record(self, batch_id: str, *, endpoint: str, kind: str, base_url: str | None, model: str | None,
                     state: str, keys: Sequence[str]) -> None: ...
    async def rename(self, old_id: str, batch_id: str, state: str) -> None: ...
    async def update(self, batch_id: str, state: str, counts: dict[str, int]) -> None: ...
    async def settled(self, batch_id: str, keys: Sequence[str]) -> None: ...
    async def settled_stored(self, batch_id: str, keys: Sequence[str]) -> None: ...
    async def forget(self, batch_id: str) -> None: ...
    async def owing(self, endpoint: str, keys: Sequence[str]) -> dict[str, str]: ...
    async def batches(self, *, owing_only: bool = False) -> list[LedgerBatch]: ...
    def close(self) -> None: ...


def open_cache(location: str | os.PathLike[str], *, spill_dir: str | os.PathLike[str] | None = None
               ) -> ResponseStore:
    """The cache at `location` (not opened yet): a `postgresql://` or
    `postgres://` URL is a PostgreSQL database, anything else a SQLite file.
    `spill_dir`: where a PostgreSQL cache keeps results while the database is
    away (default: the current folder)."""
    if is_postgres_url(location):
        from cache.postgres import PostgresCache

        return PostgresCache(os.fspath(location), spill_dir=spill_dir)
    from cache.store import ResponseCache

    return ResponseCache(location)


def open_ledger(location: str | os.PathLike[str]) -> BatchLedgerStore:
    """The batch ledger of the cache at `location` (as `open_cache` chooses)."""
    if is_postgres_url(location):
        from cache.pg_ledger import PostgresLedger

        return PostgresLedger(os.fspath(location))
    from cache.batches import BatchLedger

    return BatchLedger(location)


class SpendingLedgerStore(Protocol):
    """The spending ledger (cache/spending_ledger.py), on whichever backend:
    what each invocation of a run paid, keyed by the run's key."""

    async def record_spending(self, run: str, invocation: str, *, usd: float, calls: int, label: str = "") -> None:
        """This invocation's totals so far (replacing what it recorded before)."""
        ...

    async def ledger_total(self, run: str) -> RunSpending:
        """Every invocation of `run` added up (zeros when none is recorded)."""
        ...

    async def runs(self) -> list[RunSpending]: ...
    def close(self) -> None: ...


def open_spending_ledger(location: str | os.PathLike[str]) -> SpendingLedgerStore:
    """The spending ledger of the cache at `location` (as `open_cache` chooses)."""
    if is_postgres_url(location):
        from cache.pg_spending import PostgresSpending

        return PostgresSpending(os.fspath(location))
    from cache.spending_ledger import SpendingLedger

    return SpendingLedger(location)
