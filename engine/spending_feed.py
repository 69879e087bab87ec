"""What this invocation pays, written to the cache's spending ledger
(cache/spending_ledger.py) as it is paid, so the next invocation of the same
run counts it under `--max-cost`, even when this one is killed.

    feed = SpendingFeed(open_spending_ledger(cache_path), run_key, budget, label="book: models")
    feed.start()          # writes the totals every INTERVAL seconds while they change (from the first call)
    ...
    await feed.close()    # the last totals (an invocation without a call: $0, unless it failed), then closed

The run's key is a plain string computed above the engine (the benchmark
knows what makes a run: engine/benchmark/evaluation/run_record.py `run_key`);
the invocation's id is fresh for every feed. A ledger write that fails is
said once in the log and tried again at the next tick: the run itself goes on.
"""
from __future__ import annotations

import asyncio
import logging
import uuid

from cache.backend import SpendingLedgerStore
from engine.budget import Budget

log = logging.getLogger("tulving.spending")

INTERVAL = 0.5  # seconds between two writes while spending changes: what a killed invocation may leave out


class SpendingFeed:
    def __init__(self, ledger: SpendingLedgerStore, run: str, budget: Budget, *, label: str = "",
                 interval: float = INTERVAL):
        self.ledger, self.run, self.budget, self.label, self.interval = ledger, run, budget, label, interval
        self.invocation = uuid.uuid4().hex[:16]
        # As if (0 paid, 0 calls) were written: the first write waits for a call
        # (or for `close`), so an invocation that fails before its first call
        # (a missing key) leaves no entry.
        self._written: tuple[float, int] | None = (0.0, 0)
        self._recorded = False
        self._task: asyncio.Task[None] | None = None
        self._failed = False

    def start(self) -> None:
        """Keep the invocation's totals current, from its first call on."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await self.write()
            await asyncio.sleep(self.interval)

    async def write(self) -> None:
        """Write the totals if they changed since the last write."""
        paid = self.budget.paid()
        if paid == self._written:
            return
        try:
            await self.ledger.record_spending(self.run, self.invocation, usd=paid[0], calls=paid[1], label=self.label)
        except Exception as exc:  # noqa: BLE001 -- the ledger must not end the run; the next tick retries
            if not self._failed:
                self._failed = True
                log.warning("cannot record spending in the cache's ledger: %s", exc)
            return
        self._written, self._recorded = paid, True

    async def close(self, *, failed: bool = False) -> None:
        """The last totals written, the ledger closed (idempotent). An
        invocation that made no call is recorded (at $0) unless it `failed`
        (ended in an error before its first outcome): then it did nothing and
        leaves nothing."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        try:
            if not self._recorded and not failed:
                self._written = None  # the $0 entry of an invocation that ended without a call
            await self.write()
        finally:
            self.ledger.close()
