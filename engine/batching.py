"""Batch mode (`tulving run --batch`): a provider whose chat calls go through
its kind's batch API (OpenAI Batch API, Anthropic Message Batches) instead of
one by one.

`BatchingProvider` wraps an endpoint's direct provider and its `BatchApi`
(providers/batch_api.py). As inspect_ai's `Batcher.generate_for_request`
does, its `chat()` puts the call into the batch being gathered and waits for
its line; embeddings go to the wrapped provider. The engine chooses it once,
when it builds an endpoint (`Batching.provider`, engine/batching_mode.py);
the dispatcher and the scheduler see a provider that holds its calls in a
queue of its own
(`Provider.holds_calls`: not paced by the endpoint's limits, not counted in
the engine's pull window) and results that say they came by batch
(`ChatResult.batched`: the budget prices them at the batch discount). The
dispatcher hands each call's cache key over in `requests.CALL_KEY`: it is the
line's custom_id, and the ledger's key.

Life of a batch:
1. Gather: each call joins the batch being gathered (one line per cache key,
   whoever waits on it). The batch goes out once the streams stop feeding it
   -- no stream is pulling requests, no line that failed retryably may still
   come back, and nothing came for QUIET_IDLE seconds, or nothing came for
   QUIET_MAX seconds whatever the streams do -- or the API's request limit is
   reached.
2. Resume: keys that a batch recorded in the ledger (cache/batches.py) still
   owes are not submitted again: their batch is polled instead. That is how a
   killed run, rerun, pays for nothing twice.
3. Submit: by model where the API wants one model per batch, split at the
   API's request-count and size limits and the account's batch queue limits
   (`batch_queue_requests`, `batch_queue_tokens`: later batches wait for
   earlier ones to end); the batch's id and keys are recorded in the ledger
   before anything waits on it.
4. Poll with backoff (options `batch_poll`, first wait in seconds, default 10,
   growing x1.5 up to `batch_poll_max`, default 300), a notice while waiting
   (`BatchWaiting`). A batch the ledger recorded under a provisional id (a run
   killed between asking for it and learning its id) is looked up first; one
   the provider no longer knows (404) is forgotten and its calls fail
   retryably (the engine's retry sends them again).
5. Harvest: each line's result (with `batched` set) or classified error goes
   to the calls waiting for it. Failed lines leave the ledger before their
   calls hear of it, so a retry goes into a new batch; results leave it once
   the engine has committed them to the cache (`BatchHost.committed`), else a
   rerun harvests them again from the same batch (paid once).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from cache.backend import BatchLedgerStore
from cache.keys import request_key
from engine.batch_matching import Matcher
from engine.call import request_chars
from engine.requests import CALL_KEY, Request
from providers.base import (
    BAD_REPLY,
    BAD_REQUEST,
    RATE_LIMITED,
    ChatResult,
    EmbedResult,
    Provider,
    ProviderError,
)
from providers.batch_api import BatchApi, BatchInfo, LineResult, cancelled_error, expired_error
from providers.http_errors import exception_error

log = logging.getLogger(__name__)

QUIET_IDLE = 0.05     # s without a new call, once no stream is pulling requests: submit
QUIET_MAX = 2.0       # s without a new call, whatever the streams do: submit
SIZE_MARGIN = 4096    # bytes kept free under an API's size limit (the file's or body's own framing)
HARVEST_GRACE = 30.0  # s a closing provider waits for a harvest under way

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
    """An endpoint's batch options (read in engine/batching_mode.py)."""

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


def _own_key(model: str, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]) -> str:
    """A custom_id for a call made outside the engine (which passes the
    call's cache key in CALL_KEY)."""
    return request_key({"model": model, "messages": [dict(m) for m in messages], "params": dict(params)})


class BatchingProvider(Provider):
    """An endpoint's chat calls by batch (see the module docstring); the
    waiting side is `BatchWaiting`."""

    holds_calls = True
    can_stream = False

    def __init__(self, direct: Provider, api: BatchApi, options: BatchOptions, ledger: BatchLedgerStore | None,
                 host: BatchHost):
        super().__init__(direct.spec)
        self.direct, self.api, self.options, self.ledger, self.host = direct, api, options, ledger, host
        self.name = direct.spec.name
        self.kind = direct.kind
        self.caches_prompt_prefix = direct.caches_prompt_prefix
        self.cache_reads_count_toward_limits = direct.cache_reads_count_toward_limits
        self.enforces_timeout = direct.enforces_timeout  # for embeddings: chat calls are not timed
        self.lines: dict[str, Line] = {}      # every line waited for: gathered, or in a batch
        self._gathered: list[Line] = []
        self._gathered_at = 0.0
        # Keys of lines answered with a retryable error, since when: their calls are likely
        # to come back within moments (the engine's retry), and are waited for (QUIET_MAX at
        # most) so that a round's failed lines go in one batch, not in one per gap in the loop.
        self._coming_back: dict[str, float] = {}
        self._gather_event = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._queued: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # queue -> [requests, tokens] in batches
        self._queue_freed = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.waiting = BatchWaiting(self)
        self.submitted = 0     # batches this provider created
        self.batched = 0       # calls sent in batches it created

    # -- the Provider interface ------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        return self.direct.count_tokens(text)

    async def embed(self, model: str, texts: Sequence[str], *, timeout: float) -> EmbedResult:
        return await self.direct.embed(model, texts, timeout=timeout)

    async def chat(self, model: str, messages: Sequence[Mapping[str, Any]], *,
                   params: Mapping[str, Any], timeout: float, stream: bool = False) -> ChatResult:
        """Join the batch being gathered and wait for the line's result
        (hours, maybe: the batch API's window bounds it, not `timeout`)."""
        key = CALL_KEY.get() or _own_key(model, messages, params)
        line = self.lines.get(key)
        if line is None:
            try:
                body = self.api.line(key, model, messages, params)
            except (TypeError, ValueError) as exc:  # a parameter JSON cannot hold: this call alone fails
                raise ProviderError(BAD_REQUEST, f"{self.name}: cannot write the batch line: {exc}") from None
            tokens = sum(self.direct.count_tokens(str(m.get("content", ""))) for m in messages)
            line = self.lines[key] = Line(key, model, body, tokens)
            self._coming_back.pop(key, None)
            self._gathered.append(line)
            self._gathered_at = time.monotonic()
            self._gather_event.set()
            self._start()
        future: asyncio.Future[ChatResult] = asyncio.get_running_loop().create_future()
        line.waiters.append(future)
        try:
            return await future
        finally:
            if future.cancelled():
                self._left(line, future)

    async def aclose(self) -> None:
        """Stop waiting. Batches still running stay recorded in the ledger: a
        rerun polls them again. A harvest under way finishes first."""
        await self.waiting.finish(HARVEST_GRACE)
        tasks = [t for t in (self._loop_task, *self.tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop_task = None
        for closing in (self.api.aclose, self.direct.aclose):
            try:
                await closing()
            except Exception:  # noqa: BLE001 -- closing must not mask the run's outcome
                pass

    # -- lines -----------------------------------------------------------------------------
    def _left(self, line: Line, future: asyncio.Future[ChatResult]) -> None:
        """A caller stopped waiting. A line nobody waits for any more is not
        sent; one already in a batch stays owed in the ledger (a rerun
        harvests it)."""
        if future in line.waiters:
            line.waiters.remove(future)
        if not line.waiters and line in self._gathered:
            self._gathered.remove(line)
            if self.lines.get(line.key) is line:
                del self.lines[line.key]

    def deliver(self, line: Line, result: LineResult) -> bool:
        """Hand a line's result (or error) to every call waiting for it;
        True when a result reached one."""
        if self.lines.get(line.key) is line:
            del self.lines[line.key]
        if isinstance(result, ProviderError) and result.retryable and line.waiters:
            self._coming_back[line.key] = time.monotonic()
        reached = False
        for i, future in enumerate(line.waiters):
            if future.done():
                continue
            if isinstance(result, ChatResult):
                answer = result if i == 0 else dataclasses.replace(result)
                answer.batched = True
                future.set_result(answer)
                reached = True
            else:
                future.set_exception(result)
        line.waiters = []
        return reached

    def fail(self, lines: Sequence[Line], error: ProviderError) -> None:
        for line in lines:
            self.deliver(line, error)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    # -- gathering -------------------------------------------------------------------------
    def _start(self) -> None:
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._gather_loop(),
                                                                     name=f"batch:{self.name}")

    async def _gathering_ends(self) -> None:
        full = self.api.max_requests
        while len(self._gathered) < full:
            now = time.monotonic()
            quiet = now - self._gathered_at
            if quiet >= QUIET_MAX or quiet >= QUIET_IDLE and not self.host.feeding() and not self._awaited(now):
                return
            await asyncio.sleep(QUIET_IDLE)

    def _awaited(self, now: float) -> bool:
        """Whether lines that failed retryably may still come back (for QUIET_MAX since they failed)."""
        for key, since in list(self._coming_back.items()):
            if now - since >= QUIET_MAX:
                del self._coming_back[key]
        return bool(self._coming_back)

    def _take_gathered(self) -> list[Line]:
        """The gathered lines that go now: all of them, or whole batches of
        the API's request limit (the rest keeps gathering)."""
        full = self.api.max_requests
        if len(self._gathered) >= full:
            cut = len(self._gathered) // full * full
            lines, self._gathered = self._gathered[:cut], self._gathered[cut:]
        else:
            lines, self._gathered = self._gathered, []
        if not self._gathered:
            self._gather_event.clear()
        return lines

    async def _gather_loop(self) -> None:
        while True:
            await self._gather_event.wait()
            await self._gathering_ends()
            lines = self._take_gathered()
            try:
                await self._send(lines)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- a bug here fails the calls, never hangs them
                log.exception("endpoint %s: sending a batch failed", self.name)
                error = ProviderError(BAD_REPLY, f"engine error while batching: {type(exc).__name__}: {exc}")
                self.fail([line for line in lines if not self.waiting.holds(line)], error)

    # -- submitting ------------------------------------------------------------------------
    async def _send(self, lines: list[Line]) -> None:
        lines = [line for line in lines if line.waiters]
        if not lines:
            return
        owed = await self.ledger.owing(self.name, [line.key for line in lines]) if self.ledger else {}
        groups: dict[str, list[Line]] = defaultdict(list)
        for line in lines:
            batch_id = owed.get(line.key)
            if batch_id is not None:
                self.waiting.attach(batch_id, line)
            else:
                groups[line.model if self.api.one_model_per_batch else ""].append(line)
        for queue, group in groups.items():
            for chunk in self._split(group):
                self.spawn(self._submit(queue, chunk), f"batch-submit:{self.name}")

    def _split(self, lines: list[Line]) -> list[list[Line]]:
        """Consecutive chunks within the API's request-count and size limits
        and the endpoint's batch queue."""
        chunks: list[list[Line]] = []
        chunk: list[Line] = []
        size = tokens = 0
        queue_tokens = self.options.queue_tokens
        max_requests = min(self.api.max_requests, self.options.queue_requests or self.api.max_requests)
        for line in lines:
            n, t = len(line.body) + 1, line.tokens
            if chunk and (len(chunk) >= max_requests or size + n > self.api.max_bytes - SIZE_MARGIN
                          or queue_tokens is not None and tokens + t > queue_tokens):
                chunks.append(chunk)
                chunk, size, tokens = [], 0, 0
            chunk.append(line)
            size += n
            tokens += t
        if chunk:
            chunks.append(chunk)
        return chunks

    def _queue_full(self, held: list[int], requests: int, tokens: int) -> bool:
        limit_requests, limit_tokens = self.options.queue_requests, self.options.queue_tokens
        return bool(held[0]) and (limit_requests is not None and held[0] + requests > limit_requests
                                  or limit_tokens is not None and held[1] + tokens > limit_tokens)

    async def _queue_room(self, queue: str, requests: int, tokens: int) -> tuple[str, int, int]:
        """Wait until the batch queue has room for this batch (always when
        none of ours is in it), then hold its load there."""
        held = self._queued[queue]
        while self._queue_full(held, requests, tokens):
            self.host.notice(f"{self.name}: batch queue full ({held[0]} requests, {held[1]} prompt tokens in "
                             f"batches); the next batch waits for one to end", key=("queue", self.name))
            self._queue_freed.clear()
            await self._queue_freed.wait()
        held[0] += requests
        held[1] += tokens
        return queue, requests, tokens

    def queue_release(self, load: tuple[str, int, int] | None) -> None:
        if load is not None:
            held = self._queued[load[0]]
            held[0] -= load[1]
            held[1] -= load[2]
            self._queue_freed.set()

    async def _record(self, batch_id: str, state: str, lines: list[Line]) -> None:
        assert self.ledger is not None  # recorded only with a ledger
        spec = self.spec
        await self.ledger.record(batch_id, endpoint=self.name, kind=spec.kind, base_url=spec.base_url,
                                 model=lines[0].model, state=state, keys=[line.key for line in lines])

    async def _create(self, lines: list[Line]) -> tuple[Any, str | None]:
        """Ask for the batch. Where the API has a free first step (OpenAI's
        upload), the keys are recorded under it before the paid step: a run
        killed in between finds the batch by it. Returns (BatchInfo, the
        provisional ledger id or None)."""
        bodies = [line.body for line in lines]
        handle = await self.api.prepare(bodies)
        intent = None
        if handle is not None and self.ledger is not None:
            intent = PROVISIONAL + handle
            await self._record(intent, "creating", lines)
        try:
            return await self.api.create(handle, bodies), intent
        except ProviderError as exc:
            if intent is not None and exc.status is not None:  # the server refused: no batch was made
                await self.ledger.forget(intent)  # type: ignore[union-attr]  # intent implies a ledger
            raise

    async def _submit(self, queue: str, lines: list[Line]) -> None:
        load = await self._queue_room(queue, len(lines), sum(line.tokens for line in lines))
        started = time.monotonic()
        try:
            info, intent = await self._create(lines)
        except BaseException as exc:
            self.queue_release(load)
            if not isinstance(exc, Exception):  # cancelled: an intent stays, for a rerun to look for
                raise
            self.fail(lines, exc if isinstance(exc, ProviderError) else exception_error(
                exc, endpoint=self.name, timeout=self.spec.timeout, secret=None))
            return
        if self.ledger is not None:
            try:  # recorded before anything waits on it
                if intent is not None:
                    await self.ledger.rename(intent, info.id, info.status)
                else:
                    await self._record(info.id, info.status, lines)
            except Exception as exc:  # noqa: BLE001 -- the run still waits for it; a rerun could not resume it
                log.exception("endpoint %s: could not record batch %s", self.name, info.id)
                self.host.notice(f"{self.name}: could not record batch {info.id} in the cache ({exc}); "
                                 f"this run still waits for it", key=("ledger", self.name))
        self.submitted += 1
        self.batched += len(lines)
        self.host.notice(f"{self.name}: submitted batch {info.id} ({len(lines)} requests)",
                         key=("submitted", info.id))
        self.waiting.watch(Watch(info.id, {line.key: line for line in lines}, started, load=load), info)


class BatchWaiting:
    """The batches one batching provider waits on."""

    def __init__(self, provider: BatchingProvider):
        self.p = provider
        self.watches: dict[str, Watch] = {}
        self.resumed_ids: set[str] = set()  # recorded batches polled again instead of submitting their calls

    @property
    def resumed(self) -> int:
        return len(self.resumed_ids)

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
            # A line that attaches after the batch's first harvest (its key still
            # owed) waits on the same batch again: one batch resumed, not two.
            self.resumed_ids.add(batch_id)
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
                if not await self._may_retry(watch, exc, failures):
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

    async def _may_retry(self, watch: Watch, exc: ProviderError, failures: int) -> bool:
        """After the `failures`-th failed poll or download in a row: True to
        try again; False when the batch's calls were failed instead (a 404:
        the batch is gone and its calls go out again; a final error, or too
        many failures: they fail with it)."""
        if exc.status == 404:
            await self._gone(watch, exc)
            return False
        if not exc.retryable or failures >= POLL_FAILURES:
            self._fail_watch(watch, exc)
            return False
        return True

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
                if not await self._may_retry(watch, exc, failures):
                    return None
                await asyncio.sleep(min(p.options.poll_first * failures, p.options.poll_max))

    async def _harvest(self, watch: Watch, info: BatchInfo) -> None:
        watch.harvesting = True
        results = await self._results(watch, info)
        if results is None:
            return
        handled: set[str] = set()
        matcher = Matcher(self.p.name, info, results)  # keyless results: engine/batch_matching.py
        while True:  # lines attached while this harvest awaited are answered from the same results
            todo = [line for key, line in watch.lines.items() if key not in handled]
            if not todo:
                break
            handled.update(line.key for line in todo)
            await self._answer(watch, cast("list[tuple[Line, LineResult]]", matcher.answers(todo, self._missing(info))))
        if (said := matcher.notice()) is not None:
            self.p.host.notice(said, key=("unmatched", watch.id))

    async def _answer(self, watch: Watch, answers: list[tuple[Line, LineResult]]) -> None:
        p = self.p
        failed = [line.key for line, answer in answers if isinstance(answer, ProviderError)]
        if failed and p.ledger is not None:  # out of the ledger first: their retry is a new batch
            await p.ledger.settled(watch.id, failed)
        delivered = [line.key for line, answer in answers if p.deliver(line, answer) and isinstance(answer, ChatResult)]
        # The callers take their results (the engine hands each to the cache in that step), then
        # the cache commits them; only then does the ledger forget them, and only those the cache
        # holds (else a rerun harvests them again). Lines nobody took any more stay owed.
        await asyncio.sleep(0)
        if delivered and p.ledger is not None and await p.host.committed():
            await p.ledger.settled_stored(watch.id, delivered)


class Parking:
    """Requests waiting on calls a provider holds in a queue of its own (a
    batch): the engine's pull window does not count them, up to MAX_REQUESTS
    and MAX_CHARS of prompt, so a whole round of calls reaches one batch
    instead of a window's worth (the batch goes out once the streams stop
    feeding it). The holder (engine/call.py `CallHolder`) of every call a
    batching provider holds: each call record tells it when a request starts
    or stops waiting on the call (a new call, one joined, settled, or its
    stream ended); the engine reads `room()` through `Batching.room`."""

    MAX_REQUESTS = 100_000
    MAX_CHARS = 512_000_000

    __slots__ = ("requests", "chars")

    def __init__(self) -> None:
        self.requests = 0
        self.chars = 0

    def waiting(self, request: Request, sign: int) -> None:
        """`request` waits on a held call (sign 1), or no longer (-1)."""
        self.requests += sign
        self.chars += sign * request_chars(request)

    def room(self) -> tuple[int, int]:
        """(requests, prompt characters) the pull window may hold beyond its own."""
        if not self.requests:
            return 0, 0
        return min(self.requests, self.MAX_REQUESTS), min(self.chars, self.MAX_CHARS)
