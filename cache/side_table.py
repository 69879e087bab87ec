"""A table of its own beside the responses, in the cache's SQLite file (the
batch ledger, the spending ledger): one connection, used in order on a thread
of its own, so a write commits before its coroutine returns and the event
loop never waits on the disk."""
from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar, TypeVarTuple

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class SideTableFile:
    """The connection and thread of one side table; subclasses open it (`_open`)."""

    def __init__(self, path: str | os.PathLike[str], thread_name: str):
        self.path = Path(path)
        self._conn: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self._closed = False

    async def _run(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Close the connection once the writes queued before have run (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._thread.submit(self._close)
        self._thread.shutdown(wait=True)
