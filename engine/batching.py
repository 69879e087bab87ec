"""Batch mode (`tulving run --batch`): a provider whose chat calls go through
its kind's batch API (OpenAI Batch API, Anthropic Message Batches) instead of
one by one.

`BatchingProvider` wraps an endpoint's direct provider and its `BatchApi`
(providers/batch_api.py). As inspect_ai's `Batcher.generate_for_request`
does, its `chat()` puts the call into the batch being gathered and waits for
its line; embeddings go to the wrapped provider. The engine chooses it once,
when it builds an endpoint (`Batching.provider`); the dispatcher and the
scheduler see a provider that holds its calls in a queue of its own
(`Provider.holds_calls`: not paced by the endpoint's limits, not counted in
the engine's pull window) and results that say they came by batch
(`ChatResult.batched`: the budget prices them at the batch discount).

Life of a batch:
1. Gather: each call joins the batch being gathered (one line per cache key,
   whoever waits on it). The batch goes out once the streams stop feeding it
   -- no stream is pulling requests and nothing came for QUIET_IDLE seconds,
   or nothing came for QUIET_MAX seconds whatever the streams do -- or the
   API's request limit is reached.
2. Resume: keys that a batch recorded in the ledger (cache/batches.py) still
   owes are not submitted again: their batch is polled instead. That is how a
   killed run, rerun, pays for nothing twice.
3. Submit: by model where the API wants one model per batch, split at the
   API's request-count and size limits and the account's batch queue limits
   (`batch_queue_requests`, `batch_queue_tokens`: later batches wait for
   earlier ones to end); the batch's id and keys are recorded in the ledger
   before anything waits on it (engine/batching_wait.py polls and harvests).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

from cache.batches import BatchLedger
from cache.keys import request_key
from engine.batching_wait import POLL_FIRST, POLL_MAX, PROVISIONAL, BatchHost, BatchOptions, BatchWaiting, Line, Watch
from engine.dispatch import CALL_KEY
from engine.resolve import Resolved
from providers.base import (
    BAD_REPLY,
    BAD_REQUEST,
    CONFIG,
    ChatResult,
    EmbedResult,
    EndpointSpec,
    Provider,
    ProviderError,
)
from providers.batch_api import BatchApi, LineResult
from providers.batch_wires import batch_capable, make_batch_api
from providers.http_errors import exception_error

log = logging.getLogger(__name__)

QUIET_IDLE = 0.05     # s without a new call, once no stream is pulling requests: submit
QUIET_MAX = 2.0       # s without a new call, whatever the streams do: submit
SIZE_MARGIN = 4096    # bytes kept free under an API's size limit (the file's or body's own framing)
HARVEST_GRACE = 30.0  # s a closing provider waits for a harvest under way


def _count_option(spec: EndpointSpec, name: str) -> int | None:
    value = spec.options.get(name)
    if value is not None and (type(value) is not int or value < 1):
        raise ProviderError(CONFIG, f"endpoint {spec.name!r}: options.{name} must be a positive integer, "
                                    f"got {value!r}")
    return value


def _seconds_option(spec: EndpointSpec, name: str, default: float) -> float:
    value = spec.options.get(name, default)
    if type(value) not in (int, float) or not value > 0:
        raise ProviderError(CONFIG, f"endpoint {spec.name!r}: options.{name} must be a positive number of "
                                    f"seconds, got {value!r}")
    return float(value)


def batch_options(spec: EndpointSpec) -> BatchOptions:
    first = _seconds_option(spec, "batch_poll", POLL_FIRST)
    return BatchOptions(first, max(first, _seconds_option(spec, "batch_poll_max", POLL_MAX)),
                        _count_option(spec, "batch_queue_requests"), _count_option(spec, "batch_queue_tokens"))


def has_batch_api(spec: EndpointSpec) -> bool:
    """Whether `--batch` sends this endpoint's chat calls by batch."""
    return batch_capable(spec)


def _batch_api(spec: EndpointSpec, api_key: str | None) -> BatchApi | None:
    """The endpoint's batch API, or None (after the provider-kind registry:
    `providers.kinds.batch_api_for(spec, key)`)."""
    return make_batch_api(spec, api_key) if has_batch_api(spec) else None


def batch_endpoint(r: Resolved) -> str | None:
    """The endpoint whose batch API a resolved call goes through in batch
    mode, or None when it goes direct (embeddings, other endpoint kinds,
    `options.batch = false`). What `--dry-run` counts."""
    if r.messages is None:
        return None
    return next((spec.name for spec in r.endpoints if has_batch_api(spec)), None)


def _own_key(model: str, messages: Sequence[Mapping[str, Any]], params: Mapping[str, Any]) -> str:
    """A custom_id for a call made outside the engine (which passes the
    call's cache key in CALL_KEY)."""
    return request_key({"model": model, "messages": [dict(m) for m in messages], "params": dict(params)})


class BatchingProvider(Provider):
    """An endpoint's chat calls by batch (see the module docstring); the
    waiting side is `BatchWaiting` (engine/batching_wait.py)."""

    holds_calls = True
    can_stream = False

    def __init__(self, direct: Provider, api: BatchApi, options: BatchOptions, ledger: BatchLedger | None,
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
            quiet = time.monotonic() - self._gathered_at
            if quiet >= QUIET_MAX or quiet >= QUIET_IDLE and not self.host.feeding():
                return
            await asyncio.sleep(QUIET_IDLE)

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


class Batching:
    """Batch mode of one engine: the ledger in its cache file, and a
    batching provider for each endpoint whose kind has a batch API."""

    def __init__(self, cache_path: str | None, host: BatchHost):
        self.host = host
        self.ledger = BatchLedger(cache_path) if cache_path is not None else None
        self.providers: list[BatchingProvider] = []
        if self.ledger is None:
            host.notice("batch mode without a cache: the batches are not recorded, a killed run cannot resume "
                        "them", key=("batch-no-cache",))

    def provider(self, direct: Provider, spec: EndpointSpec, api_key: str | None) -> Provider:
        """The provider the endpoint's calls go through: `direct`, or the
        batching provider wrapping it."""
        api = _batch_api(spec, api_key)
        if api is None:
            return direct
        batching = BatchingProvider(direct, api, batch_options(spec), self.ledger, self.host)
        self.providers.append(batching)
        return batching

    def counters(self) -> dict[str, int]:
        """Batches submitted and resumed, and calls sent in them (EngineStats)."""
        return {"batches": sum(p.submitted for p in self.providers),
                "batches_resumed": sum(p.waiting.resumed for p in self.providers),
                "batched_calls": sum(p.batched for p in self.providers)}

    def close(self) -> None:
        """After the providers' aclose()."""
        if self.ledger is not None:
            self.ledger.close()
