"""Drive the engine with one load point and time the client while doing it.

`run_point(engine, make_request, point)` sends requests on the point's
schedule (engine/benchmark/latency/load.py), each through the real engine
(`Engine.stream`, one stream per request, so it enters the engine when it is
due: a shared stream would pull requests in batches), and returns their
records (engine/benchmark/latency/metrics.py) with the client's own cost:

- open loop (a finite rate): requests are due on the schedule whatever is in
  flight; with `max_concurrency` a due request waits for a free slot (as
  vLLM's semaphore does), and that wait is not part of its latency figures
  (`scheduled` vs `started` shows it);
- closed loop (`--rate inf` with a concurrency cap): a new request as soon
  as one ends, `max_concurrency` in flight;
- `--rate inf` alone: every request at once.

The engine's own limits (the endpoint's rpm, token limits, max_concurrency)
still apply behind that: time spent there is `queued` in the records.

Client cost (`ClientCost`): the process's CPU time over the point per request
(the engine, its HTTP client and cache threads included) -- and the same net
of what the process spends idle (the lag probe, timers), measured for 0.2 s
before the point, which dominates at low rates -- and the event loop's
lag, measured by a probe task that sleeps `LAG_INTERVAL` and records how late
it wakes: when the loop is busy, every reply is read late and TTFT grows with
it, so a high lag says the client, not the server, set the figures.
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from engine.benchmark.latency.load import LoadPoint, schedule
from engine.benchmark.latency.metrics import RequestRecord, record
from engine.requests import Outcome, Request
from engine.scheduler import Engine

IDLE_SAMPLE = 0.2    # seconds of idling measured before each point (its fixed cost per second)
LAG_INTERVAL = 0.010  # seconds between the probe's wake-ups (its own CPU is part of the figure)


@dataclass(slots=True)
class ClientCost:
    requests: int
    cpu_seconds: float
    cpu_us_per_request: float
    loop_lag_mean_ms: float
    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    lag_samples: int
    idle_cpu_ms_per_s: float = math.nan        # the process idle (lag probe included), measured just before
    net_cpu_us_per_request: float = math.nan   # CPU per request above that idle cost

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class LagProbe:
    """Sleeps LAG_INTERVAL again and again, recording the overshoot."""

    def __init__(self, interval: float = LAG_INTERVAL):
        self.interval = interval
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        clock = time.perf_counter
        while True:
            t0 = clock()
            await asyncio.sleep(self.interval)
            self.lags.append(max(0.0, clock() - t0 - self.interval))

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def figures(self) -> tuple[float, float, float]:
        """(mean, p99, max) in milliseconds."""
        if not self.lags:
            return (math.nan, math.nan, math.nan)
        a = np.asarray(self.lags) * 1000
        return float(a.mean()), float(np.percentile(a, 99)), float(a.max())


@dataclass(slots=True)
class PointRun:
    point: LoadPoint
    records: list[RequestRecord] = field(default_factory=list)
    duration: float = 0.0
    client: ClientCost | None = None


async def _idle_cpu_rate(seconds: float) -> float:
    """CPU seconds per second this process spends with nothing to send."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    return (time.process_time() - cpu0) / (time.perf_counter() - t0)


async def _outcome(engine: Engine, request: Request) -> Outcome:
    got: Outcome | None = None
    # aclosing: a cancelled request leaves the engine at once (its call cancelled), not when collected.
    async with contextlib.aclosing(engine.stream((request,), total=1)) as outcomes:  # type: ignore[type-var]
        async for outcome in outcomes:
            got = outcome
    assert got is not None  # one request in, one outcome out
    return got


async def run_point(engine: Engine, make_request: Callable[[int], Request], point: LoadPoint) -> PointRun:
    """Send the point's requests and collect their records (see the module docstring)."""
    run = PointRun(point)
    slots = asyncio.Semaphore(point.max_concurrency) if point.max_concurrency else None
    closed_loop = slots is not None and math.isinf(point.rate)
    clock = time.monotonic
    tasks: set[asyncio.Task[None]] = set()
    failures: list[BaseException] = []
    probe, idle_rate = await _started_probe()
    cpu0 = time.process_time()
    origin = clock()

    async def one(index: int, scheduled: float, slot_taken: float) -> None:
        acquired = closed_loop
        try:
            if slots is not None and not closed_loop:
                await slots.acquire()
                acquired = True
            request = make_request(index)
            started = slot_taken if closed_loop else clock() - origin  # closed: when the duration was checked
            outcome = await _outcome(engine, request)
            run.records.append(record(outcome, index=index, scheduled=scheduled, started=started,
                                      done=clock() - origin, origin=origin))
        finally:
            if slots is not None and acquired:
                slots.release()

    def finished(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            failures.append(task.exception())  # type: ignore[arg-type]

    try:
        for index, offset in enumerate(schedule(point)):
            if failures:
                break
            while (wait := origin + offset - clock()) > 0:  # again if woken early (uvloop's timers: whole ms)
                await asyncio.sleep(wait)
            if closed_loop and slots is not None:
                await slots.acquire()
            if point.duration is not None and (now := clock() - origin) >= point.duration:
                if closed_loop and slots is not None:
                    slots.release()
                break
            task = asyncio.create_task(one(index, offset, now if point.duration is not None else clock() - origin))
            tasks.add(task)
            task.add_done_callback(finished)
        while tasks and not failures:
            await asyncio.wait(set(tasks), return_when=asyncio.FIRST_EXCEPTION)
        if failures:
            raise failures[0]
    finally:
        await _cancelled(tasks)
        await probe.stop()
    cpu, wall = time.process_time() - cpu0, clock() - origin
    run.records.sort(key=lambda r: r.index)
    run.duration = max((r.done for r in run.records), default=0.0)
    run.client = _client_cost(len(run.records), cpu, wall, idle_rate, probe)
    return run


async def _started_probe() -> tuple[LagProbe, float]:
    """A running loop-lag probe, and the process's idle CPU rate measured before the load."""
    probe = LagProbe()
    probe.start()
    idle_rate = await _idle_cpu_rate(IDLE_SAMPLE)
    probe.lags.clear()
    return probe, idle_rate


async def _cancelled(tasks: set[asyncio.Task[None]]) -> None:
    for task in list(tasks):
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


def _client_cost(n: int, cpu: float, wall: float, idle_rate: float, probe: LagProbe) -> ClientCost:
    """What the point cost the client: CPU per request (net of the idle rate) and the loop's lag."""
    mean, p99, worst = probe.figures()
    net = cpu - idle_rate * wall
    return ClientCost(requests=n, cpu_seconds=cpu, cpu_us_per_request=cpu / n * 1e6 if n else math.nan,
                      idle_cpu_ms_per_s=idle_rate * 1000,
                      net_cpu_us_per_request=max(0.0, net) / n * 1e6 if n else math.nan,
                      loop_lag_mean_ms=mean, loop_lag_p99_ms=p99, loop_lag_max_ms=worst,
                      lag_samples=len(probe.lags))
