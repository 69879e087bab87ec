"""A table of its own beside the responses, in the PostgreSQL cache (the
batch ledger, the spending ledger): a small pool opened at first use. Every
write commits before its coroutine returns, so closing just drops the
connections (the PostgreSQL twin of cache/side_table.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from cache.pg_schema import open_pool

if TYPE_CHECKING:
    import asyncpg


class PostgresSideTable:
    """The lazily opened pool of one side table (`max_size` connections)."""

    def __init__(self, url: str, max_size: int):
        self.url = url
        self._max_size = max_size
        self._pool: asyncpg.Pool | None = None

    async def _db(self) -> asyncpg.Pool:
        if self._pool is None:
            self._pool = await open_pool(self.url, max_size=self._max_size)
        return self._pool

    def close(self) -> None:
        """Every write was committed when awaited: the connections just go."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.terminate()
