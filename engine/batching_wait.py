"""Waiting on a provider's batches, for `BatchingProvider` (engine/batching.py),
and the types both halves share (`Line`, `Watch`, `BatchOptions`, `BatchHost`).

4. Poll with backoff (options `batch_poll`, first wait in seconds, default 10,
   growing x1.5 up to `batch_poll_max`, default 300), a notice while waiting.
5. Harvest: each line's result (with `batched` set) or classified error goes
   to the calls waiting for it. Failed lines leave the ledger before their
   calls hear of it, so a retry goes into a new batch; results leave it once
   the engine has committed them to the cache (`BatchHost.committed`), else a
   rerun harvests them again from the same batch (paid once).

A batch the ledger recorded under a provisional id (a run killed between
asking for it and learning its id) is looked up first (`_adopt`); one the
provider no longer knows (404) is forgotten and its calls fail retryably.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cache.batches import BatchLedger
from providers.base import BAD_REPLY, BAD_REQUEST, RATE_LIMITED, ChatResult, ProviderError
from providers.batch_api import BatchApi, BatchInfo, LineResult, cancelled_error, expired_error

log = logging.getLogger(__name__)

POLL_FIRST = 10.0     # s before the first poll (endpoint option batch_poll)
POLL_MAX = 300.0      # longest wait between polls (batch_poll_max)
POLL_GROWTH = 1.5
POLL_FAILURES = 8     # failed polls (or result downloads) in a row before the batch's calls fail
NOTICE_EVERY = 30.0   # s between two "waiting for batch" lines
QUEUE_FULL_WAIT = 60.0  # s before a batch refused for the account's queue limit (token_limit_exceeded) is sent again
PROVISIONAL = "pending:"  # ledger id of a batch asked for whose id is not known yet (+ the prepare handle)


class BatchHost(Protocol):
    """The engine, as a batching provider sees it (engine/scheduler.py)."""

    def feeding(self) -> bool:
        """Whether a stream is pulling requests right now (more calls may come)."""

    async def committed(self) -> bool:
        """Wait until every result handed to the engine so far is committed
        to the cache; False when some may not be (no cache, or closing)."""

    def notice(self, message: str, *, key: Any = None, every: float = 10.0) -> None:
        """A line on stderr saying why the run waits."""


@dataclass(frozen=True, slots=True)
class BatchOptions:
    """An endpoint's batch options (the one place they are read)."""

    poll_first: float = POLL_FIRST        # batch_poll: s before the first poll, growing x1.5
    poll_max: float = POLL_MAX            # batch_poll_max: longest wait between polls
    queue_requests: int | None = None     # batch_queue_requests: requests in our batches at once
    queue_tokens: int | None = None       # batch_queue_tokens: prompt tokens in our batches at once


@dataclass(eq=False, slots=True)
class Line:
    """One request of a batch, and the calls waiting for its answer."""

    key: str                  # the cache key: the line's custom_id
    model: str
    body: bytes               # as the batch API sends it (its size counts toward the API's limit)
    tokens: int               # prompt estimate, for the queue's token limit
    waiters: list[asyncio.Future[ChatResult]] = field(default_factory=list)


@dataclass(eq=False)
class Watch:
    """One batch being waited on, and its lines, by key."""

    id: str
    lines: dict[str, Line] = field(default_factory=dict)
    started: float = 0.0       # time.monotonic() when it was submitted (or resumed)
    task: asyncio.Task[None] | None = None
    harvesting: bool = False   # its results are being handed over: let it finish
    load: tuple[str, int, int] | None = None  # (queue, requests, prompt tokens) it holds in the batch queue


class BatchOwner(Protocol):
    """The batching provider, as the waiting side sees it (engine/batching.py)."""

    name: str
    api: BatchApi
    ledger: BatchLedger | None
    host: BatchHost
    options: BatchOptions

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]: ...

    def deliver(self, line: Line, result: LineResult) -> bool: ...

    def fail(self, lines: Sequence[Line], error: ProviderError) -> None: ...

    def queue_release(self, load: tuple[str, int, int] | None) -> None: ...


class BatchWaiting:
    """The batches one batching provider waits on."""

    def __init__(self, provider: BatchOwner):
        self.p = provider
        self.watches: dict[str, Watch] = {}
        self.resumed = 0       # recorded batches polled again instead of submitting their calls

    def holds(self, line: Line) -> bool:
        return any(line in w.lines.values() for w in self.watches.values())

    def watch(self, watch: Watch, info: BatchInfo | None) -> None:
        """Wait for a batch (submitted now, or recorded earlier: info None)."""
        self.watches[watch.id] = watch
        watch.task = self.p.spawn(self._wait(watch, info), f"batch-wait:{watch.id}")

    def attach(self, batch_id: str, line: Line) -> None:
        """Wait on a recorded batch for this line instead of sending it again."""
        watch = self.watches.get(batch_id)
        if watch is None:
            watch = Watch(batch_id, started=time.monotonic())
            self.resumed += 1
            self.p.host.notice(f"{self.p.name}: resuming batch {batch_id} (submitted earlier)",
                               key=("resumed", batch_id))
            self.watch(watch, None)
        watch.lines[line.key] = line

    async def finish(self, grace: float) -> None:
        """Let harvests under way end (their last step, the ledger forgetting
        the keys stored, comes after the calls had their results)."""
        finishing = [w.task for w in self.watches.values() if w.harvesting and w.task is not None]
        if finishing:
            await asyncio.wait(finishing, timeout=grace)

    # -- polling -----------------------------------------------------------------------------
    async def _adopt(self, watch: Watch) -> BatchInfo | None:
        """A batch recorded under its provisional id: find it and record its
        id, or, when it was never created, forget it and send its calls again."""
        p = self.p
        handle = watch.id[len(PROVISIONAL):]
        try:
            info = await p.api.find(handle)
        except ProviderError as exc:
            self._fail_watch(watch, exc)
            return None
        if info is None:
            if p.ledger is not None:
                await p.ledger.forget(watch.id)
            self._fail_watch(watch, ProviderError(BAD_REPLY, f"{p.name}: the batch of input {handle} was never "
                                                             f"created: sending its requests again"))
            return None
        if p.ledger is not None:
            await p.ledger.rename(watch.id, info.id, info.status)
        if self.watches.get(watch.id) is watch:
            del self.watches[watch.id]
        watch.id = info.id
        self.watches.setdefault(info.id, watch)
        return info

    async def _wait(self, watch: Watch, info: BatchInfo | None) -> None:
        try:
            if watch.id.startswith(PROVISIONAL):
                info = await self._adopt(watch)
                if info is None:
                    return
            info = await self._poll_until_ended(watch, info)
            if info is not None:
                await self._harvest(watch, info)
        finally:
            self.p.queue_release(watch.load)
            watch.load = None
            if self.watches.get(watch.id) is watch:
                del self.watches[watch.id]

    async def _poll_until_ended(self, watch: Watch, info: BatchInfo | None) -> BatchInfo | None:
        """The batch once it has ended; None when its calls were failed instead."""
        p = self.p
        delay = p.options.poll_first
        failures = 0
        while info is None or not info.ended:
            if info is not None:
                await asyncio.sleep(delay)
                delay = min(delay * POLL_GROWTH, p.options.poll_max)
            try:
                info = await p.api.poll(watch.id)
            except ProviderError as exc:
                failures += 1
                if exc.status == 404:
                    await self._gone(watch, exc)
                    return None
                if not exc.retryable or failures >= POLL_FAILURES:
                    self._fail_watch(watch, exc)
                    return None
                p.host.notice(f"{p.name}: polling batch {watch.id} failed ({exc}); trying again",
                              key=("poll-failed", watch.id))
                if info is None:
                    await asyncio.sleep(delay)
                continue
            failures = 0
            if p.ledger is not None:
                await p.ledger.update(watch.id, info.status, dict(info.counts))
            if not info.ended:
                self._waiting_notice(watch, info)
        return info

    def _waiting_notice(self, watch: Watch, info: BatchInfo) -> None:
        done = sum(v for k, v in info.counts.items() if k not in ("total", "processing"))
        total = info.counts.get("total") or (sum(info.counts.values()) if "processing" in info.counts else 0)
        waited = time.monotonic() - watch.started
        self.p.host.notice(f"waiting for batch {watch.id} on {self.p.name}: {info.status}"
                           + (f", {done}/{total} done" if total else "") + f" ({waited:.0f} s so far)",
                           key=("batch-wait", self.p.name), every=NOTICE_EVERY)

    async def _gone(self, watch: Watch, exc: ProviderError) -> None:
        """The provider no longer knows the batch or its results (deleted,
        results past their 29-30 days): forget it, send its calls again."""
        p = self.p
        if p.ledger is not None:
            await p.ledger.forget(watch.id)
        self._fail_watch(watch, ProviderError(BAD_REPLY, f"{p.name}: batch {watch.id} or its results are gone "
                                                         f"({exc}): sending its requests again"))

    def _fail_watch(self, watch: Watch, error: ProviderError) -> None:
        self.p.fail(list(watch.lines.values()), error)
        watch.lines = {}

    # -- harvesting --------------------------------------------------------------------------
    def _missing(self, info: BatchInfo) -> ProviderError:
        """The error of a line an ended batch does not report."""
        name = self.p.name
        if info.failure is not None:
            if "limit_exceeded" in info.failure:  # the account's batch queue is full: later, not never
                return ProviderError(RATE_LIMITED, f"{name}: batch {info.id} refused: {info.failure}",
                                     retry_after=QUEUE_FULL_WAIT)
            return ProviderError(BAD_REQUEST, f"{name}: batch {info.id} failed: {info.failure}")
        if info.status in ("cancelled", "canceled", "cancelling", "canceling") or info.counts.get("canceled"):
            return cancelled_error(name, info.id)
        if info.status == "expired" or info.counts.get("expired"):
            return expired_error(name, info.id)
        return ProviderError(BAD_REPLY, f"{name}: batch {info.id} ended without a result for this request")

    async def _results(self, watch: Watch, info: BatchInfo) -> dict[str, LineResult] | None:
        """The ended batch's results; None when its calls were failed instead."""
        p = self.p
        failures = 0
        while True:
            try:
                return await p.api.results(info)
            except ProviderError as exc:
                failures += 1
                if exc.status == 404:
                    await self._gone(watch, exc)
                    return None
                if not exc.retryable or failures >= POLL_FAILURES:
                    self._fail_watch(watch, exc)
                    return None
                await asyncio.sleep(min(p.options.poll_first * failures, p.options.poll_max))

    async def _harvest(self, watch: Watch, info: BatchInfo) -> None:
        watch.harvesting = True
        results = await self._results(watch, info)
        if results is None:
            return
        p = self.p
        handled: set[str] = set()
        while True:  # lines attached while this harvest awaited are answered from the same results
            todo = [line for key, line in watch.lines.items() if key not in handled]
            if not todo:
                return
            handled.update(line.key for line in todo)
            answers = [(line, results.get(line.key) or self._missing(info)) for line in todo]
            failed = [line.key for line, answer in answers if isinstance(answer, ProviderError)]
            if failed and p.ledger is not None:  # out of the ledger first: their retry is a new batch
                await p.ledger.settled(watch.id, failed)
            delivered = [line.key for line, answer in answers
                         if p.deliver(line, answer) and isinstance(answer, ChatResult)]
            # The callers take their results (the engine hands each to the cache in that step), then
            # the cache commits them; only then does the ledger forget them (else a rerun harvests
            # them again). Lines nobody took any more stay owed.
            await asyncio.sleep(0)
            if delivered and p.ledger is not None and await p.host.committed():
                await p.ledger.settled(watch.id, delivered)
