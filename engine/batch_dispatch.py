"""Batch dispatch: an endpoint's chat calls sent through the provider's batch
API (`tulving run --batch`) instead of one by one.

`BatchEndpoint` takes the place of `EndpointState` (engine/dispatch.py) for an
endpoint of kind openai or anthropic when the engine runs in batch mode. It
is one: pools push calls to it and it reports every line through the same
typed `CallOwner.attempt_done`, so the engine counts, caches, retries and
settles batch lines exactly like direct attempts (results land under the same
cache keys). Calls it cannot batch (embeddings) go direct, through the
inherited dispatcher.

Life of a batch:
1. Gather: chat calls pushed to its pools are taken at once (`wake`). The
   batch goes out once the stream stops feeding it -- no stream is pulling
   requests and nothing came for QUIET_IDLE seconds, or nothing came for
   QUIET_MAX seconds whatever the streams do -- or a limit is reached. (The
   engine's pull window does not count calls held for a batch, so a whole
   round reaches one batch.)
2. Resume: keys that a batch recorded in the ledger (cache/batches.py) still
   owes are not submitted again: their batch is polled instead. That is how a
   killed run, rerun, pays for nothing twice.
3. Submit: by model where the API wants one model per batch, split at the
   API's request-count and size limits; each call's worst case is admitted
   and reserved under `--max-cost` at the batch price; the batch's id and keys
   are recorded in the ledger before anything waits on it.
4. Poll with backoff (options `batch_poll`, first wait in seconds, default 10,
   growing x1.5 up to `batch_poll_max`, default 300), a notice while waiting.
5. Harvest: each line is reported as an attempt (a result at the batch price,
   or its classified error); failed lines leave the ledger before they are
   reported, so the retry policy sends them again in the next batch; results
   leave it once the cache has committed them.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from cache.batches import BatchLedger
from engine.budget import Budget
from engine.dispatch import AttemptOutcome, CallOwner, EndpointState, Job, check_usage
from engine.resolve import Resolved
from engine.warmup import marked
from providers.base import (
    BAD_REPLY,
    BAD_REQUEST,
    RATE_LIMITED,
    ChatResult,
    EndpointSpec,
    Provider,
    ProviderError,
)
from providers.batch_api import BatchApi, BatchInfo, LineResult, cancelled_error, expired_error
from providers.http_errors import exception_error
from providers.kinds import batch_capable, opt_float, opt_int

log = logging.getLogger(__name__)

QUIET_IDLE = 0.05     # s without a new call, once no stream is pulling requests: submit
QUIET_MAX = 2.0       # s without a new call, whatever the streams do: submit
POLL_FIRST = 10.0     # s before the first poll (endpoint option batch_poll)
POLL_MAX = 300.0      # longest wait between polls (batch_poll_max)
POLL_GROWTH = 1.5
POLL_FAILURES = 8     # failed polls (or result downloads) in a row before the batch's calls fail
NOTICE_EVERY = 30.0   # s between two "waiting for batch" lines
HARVEST_GRACE = 30.0  # s a closing engine waits for a harvest under way
QUEUE_FULL_WAIT = 60.0  # s before a batch refused for the account's queue limit (token_limit_exceeded) is sent again
PROVISIONAL = "pending:"  # ledger id of a batch asked for whose id is not known yet (+ the prepare handle)
SIZE_MARGIN = 4096    # bytes kept free under an API's size limit (the file's or body's own framing)


def batch_endpoint(r: Resolved) -> str | None:
    """The endpoint whose batch API a resolved call goes through in batch
    mode, or None when it goes direct (embeddings, other endpoint kinds,
    `options.batch = false`). What `--dry-run` counts."""
    if r.messages is None:
        return None
    return next((spec.name for spec in r.endpoints if batch_capable(spec)), None)


class BatchOwner(CallOwner, Protocol):
    """The engine, as a batch dispatcher sees it (engine/scheduler.py)."""

    def feeding(self) -> bool:
        """Whether a stream is pulling requests right now (more may come)."""

    async def stored(self) -> bool:
        """Wait until every reply reported so far is committed to the cache;
        False when some may not have been (no cache, or it was closing)."""


@dataclass(eq=False)
class _Watch:
    """One batch being waited on, and the calls waiting on it, by key."""

    id: str
    jobs: dict[str, Job] = field(default_factory=dict)
    started: float = 0.0       # time.monotonic() when it was submitted (or resumed)
    task: asyncio.Task[None] | None = None
    harvesting: bool = False   # its results are being handed over: let it finish
    load: tuple[str, int, int] | None = None  # (queue, requests, prompt tokens) it holds in the batch queue


class BatchEndpoint(EndpointState):
    """An endpoint whose chat calls go by batch (see the module docstring)."""

    def __init__(self, spec: EndpointSpec, provider: Provider, owner: BatchOwner, budget: Budget | None,
                 api: BatchApi, ledger: BatchLedger | None):
        super().__init__(spec, provider, owner, budget)
        self.batch_owner = owner
        self.api = api
        self.ledger = ledger
        self.poll_first = opt_float(spec, "batch_poll") or POLL_FIRST
        self.poll_max = max(self.poll_first, opt_float(spec, "batch_poll_max") or POLL_MAX)
        # The account's batch queue (OpenAI: enqueued prompt tokens per model; Anthropic: requests in
        # queue): batches beyond it wait for earlier ones to end rather than be refused.
        self.queue_requests = opt_int(spec, "batch_queue_requests")
        self.queue_tokens = opt_int(spec, "batch_queue_tokens")
        self._queued: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # queue -> [requests, tokens] in batches
        self._queue_freed = asyncio.Event()
        self._gathered: list[Job] = []
        self._gathered_at = 0.0
        self._gather_event = asyncio.Event()
        self._watches: dict[str, _Watch] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.submitted = 0     # batches this process created
        self.resumed = 0       # recorded batches it polled again instead of submitting their calls
        self.batched = 0       # calls sent in batches it created

    # -- gathering ----------------------------------------------------------------------
    def wake(self) -> None:
        self._collect()
        super().wake()

    def _collect(self) -> None:
        """Take every chat call waiting in the pools; the rest (embeddings)
        stays for the direct dispatcher."""
        took = False
        for pool in self.pools:
            heap = pool.heap
            if not any(job.resolved.messages is not None for job in heap):
                continue
            kept = []
            for job in heap:
                if job.cancelled:
                    continue
                if job.resolved.messages is not None:
                    self._gathered.append(job)
                    took = True
                else:
                    kept.append(job)
            heapq.heapify(kept)
            pool.heap = kept
        if took:
            self._gathered_at = time.monotonic()
            self._gather_event.set()

    def start(self) -> None:
        super().start()
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._gather_loop(),
                                                                     name=f"batch:{self.name}")

    async def stop(self) -> None:
        """Stop waiting. Batches still running stay recorded in the ledger: a
        rerun polls them again. A harvest under way finishes first (its last
        step, the ledger forgetting the keys stored, comes after the calls
        were settled)."""
        finishing = [w.task for w in self._watches.values() if w.harvesting and w.task is not None]
        if finishing:
            await asyncio.wait(finishing, timeout=HARVEST_GRACE)
        tasks = [t for t in (self._loop_task, *self._tasks, *(w.task for w in self._watches.values()))
                 if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop_task = None
        await super().stop()
        try:
            await self.api.aclose()
        except Exception:  # noqa: BLE001 -- closing must not mask the run's outcome
            pass

    def _spawn(self, coro: object, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _gather_loop(self) -> None:
        while True:
            await self._gather_event.wait()
            full = self.api.max_requests
            while len(self._gathered) < full:
                quiet = time.monotonic() - self._gathered_at
                if quiet >= QUIET_MAX or quiet >= QUIET_IDLE and not self.batch_owner.feeding():
                    break
                await asyncio.sleep(QUIET_IDLE)
            if len(self._gathered) >= full:  # a full batch goes now; the rest keeps gathering
                cut = len(self._gathered) // full * full
                jobs, self._gathered = self._gathered[:cut], self._gathered[cut:]
                if not self._gathered:
                    self._gather_event.clear()
            else:
                self._gather_event.clear()
                jobs, self._gathered = self._gathered, []
            try:
                await self._send(jobs)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- a bug here settles the calls, never hangs them
                log.exception("endpoint %s: sending a batch failed", self.name)
                error = ProviderError(BAD_REPLY, f"engine error while batching: {type(exc).__name__}: {exc}")
                for job in jobs:
                    if job.waiters and not any(job in w.jobs.values() for w in self._watches.values()):
                        self._release(job)
                        self._report(job, AttemptOutcome(error=error, sent=False, final=True))

    # -- submitting ----------------------------------------------------------------------
    async def _send(self, jobs: list[Job]) -> None:
        jobs = [job for job in jobs if not job.cancelled]
        if not jobs:
            return
        owed = await self.ledger.owing(self.name, [job.resolved.key for job in jobs]) if self.ledger else {}
        groups: dict[str, list[tuple[Job, bytes]]] = defaultdict(list)
        for job in jobs:
            r = job.resolved
            batch_id = owed.get(r.key)
            if batch_id is not None:
                self._attach(batch_id, job)
                continue
            refusal = self.budget.admit(r.alias, job.input_estimate, job.output_estimate, batch=True)
            if refusal is not None:  # over budget: settled without a call
                self._report(job, AttemptOutcome(error=refusal, sent=False, final=True))
                continue
            assert r.messages is not None  # only chat calls are gathered
            messages: Sequence[Mapping[str, Any]] = r.messages
            if r.prefix_end is not None and self.provider.caches_prompt_prefix:
                messages = marked(messages, r.prefix_end)  # where the prompt cache ends, as a direct call marks it
            try:
                line = self.api.line(r.key, r.alias.model, messages, r.params)
            except (TypeError, ValueError) as exc:  # a parameter JSON cannot hold: this call alone fails
                self._report(job, AttemptOutcome(error=ProviderError(BAD_REQUEST, f"{self.name}: cannot write "
                                                                                  f"the batch line: {exc}"),
                                                 sent=False, final=True))
                continue
            job.cost_reserved = self.budget.reserve(r.alias, job.input_estimate, job.output_estimate, batch=True)
            groups[r.alias.model if self.api.one_model_per_batch else ""].append((job, line))
        for queue, lines in groups.items():
            for chunk in self._split(lines):
                self._spawn(self._submit(queue, chunk), f"batch-submit:{self.name}")

    def _split(self, lines: list[tuple[Job, bytes]]) -> list[list[tuple[Job, bytes]]]:
        """Consecutive chunks within the API's request-count and size limits
        and the endpoint's batch queue."""
        chunks: list[list[tuple[Job, bytes]]] = []
        chunk: list[tuple[Job, bytes]] = []
        size = tokens = 0
        max_requests = min(self.api.max_requests, self.queue_requests or self.api.max_requests)
        for item in lines:
            n, t = len(item[1]) + 1, item[0].input_estimate
            if chunk and (len(chunk) >= max_requests or size + n > self.api.max_bytes - SIZE_MARGIN
                          or self.queue_tokens is not None and tokens + t > self.queue_tokens):
                chunks.append(chunk)
                chunk, size, tokens = [], 0, 0
            chunk.append(item)
            size += n
            tokens += t
        if chunk:
            chunks.append(chunk)
        return chunks

    async def _queue_room(self, queue: str, requests: int, tokens: int) -> tuple[str, int, int]:
        """Wait until the batch queue has room for this batch (always when
        none of ours is in it), then hold its load there."""
        held = self._queued[queue]
        while held[0] and (self.queue_requests is not None and held[0] + requests > self.queue_requests
                           or self.queue_tokens is not None and held[1] + tokens > self.queue_tokens):
            self.owner.notice(f"{self.name}: batch queue full ({held[0]} requests, {held[1]} prompt tokens in "
                              f"batches); the next batch waits for one to end", key=("queue", self.name))
            self._queue_freed.clear()
            await self._queue_freed.wait()
        held[0] += requests
        held[1] += tokens
        return queue, requests, tokens

    def _queue_release(self, load: tuple[str, int, int] | None) -> None:
        if load is not None:
            held = self._queued[load[0]]
            held[0] -= load[1]
            held[1] -= load[2]
            self._queue_freed.set()

    async def _submit(self, queue: str, chunk: list[tuple[Job, bytes]]) -> None:
        load = await self._queue_room(queue, len(chunk), sum(job.input_estimate for job, _ in chunk))
        started = time.monotonic()
        lines = [line for _, line in chunk]
        jobs = {job.resolved.key: job for job, _ in chunk}
        first = chunk[0][0].resolved
        intent = None
        try:
            # Where the API has a free first step (OpenAI's upload), the keys are recorded under it
            # before the paid step: a run killed in between finds the batch by it (`_adopt`).
            handle = await self.api.prepare(lines)
            if handle is not None and self.ledger is not None:
                intent = PROVISIONAL + handle
                await self.ledger.record(intent, endpoint=self.name, kind=self.spec.kind,
                                         base_url=first.endpoints[0].base_url, model=first.alias.model,
                                         state="creating", keys=list(jobs))
            info = await self.api.create(handle, lines)
        except BaseException as exc:
            self._queue_release(load)
            if not isinstance(exc, Exception):  # cancelled: an intent stays, for a rerun to look for
                raise
            if intent is not None and self.ledger is not None and isinstance(exc, ProviderError) \
                    and exc.status is not None:  # the server answered with a refusal: no batch was made
                await self.ledger.forget(intent)
            # classified: retried by the engine's policy, or final
            error = exc if isinstance(exc, ProviderError) else exception_error(
                exc, endpoint=self.name, timeout=self.spec.timeout, secret=None)
            for job, _ in chunk:
                self._line_done(job, error, started)
            return
        if self.ledger is not None:
            try:  # recorded before anything waits on it
                if intent is not None:
                    await self.ledger.rename(intent, info.id, info.status)
                else:
                    await self.ledger.record(info.id, endpoint=self.name, kind=self.spec.kind,
                                             base_url=first.endpoints[0].base_url, model=first.alias.model,
                                             state=info.status, keys=list(jobs))
            except Exception as exc:  # noqa: BLE001 -- the run still waits for it; a rerun could not resume it
                log.exception("endpoint %s: could not record batch %s", self.name, info.id)
                self.owner.notice(f"{self.name}: could not record batch {info.id} in the cache ({exc}); "
                                  f"this run still waits for it", key=("ledger", self.name))
        self.submitted += 1
        self.batched += len(jobs)
        self.owner.notice(f"{self.name}: submitted batch {info.id} ({len(jobs)} requests)",
                          key=("submitted", info.id))
        watch = _Watch(info.id, jobs, started, load=load)
        self._watches[info.id] = watch
        watch.task = self._spawn(self._wait(watch, info), f"batch-wait:{info.id}")

    def _attach(self, batch_id: str, job: Job) -> None:
        """Wait on a recorded batch for this call instead of sending it again."""
        watch = self._watches.get(batch_id)
        if watch is None:
            watch = self._watches[batch_id] = _Watch(batch_id, started=time.monotonic())
            self.resumed += 1
            self.owner.notice(f"{self.name}: resuming batch {batch_id} (submitted earlier)",
                              key=("resumed", batch_id))
            watch.task = self._spawn(self._wait(watch, None), f"batch-wait:{batch_id}")
        watch.jobs[job.resolved.key] = job

    # -- waiting and harvesting --------------------------------------------------------
    async def _adopt(self, watch: _Watch) -> BatchInfo | None:
        """A batch recorded under its provisional id (killed between asking
        for it and learning its id): find it and record its id, or, when it
        was never created, forget it and send its calls again."""
        handle = watch.id[len(PROVISIONAL):]
        try:
            info = await self.api.find(handle)
        except ProviderError as exc:
            self._fail_watch(watch, exc, retry=True)
            return None
        if info is None:
            if self.ledger is not None:
                await self.ledger.forget(watch.id)
            self._fail_watch(watch, ProviderError(BAD_REPLY, f"{self.name}: the batch of input {handle} was never "
                                                             f"created: sending its requests again"), retry=True)
            return None
        if self.ledger is not None:
            await self.ledger.rename(watch.id, info.id, info.status)
        if self._watches.get(watch.id) is watch:
            del self._watches[watch.id]
        watch.id = info.id
        self._watches.setdefault(info.id, watch)
        return info

    async def _wait(self, watch: _Watch, info: BatchInfo | None) -> None:
        delay = self.poll_first
        failures = 0
        try:
            if watch.id.startswith(PROVISIONAL):
                info = await self._adopt(watch)
                if info is None:
                    return
            while info is None or not info.ended:
                if info is not None:
                    await asyncio.sleep(delay)
                    delay = min(delay * POLL_GROWTH, self.poll_max)
                try:
                    info = await self.api.poll(watch.id)
                except ProviderError as exc:
                    failures += 1
                    if exc.status == 404:
                        await self._gone(watch, exc)
                        return
                    if exc.retryable and failures < POLL_FAILURES:
                        self.owner.notice(f"{self.name}: polling batch {watch.id} failed ({exc}); trying again",
                                          key=("poll-failed", watch.id))
                        if info is None:
                            await asyncio.sleep(delay)
                        continue
                    self._fail_watch(watch, exc, retry=False)
                    return
                failures = 0
                if self.ledger is not None:
                    await self.ledger.update(watch.id, info.status, dict(info.counts))
                if not info.ended:
                    done = sum(v for k, v in info.counts.items() if k not in ("total", "processing"))
                    total = info.counts.get("total") or (sum(info.counts.values()) if "processing" in info.counts
                                                         else 0)
                    waited = time.monotonic() - watch.started
                    self.owner.notice(f"waiting for batch {watch.id} on {self.name}: {info.status}"
                                      + (f", {done}/{total} done" if total else "")
                                      + f" ({waited:.0f} s so far)", key=("batch-wait", self.name),
                                      every=NOTICE_EVERY)
            await self._harvest(watch, info)
        finally:
            self._queue_release(watch.load)
            watch.load = None
            if self._watches.get(watch.id) is watch:
                del self._watches[watch.id]

    async def _gone(self, watch: _Watch, exc: ProviderError) -> None:
        """The provider no longer knows the batch or its results (deleted,
        results past their 29-30 days): forget it, send its calls again."""
        if self.ledger is not None:
            await self.ledger.forget(watch.id)
        self._fail_watch(watch, ProviderError(BAD_REPLY, f"{self.name}: batch {watch.id} or its results are gone "
                                                         f"({exc}): sending its requests again"), retry=True)

    def _fail_watch(self, watch: _Watch, error: ProviderError, *, retry: bool) -> None:
        for job in watch.jobs.values():
            if retry:
                self._line_done(job, error, watch.started)
            else:
                self._release(job)
                self._report(job, AttemptOutcome(error=error, started=watch.started, final=True))
        watch.jobs = {}

    def _missing(self, info: BatchInfo) -> ProviderError:
        """The error of a line an ended batch does not report."""
        if info.failure is not None:
            if "limit_exceeded" in info.failure:  # the account's batch queue is full: later, not never
                return ProviderError(RATE_LIMITED, f"{self.name}: batch {info.id} refused: {info.failure}",
                                     retry_after=QUEUE_FULL_WAIT)
            return ProviderError(BAD_REQUEST, f"{self.name}: batch {info.id} failed: {info.failure}")
        if info.status in ("cancelled", "canceled", "cancelling", "canceling") or info.counts.get("canceled"):
            return cancelled_error(self.name, info.id)
        if info.status == "expired" or info.counts.get("expired"):
            return expired_error(self.name, info.id)
        return ProviderError(BAD_REPLY, f"{self.name}: batch {info.id} ended without a result for this request")

    async def _harvest(self, watch: _Watch, info: BatchInfo) -> None:
        watch.harvesting = True
        failures = 0
        while True:
            try:
                results = await self.api.results(info)
                break
            except ProviderError as exc:
                failures += 1
                if exc.status == 404:
                    await self._gone(watch, exc)
                    return
                if not exc.retryable or failures >= POLL_FAILURES:
                    self._fail_watch(watch, exc, retry=False)
                    return
                await asyncio.sleep(min(self.poll_first * failures, self.poll_max))
        handled: set[str] = set()
        while True:  # calls attached while this harvest awaited are answered from the same results
            todo = [(key, job) for key, job in watch.jobs.items() if key not in handled]
            if not todo:
                return
            handled.update(key for key, _ in todo)
            lines: list[tuple[str, Job, LineResult]] = [(key, job, results.get(key) or self._missing(info))
                                                        for key, job in todo]
            failed = [item for item in lines if isinstance(item[2], ProviderError)]
            if failed and self.ledger is not None:  # out of the ledger first: their retry is a new batch
                await self.ledger.settled(watch.id, [key for key, _, _ in failed])
            for _, job, line in lines:
                self._line_done(job, line, watch.started)
            succeeded = [key for key, _, line in lines if not isinstance(line, ProviderError)]
            # In the cache before the ledger forgets them (else a rerun harvests them again).
            if succeeded and self.ledger is not None and await self.batch_owner.stored():
                await self.ledger.settled(watch.id, succeeded)

    def _release(self, job: Job) -> None:
        reserved, job.cost_reserved = job.cost_reserved, 0.0
        if reserved:
            self.budget.settle(reserved, job.resolved.alias, None, batch=True)

    def _line_done(self, job: Job, line: LineResult, started: float) -> None:
        """Report one line of a batch to the engine as one attempt of its call."""
        job.attempts += 1
        outcome = AttemptOutcome(started=started)
        reserved, job.cost_reserved = job.cost_reserved, 0.0
        try:
            if isinstance(line, ChatResult):
                outcome.usage = check_usage(line)
                outcome.result = line
            else:
                outcome.error = line
        except ProviderError as exc:
            outcome.error = exc
        try:
            outcome.cost = self.budget.settle(reserved, job.resolved.alias,
                                              outcome.result if outcome.usage else None, batch=True)
        except Exception as exc:  # noqa: BLE001 -- reported as the call's error, never a hang
            outcome = AttemptOutcome(error=exception_error(exc, endpoint=self.name, timeout=self.spec.timeout,
                                                           secret=None), started=started)
        if outcome.error is not None:
            outcome.result, outcome.usage = None, None
        self._report(job, outcome)
