"""Ctrl-C during a memory system's phase stops the run, however the signal
and the phase's end fall. The runner bounds each phase with a timeout; on
Python 3.11 `asyncio.wait_for` returns the step's result when the task's
cancellation arrives as the step ends (the stop is lost and the run goes on
to exit 0), so the runner uses `asyncio.timeout`. The two events are put in
the same turn of the event loop here, every time."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from engine.benchmark.memory.contract import Budget, Chapter, MemorySystem, Recall
from engine.benchmark.memory.meter import PhaseMeter
from engine.benchmark.memory.runner import prepare


class IngestEndsOnCue(MemorySystem):
    """Its ingest returns when the test sets `done`'s result."""

    def __init__(self) -> None:
        super().__init__("on-cue")
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ingesting = asyncio.Event()
        self.recalled = 0

    async def open(self, services: object) -> None:  # type: ignore[override]
        pass

    async def ingest(self, chapters: list[Chapter]) -> None:  # type: ignore[override]
        self.ingesting.set()
        await self.done

    async def recall(self, question: str, budget: Budget) -> Recall:
        self.recalled += 1
        return Recall(passages=[])


async def test_a_stop_that_comes_as_the_ingest_ends_stops_the_run():
    system = IngestEndsOnCue()
    services = SimpleNamespace(meter=PhaseMeter(system="on-cue"))
    run = asyncio.ensure_future(prepare(system, services, [Chapter(id=1, text="t")], ["q"], Budget()))  # type: ignore[arg-type]
    await system.ingesting.wait()
    system.done.set_result(None)  # the phase ends ...
    run.cancel()                  # ... in the same turn as Ctrl-C cancels the run
    with pytest.raises(asyncio.CancelledError):
        await run
    assert system.recalled == 0   # nothing after the stop
