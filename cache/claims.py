"""What both backends share about claims: the owner name of a process,
waiting for keys another process holds, and renewing this process's leases.

    owner = owner_name()                       # host:pid:random, one per open cache
    async for hits, mine in wait_claimed(cache, keys): ...
    renewer = LeaseRenewer(renew, lease)       # renew() every lease/3 while claims are held
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol

from providers.base import Result

log = logging.getLogger("tulving.cache")

# How long a claim holds without its owner renewing it; env TULVING_CACHE_LEASE (seconds) overrides.
DEFAULT_LEASE_SECONDS = 30.0

FIRST_POLL = 0.05   # seconds before looking again for a key another process holds
MAX_POLL = 1.0


def lease_seconds() -> float:
    raw = os.environ.get("TULVING_CACHE_LEASE", "")
    try:
        value = float(raw) if raw else DEFAULT_LEASE_SECONDS
    except ValueError:
        value = DEFAULT_LEASE_SECONDS
    return value if value > 0 else DEFAULT_LEASE_SECONDS


class _Claimer(Protocol):
    async def get_many(self, keys: Sequence[str]) -> dict[str, Result]: ...
    async def claim(self, keys: Sequence[str]) -> set[str]: ...


def owner_name() -> str:
    """Who holds a claim: readable (host and pid) and unique (a random part)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


async def wait_claimed(cache: _Claimer, keys: Sequence[str]) -> AsyncIterator[tuple[dict[str, Result], set[str]]]:
    """Poll, with a growing pause, for keys other processes hold: yields
    (results now cached, keys this process has now claimed, their owner's
    lease having run out or the owner having released them) until none is left."""
    remaining = list(dict.fromkeys(keys))
    delay = FIRST_POLL
    while remaining:
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, MAX_POLL)
        hits = await cache.get_many(remaining)
        rest = [k for k in remaining if k not in hits]
        mine = await cache.claim(rest) if rest else set()
        if hits or mine:
            yield hits, mine
        remaining = [k for k in rest if k not in mine]


class LeaseRenewer:
    """Calls `renew()` every `lease / 3` seconds while `active()` says claims
    are held, so a live process's claims never expire under a long call."""

    def __init__(self, renew: Callable[[], Awaitable[None]], lease: float, active: Callable[[], bool]):
        self._renew, self._lease, self._active = renew, lease, active
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._main(), name="tulving-cache-leases")

    async def _main(self) -> None:
        while True:
            await asyncio.sleep(self._lease / 3)
            if not self._active():
                continue
            try:
                await self._renew()
            except Exception as exc:  # noqa: BLE001 -- tried again at the next beat; the lease is 3 beats long
                log.warning("cache: could not renew the claims' leases (%s)", exc)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel a background task of the cache's claims and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
