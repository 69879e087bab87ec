"""The engine: turns a stream of requests into a stream of outcomes.

    async with Engine(config, cache_path="runs/cache.sqlite") as engine:
        async for outcome in engine.stream(requests):   # any (async) iterable
            ...                                          # outcomes in completion order
        outcomes = await engine.run(requests)            # list, in input order

For each request pulled (lazily, never more than `window` ahead of the
outcomes yielded): resolve the alias, look the cache up in batches, yield hits
at once, join an identical call already in flight, or queue a new call for the
alias's endpoints (engine/dispatch.py starts it when the endpoint's gate,
engine/gate.py, admits it).
A request's own switches (engine/requests.py): `stream` (the provider streams
the reply, when it can, and the result carries its timings), `cache_read=False`
(no lookup and no joining: a call of its own, which nobody joins either) and
`cache_write=False` (the reply is not stored). Each outcome of a call says how
long it was queued before its first send (`queued`) and when its last attempt
was sent (`sent_at`); one from the cache has neither, nor timings.
Whether a failed attempt is tried again, and when, is the endpoint's gate's
decision (engine/gate.py: 429s have their own allowance of attempts and a
capped wait; an endpoint whose calls keep failing for good is given up); the
engine only settles the calls the gate is done with (`attempt_done`): a call
that fails for good yields its error and the run goes on. Only successful
replies are cached, handed to the cache as results (the record format is the
cache's own).

Every call ends: whatever raises in an attempt's life (the provider, its
usage, pricing, the limiter, the cache hand-off, a retry timer), the endpoint
slot is released and the call settled with a classified error or queued again
(engine/dispatch.py `_attempt`, `_attempt_ended`, and `_after_attempt` as the
last guard; `attempt_done` here).

User errors stop the stream by raising `ConfigError` from it: an unknown model
alias, or an endpoint whose API key variable is unset (checked when the first
request for that endpoint is pulled, before anything is sent to it). Outcomes
already yielded stay yielded; calls still in flight for that stream are
cancelled. A caller that stops iterating early should close the stream
(`contextlib.aclosing(engine.stream(...))`) so its calls are cancelled at
once rather than when the generator is collected.

Memory stays bounded whatever the number of requests and of streams: at
most `window` requests per stream (default 2 x the concurrency of the
endpoints in use, 16..4096) and MAX_PENDING_CHARS prompt characters over all
the engine's streams (a run streams each model and mode apart: ten models
must not hold ten budgets of books) are held: pulled ahead of the outcomes
yielded, or waiting for the cache's writer (its backlog counts against the
same budget); and no more are pulled while the writer still holds more than
MAX_CACHE_BACKLOG_CHARS of request text to store. A stream with nothing
pending always pulls one request, so none starves.
Costs: `max_cost` (USD) refuses, with a "budget" error, any uncached call whose
worst-case cost (prompt estimate + max_tokens) would take spending plus the
calls in flight past it; cached requests still yield.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import shlex
import sys
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Hashable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cache.backend import ResponseStore, open_cache, open_spending_ledger
from engine import gc_tuning
from engine.batching_mode import Batching
from engine.budget import Budget
from engine.call import AttemptOutcome, Job, request_chars
from engine.config import Config
from engine.dispatch import EndpointState, Pool
from engine.gate import ENDPOINT_FAULTS
from engine.progress import RunProgress
from engine.requests import EmbedRequest, Outcome, Request, cached_outcome, output_tokens_allowed
from engine.resolve import Resolved, resolve_many
from engine.retry import RetryPolicy
from engine.spending_feed import SpendingFeed
from engine.warmup import MIN_PREFIX_CHARS, Warmup, prefix_chars, prefix_key, prefix_parts
from providers.base import BAD_REPLY, EndpointSpec, Provider, ProviderError, Result
from providers.kinds import make_provider

log = logging.getLogger(__name__)

# Tokens of chat formatting per message, added to the prompt estimate.
_PER_MESSAGE_TOKENS = 4
# Pulled-but-not-yielded requests: 2 x the concurrency of the endpoints in use,
# within these bounds.
MIN_WINDOW = 16
MAX_WINDOW = 4096
# Prompt characters held by pulled-but-not-yielded requests and by the cache
# writer's backlog (a book in context is ~4 MB per request): pulling pauses
# above this, down to one request. With a writer that keeps up (any real
# provider's latency) it all goes to requests pulled ahead, which bounds how
# many book-sized prompts are in flight at once.
MAX_PENDING_CHARS = 64_000_000
# Request text the cache's writer may have queued before pulling more requests waits for it.
MAX_CACHE_BACKLOG_CHARS = 64_000_000


@dataclass(slots=True)
class EngineStats:
    """Totals over the engine's life, for reports."""

    requests: int = 0          # outcomes yielded
    cache_hits: int = 0
    deduplicated: int = 0      # requests that joined an identical call in flight
    calls: int = 0             # attempts sent to providers
    retries: int = 0
    rate_limited: int = 0      # 429 replies received
    succeeded: int = 0         # calls that returned a result
    errors: Counter[str] = field(default_factory=Counter[str])  # final errors by kind
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0          # USD
    elapsed: float = 0.0       # seconds the engine has been open
    retry_after_capped: int = 0  # 429s whose retry-after exceeded the endpoint's max_retry_after
    cache_write_errors: int = 0  # replies the cache refused (see also the cache's own count)
    notices: list[str] = field(default_factory=list)  # the lines `Engine.notice` printed, latest last
    # Counted by the providers that hold calls (Batching.counters, engine/batching_mode.py):
    batches: int = 0           # provider batches submitted
    batches_resumed: int = 0   # batches recorded by an earlier run, polled again instead of submitting
    batched_calls: int = 0     # calls sent in the batches submitted
    # endpoint -> model -> the per-minute limits its provider reported in reply headers (dispatch.learn_limits)
    learned_limits: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["errors"] = {str(kind): n for kind, n in self.errors.items()}  # plain strings in JSON
        return d


def rerun_command() -> str:
    """What resumes this run: the command line, when it is the `tulving` command."""
    if Path(sys.argv[0]).name in ("tulving", "__main__.py") and len(sys.argv) > 1:
        return f"`{shlex.join(['tulving', *sys.argv[1:]])}`"
    return "the same command"


def _alive(job: Job) -> bool:
    return not job.cancelled


def _charge_warm_prefix(job: Job, provider: Provider) -> None:
    """A call whose prefix the provider's cache holds now: where the provider
    does not count cache reads toward its input-token limit (Anthropic), the
    rate limits are charged its prompt without that prefix."""
    r = job.resolved
    if provider.cache_reads_count_toward_limits or r.messages is None or r.prefix_end is None:
        return
    prefix = sum(provider.count_tokens(text) for _, text in prefix_parts(r.messages, r.prefix_end))
    job.charge_input(job.input_estimate - prefix)


def _copy_result(result: Result) -> Result:
    return dataclasses.replace(result)




def _chars_of(outcomes: list[Outcome]) -> int:
    return sum(request_chars(outcome.request) for outcome in outcomes)


def _drain(sink: asyncio.Queue[Outcome]) -> list[Outcome]:
    """Every outcome in `sink` now, in order."""
    return [sink.get_nowait() for _ in range(sink.qsize())]


class Engine:
    def __init__(self, config: Config, *, cache_path: str | None = None, progress: bool = False,
                 max_cost: float | None = None, window: int | None = None,
                 retry_policy: RetryPolicy | None = None, batch: bool = False, spent_before: float = 0.0,
                 spending_run: str | None = None, spending_label: str = ""):
        self.config = config
        self.cache_path = cache_path
        self.progress = progress
        self.max_cost = max_cost
        self.window = window
        self.retry_policy = retry_policy or RetryPolicy()
        self._cache: ResponseStore | None = None
        # Requests whose key another process has claimed (it pays; we wait for its result), by key.
        self._claimed_elsewhere: dict[str, list[tuple[Resolved, asyncio.Queue[Outcome], float]]] = {}
        self._claim_waits: set[asyncio.Task[None]] = set()
        self._endpoints: dict[str, EndpointState] = {}
        self._pools: dict[tuple[str, ...], Pool] = {}
        self._inflight: dict[str, Job] = {}
        self._seq = itertools.count()
        self._budget = Budget(max_cost, spent_before)  # spent_before: earlier invocations of a resumed run
        # `spending_run`: the run's key; what this invocation pays goes to the cache's spending ledger under it.
        self._spending_run, self._spending_label = spending_run, spending_label
        self._spending_feed: SpendingFeed | None = None
        self._stats = EngineStats()
        self._progress = RunProgress(enabled=progress, budget=self._budget)  # one line for the whole run
        self._heartbeat: asyncio.Future[None] | None = None  # the line's clock while nothing arrives
        self._opened_at = time.monotonic()
        self._closed = False
        self._did_nothing = False  # ended in an error before its first outcome
        self._gc_tuned = False
        self._notices: dict[Hashable, float] = {}
        self.rerun_command = rerun_command()  # said when an endpoint is down
        # `batch`: chat calls go through the batch API of endpoints whose kind
        # has one (engine/batching_mode.py chooses the provider of each endpoint).
        self.batch = batch
        self._batching: Batching | None = None
        self._pending_chars = 0     # prompt characters pulled by all streams and not yielded yet
        self._streams_open = 0      # streams of this engine, and how many of them wait for outcomes
        self._streams_waiting = 0
        self._warmup: Warmup[Job] = Warmup()  # calls sharing a prompt prefix wait for the first to warm the provider's cache

    # -- lifecycle -------------------------------------------------------------------
    async def __aenter__(self) -> Engine:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if exc[0] is not None:  # an error ends the run: it, not a final progress line, is what is printed last
            self._progress.abandon()
            # An error before the first outcome (a missing key): the invocation did nothing, and leaves no
            # entry in the spending ledger.
            self._did_nothing = self._stats.requests == 0
        await self.close()

    async def open(self) -> None:
        if not self._gc_tuned and not self._closed:
            gc_tuning.engine_opened()
            self._gc_tuned = True
        if self.cache_path is not None and self._cache is None:
            cache = open_cache(self.cache_path)
            try:
                await cache.open()
            except BaseException:  # `async with` will not call close(): undo the tuning here
                self._untune_gc()
                raise
            self._cache = cache
        if self._spending_run is not None and self.cache_path is not None and self._spending_feed is None:
            self._spending_feed = SpendingFeed(open_spending_ledger(self.cache_path), self._spending_run,
                                               self._budget, label=self._spending_label)
            self._spending_feed.start()
        if self.batch and self._batching is None:
            self._batching = Batching(self.cache_path if self._cache is not None else None, self)
        if self._progress.enabled and self._heartbeat is None:
            self._heartbeat = asyncio.ensure_future(self._progress.heartbeat())

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for wait in self._claim_waits:
            wait.cancel()
        self._claimed_elsewhere.clear()
        for job in list(self._inflight.values()):
            job.cancel()
        tasks = [j.task for j in self._inflight.values() if j.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._inflight.clear()
        for ep in self._endpoints.values():
            await ep.stop()
        for ep in self._endpoints.values():
            try:
                await ep.provider.aclose()
            except Exception:  # closing must not mask the run's own outcome
                pass
        if self._batching is not None:
            self._batching.close()
        try:
            if self._spending_feed is not None:  # every call settled by now: the invocation's last totals
                await self._spending_feed.close(failed=self._did_nothing)
            cache = self._cache
            if cache is not None:
                try:
                    await cache.flush()
                    await cache.close()
                finally:
                    self._cache = None
                    # Rows the writer could not store (disk full, read-only): the
                    # run must say so, or a rerun pays for them again unawares.
                    self._stats.cache_write_errors += cache.write_errors
        finally:
            if self._heartbeat is not None:
                self._heartbeat.cancel()
                self._heartbeat = None
            self._progress.close()  # the final line: total calls, cached hits and spend
            self._untune_gc()

    def _untune_gc(self) -> None:
        if self._gc_tuned:
            self._gc_tuned = False
            gc_tuning.engine_closed()

    @property
    def stats(self) -> EngineStats:
        stats = self._stats
        stats.elapsed = time.monotonic() - self._opened_at
        if self._batching is not None:
            counters = self._batching.counters()
            stats.batches, stats.batches_resumed = counters["batches"], counters["batches_resumed"]
            stats.batched_calls = counters["batched_calls"]
        endpoints = self._endpoints.values()
        stats.calls = sum(ep.attempts for ep in endpoints)
        stats.retries = sum(ep.gate.retries for ep in endpoints)
        stats.rate_limited = sum(ep.gate.rate_limited for ep in endpoints)
        stats.retry_after_capped = sum(ep.gate.retry_after_capped for ep in endpoints)
        stats.learned_limits = {name: {model: dict(rates) for model, rates in ep.learned_limits.items()}
                                for name, ep in self._endpoints.items() if ep.learned_limits}
        return stats

    def expect(self, calls: int) -> None:
        """Tell the progress line that `calls` more requests are planned (the
        run-wide total, known up front: streams that carry them pass no total)."""
        self._progress.expect(calls)

    # -- endpoints -------------------------------------------------------------------
    def _endpoint(self, spec: EndpointSpec) -> EndpointState:
        ep = self._endpoints.get(spec.name)
        if ep is None:
            key = self.config.api_key(spec)  # ConfigError naming the variable
            provider = make_provider(spec, key)
            if self._batching is not None:  # the one place a call's way is chosen: direct or by batch
                provider = self._batching.provider(provider, spec, key)
            ep = EndpointState(spec, provider, self, self._budget, self.retry_policy)
            self._endpoints[spec.name] = ep
            ep.start()
        return ep

    def _pool(self, r: Resolved) -> Pool:
        names = r.alias.endpoints  # a tuple of endpoint names
        pool = self._pools.get(names)
        if pool is None:
            pool = self._pools[names] = Pool([self._endpoint(e) for e in r.endpoints])
        return pool

    def _window_size(self) -> int:
        if self.window is not None:
            return max(1, self.window)
        slots = sum(ep.max_concurrency for ep in self._endpoints.values())
        return min(MAX_WINDOW, max(MIN_WINDOW, 2 * slots))

    # -- the stream ------------------------------------------------------------------
    async def stream(self, requests: Iterable[Request] | AsyncIterable[Request], *,
                     total: int | None = None, label: str = "") -> AsyncIterator[Outcome]:
        """Outcomes in completion order; pulls `requests` lazily."""
        if total is None and hasattr(requests, "__len__"):
            total = len(requests)  # type: ignore[arg-type]
        progress = self._progress
        progress.stream_opened(label, total)
        try:
            async with contextlib.aclosing(self._outcome_batches(requests)) as batches:
                async for batch in batches:
                    for outcome in batch:
                        yield self._counted(outcome, progress)
        finally:
            progress.stream_closed(label)

    async def _outcome_batches(self, requests: Iterable[Request] | AsyncIterable[Request]
                               ) -> AsyncGenerator[list[Outcome], None]:
        """What `stream` yields, a batch at a time (the outcomes of the calls
        ended so far, or of one lookup's hits), not counted yet: a cached
        rerun resumes this generator once per lookup, not once per request.
        No request is pulled until the caller has taken the batch before."""
        if self._closed:
            raise RuntimeError("engine is closed")
        is_async = isinstance(requests, AsyncIterable)
        source = requests.__aiter__() if isinstance(requests, AsyncIterable) else iter(requests)
        sink: asyncio.Queue[Outcome] = asyncio.Queue()
        pending = 0
        pending_chars = 0
        exhausted = False
        self._streams_open += 1
        try:
            while True:
                if not exhausted and sink.empty():
                    # the character budget is the engine's, over all its streams (one per model
                    # and mode in a run): each pulling its own would hold a share per stream
                    pulled = await self._refill(source, is_async, sink, pending, self._pending_chars)
                    if pulled is not None:
                        pending, pending_chars = pending + pulled[0], pending_chars + pulled[1]
                        exhausted, hits = pulled[2], pulled[3]
                        # Calls that ended during the lookup came first, then the hits
                        # (handed over here, not through the sink: no queue round trip).
                        if hits:
                            ended = _drain(sink)
                            done_chars = _chars_of(ended)
                            pending, pending_chars = pending - len(ended), pending_chars - done_chars
                            self._pending_chars -= done_chars
                            yield ended + hits if ended else hits
                        continue
                if pending == 0:
                    if exhausted:
                        break
                    continue
                if sink.empty():
                    self._streams_waiting += 1
                    try:
                        first = await sink.get()
                    finally:
                        self._streams_waiting -= 1
                    ended = [first, *_drain(sink)]
                else:
                    ended = _drain(sink)
                done_chars = _chars_of(ended)
                pending, pending_chars = pending - len(ended), pending_chars - done_chars
                self._pending_chars -= done_chars
                yield ended
        finally:
            self._streams_open -= 1
            self._pending_chars -= pending_chars
            self._abandon(sink)

    def _counted(self, outcome: Outcome, progress: RunProgress) -> Outcome:
        """An outcome about to be yielded, counted in the stats and the progress line."""
        stats = self._stats
        stats.requests += 1
        if outcome.cached:
            stats.cache_hits += 1
        elif outcome.error is not None:
            stats.errors[outcome.error.kind] += 1
        progress.advance(outcome)
        return outcome

    async def run(self, requests: Iterable[Request] | AsyncIterable[Request], *,
                  total: int | None = None, label: str = "", counted: bool = True) -> list[Outcome]:
        """All outcomes, in input order. `counted=False`: a probe (does this
        model answer at all?) that the engine's stats and the progress line
        leave out, so an expected failure is not a failed call of the run."""
        if total is None and hasattr(requests, "__len__"):
            total = len(requests)  # type: ignore[arg-type]
        if isinstance(requests, Sequence):
            # A list of distinct request objects (the usual case): each outcome
            # goes to its request's position, known before anything is pulled.
            position = {id(r): i for i, r in enumerate(requests)}
            if len(position) == len(requests):
                placed: list[Outcome | None] = [None] * len(requests)
                async with contextlib.aclosing(self._batches_of(requests, total, label, counted)) as batches:
                    async for batch in batches:
                        for outcome in batch:
                            placed[position[id(outcome.request)]] = outcome
                return placed  # type: ignore[return-value]
        return await self._run_numbered(requests, total, label, counted)

    def _batches_of(self, requests: Iterable[Request] | AsyncIterable[Request], total: int | None, label: str,
                    counted: bool) -> AsyncGenerator[list[Outcome], None]:
        return self._counted_batches(requests, total, label) if counted else self._outcome_batches(requests)

    async def _run_numbered(self, requests: Iterable[Request] | AsyncIterable[Request], total: int | None,
                            label: str, counted: bool = True) -> list[Outcome]:
        """`run` for any iterable: each request numbered as it is pulled."""
        # Input position by request object: an int, or a deque of them for an
        # object that comes more than once (no deque per request: run once each).
        order: dict[int, int | deque[int]] = {}
        counter = itertools.count()

        def number(r: Request) -> Request:
            index, seen = next(counter), order.get(id(r))
            if seen is None:
                order[id(r)] = index
            elif isinstance(seen, int):
                order[id(r)] = deque((seen, index))
            else:
                seen.append(index)
            return r

        async def anumbered(items: AsyncIterable[Request]) -> AsyncIterator[Request]:
            async for r in items:
                yield number(r)

        source = anumbered(requests) if isinstance(requests, AsyncIterable) else map(number, requests)
        slots: list[Outcome | None] = []
        async with contextlib.aclosing(self._batches_of(source, total, label, counted)) as batches:
            async for batch in batches:
                for outcome in batch:
                    seen = order.pop(id(outcome.request))
                    if isinstance(seen, int):
                        index = seen
                    else:
                        index = seen.popleft()
                        if seen:
                            order[id(outcome.request)] = seen
                    if index >= len(slots):
                        slots.extend([None] * (index + 1 - len(slots)))
                    slots[index] = outcome
        return slots  # type: ignore[return-value]

    async def _counted_batches(self, requests: Iterable[Request] | AsyncIterable[Request], total: int | None,
                               label: str) -> AsyncGenerator[list[Outcome], None]:
        """`_outcome_batches`, each outcome counted (what `stream` does, a batch at a time)."""
        progress = self._progress
        progress.stream_opened(label, total)
        counted = self._counted
        try:
            stats = self._stats
            async with contextlib.aclosing(self._outcome_batches(requests)) as batches:
                async for batch in batches:
                    hits = 0  # counted together: most of a cached rerun's outcomes
                    for outcome in batch:
                        if outcome.cached:
                            hits += 1
                        else:
                            counted(outcome, progress)
                    if hits:
                        stats.requests += hits
                        stats.cache_hits += hits
                        progress.advance_cached(hits)
                    yield batch
        finally:
            progress.stream_closed(label)

    async def _refill(self, source: AsyncIterator[Request] | Iterator[Request], is_async: bool, sink: asyncio.Queue[Outcome], pending: int,
                      pending_chars: int) -> tuple[int, int, bool, list[Outcome]] | None:
        """Pull the next requests and submit them when the window has room:
        (requests pending, their characters, exhausted, the outcomes of those
        the cache answered, which are not pending), or None when it has none."""
        window = self._window_size()
        # Calls sleeping before a retry do not hold the window: 30% of 429s
        # must not starve the endpoint of new calls; nor do the requests
        # waiting on calls their provider holds (a batch: Batching.room).
        held, held_chars = self._batching.room() if self._batching is not None else (0, 0)
        max_chars = MAX_PENDING_CHARS + held_chars
        retry_waiting = sum(ep.retry_waiting for ep in self._endpoints.values())
        room = window + min(retry_waiting, window) + held - pending
        # Prompts answered but not yet stored are held in memory as much as
        # those pulled ahead: the writer's backlog takes its share of the budget.
        cache = self._cache
        backlog = cache.backlog_chars if cache is not None else 0
        # Pull in batches (one cache lookup each), not one by one.
        if room < max(1, window // 4) or (pending_chars + backlog >= max_chars and pending != 0):
            return None
        # Nothing pending: wait for the writer when its backlog alone fills the budget.
        room_for_backlog = max(0, min(MAX_CACHE_BACKLOG_CHARS, max_chars - pending_chars - 1))
        if cache is not None and backlog > room_for_backlog:
            await cache.wait_for_room(room_for_backlog)
            backlog = cache.backlog_chars
        chunk, sizes, exhausted = await self._pull(source, is_async, room, max_chars - backlog)
        try:
            hits, hit_chars = await self._submit(chunk, sizes, sink) if chunk else ([], 0)
        except BaseException:
            self._pending_chars -= sum(sizes)  # never pending: the stream ends with the error
            raise
        self._pending_chars -= hit_chars  # answered by the cache: not pending
        return len(chunk) - len(hits), sum(sizes) - hit_chars, exhausted, hits

    async def _pull(self, source: AsyncIterator[Request] | Iterator[Request], is_async: bool, limit: int, max_chars: int
                    ) -> tuple[list[Request], list[int], bool]:
        """Up to `limit` requests while the engine's streams hold fewer than
        `max_chars` prompt characters (at least one); returns (requests, the
        characters of each, exhausted). Each is counted in the engine's
        pending characters as it is pulled: streams pulling at the same time
        (their pulls wait on the cache) see each other's at once."""
        chunk: list[Request] = []
        sizes: list[int] = []
        try:
            while len(chunk) < limit and (self._pending_chars < max_chars or not chunk):
                r = await source.__anext__() if is_async else next(source)  # type: ignore[union-attr,arg-type]  # is_async says which
                chunk.append(r)
                size = request_chars(r)
                sizes.append(size)
                self._pending_chars += size
        except (StopIteration, StopAsyncIteration):
            return chunk, sizes, True
        return chunk, sizes, False

    async def _submit(self, chunk: list[Request], sizes: list[int], sink: asyncio.Queue[Outcome]
                      ) -> tuple[list[Outcome], int]:
        """Queue, join or wait for each request of a pulled chunk (`sizes`: the
        characters of each); returns the outcomes of those the cache answered
        (the caller yields them) and their characters."""
        config = self.config
        taken = time.monotonic()  # the engine has the requests: their time queued starts
        resolved = resolve_many(config, chunk)  # ConfigError: unknown alias
        for r in resolved:  # missing keys fail before anything is queued
            for spec in r.endpoints:
                if spec.name not in self._endpoints:
                    self._endpoint(spec)
        inflight = self._inflight
        hits: dict[str, Result] = {}
        held: set[str] = set()  # keys another process is paying for
        if self._cache is not None:
            lookup = [r.key for r in resolved if r.key not in inflight and r.request.cache_read]
            if lookup:
                hits = await self._cache.get_many(lookup)
                held = await self._claim(self._cache, [k for k in lookup if k not in hits])
        new_waits = held - self._claimed_elsewhere.keys()
        answered: list[Outcome] = []
        answered_chars = 0
        for r, size in zip(resolved, sizes):
            if not r.request.cache_read:  # its own call: no cache, no joining (and nobody joins it)
                self._queue_new(r, sink, taken)
                continue
            hit = hits.get(r.key)
            if hit is not None:
                answered.append(cached_outcome(r.request, hit, r.key))
                answered_chars += size
                continue
            job = inflight.get(r.key)
            if job is not None:
                job.join(r.request, sink)
                self._stats.deduplicated += 1
                continue
            if r.key in held:
                self._wait_elsewhere(r, sink, taken)
                continue
            self._queue_new(r, sink, taken)
        if new_waits:
            self._start_claim_wait(new_waits)
        return answered, answered_chars

    # -- claims: calls another process sharing the cache is paying for -----------------
    async def _claim(self, cache: ResponseStore, misses: list[str]) -> set[str]:
        """Claim the misses (cache/backend.py): the keys held elsewhere (or
        already waited for here), whose results are to be waited for."""
        waited = self._claimed_elsewhere
        wanted = [k for k in dict.fromkeys(misses) if k not in waited]
        mine = await cache.claim(wanted) if wanted else set()
        return {k for k in misses if k not in mine}

    def _wait_elsewhere(self, r: Resolved, sink: asyncio.Queue[Outcome], taken: float) -> None:
        self._claimed_elsewhere.setdefault(r.key, []).append((r, sink, taken))

    def _start_claim_wait(self, keys: set[str]) -> None:
        """One task polls for the keys of one pulled chunk held elsewhere
        (keys already waited for by an earlier task are left to it)."""
        task = asyncio.ensure_future(self._await_claimed(list(keys)))
        self._claim_waits.add(task)
        task.add_done_callback(self._claim_waits.discard)

    async def _await_claimed(self, keys: list[str]) -> None:
        """Until another process's result for each key is cached (handed out
        as a hit) or its claim lapses and this process claims it (queued as a call)."""
        cache = self._cache
        assert cache is not None  # only keys claimed through a cache are waited for
        try:
            async for hits, mine in cache.wait_for(keys):
                for key, result in hits.items():
                    for i, (r, sink, _taken) in enumerate(self._claimed_elsewhere.pop(key, [])):
                        sink.put_nowait(Outcome(request=r.request, result=result if i == 0 else _copy_result(result),
                                                cached=True, key=key))
                for key in mine:  # the first queues the call, the others join it
                    waiting = self._claimed_elsewhere.pop(key, [])
                    for r, sink, taken in waiting:
                        self._submit_claimed(r, sink, taken)
                    if not waiting:  # nobody waits any more
                        cache.release([key])
        except Exception as exc:  # noqa: BLE001 -- the cache failed: pay rather than lose the requests
            log.warning("engine: waiting for calls another process makes failed (%s); making them here", exc)
            for key in keys:
                for r, sink, taken in self._claimed_elsewhere.pop(key, []):
                    self._submit_claimed(r, sink, taken)

    def _submit_claimed(self, r: Resolved, sink: asyncio.Queue[Outcome], taken: float) -> None:
        job = self._inflight.get(r.key)
        if job is None:
            self._queue_new(r, sink, taken)
        else:
            job.join(r.request, sink)
            self._stats.deduplicated += 1

    def _queue_new(self, r: Resolved, sink: asyncio.Queue[Outcome], taken: float) -> None:
        pool = self._pool(r)
        provider = pool.endpoints[0].provider
        if r.messages is not None:
            input_est = sum(provider.count_tokens(m["content"]) + _PER_MESSAGE_TOKENS for m in r.messages)
            output_est = output_tokens_allowed(r.params)
        else:
            request = r.request
            assert isinstance(request, EmbedRequest)  # no messages: an embedding request
            input_est = sum(provider.count_tokens(t) for t in request.texts)
            output_est = 0
        prompt = None
        if pool.prefix_order and r.messages is not None:
            prompt = tuple(itertools.chain.from_iterable((m["role"], m["content"]) for m in r.messages))
        # A call its provider holds in a queue of its own (a batch) gets no
        # warm-up call first (it would wait for the provider's whole queue);
        # the providers' prompt caches serve batches on a best-effort basis.
        holder = self._batching.holder(provider) if self._batching is not None and r.messages is not None else None
        job = Job(resolved=r, seq=next(self._seq), input_estimate=input_est, output_estimate=output_est,
                  prompt=prompt, waiters=[(r.request, sink)], pool=pool, taken_at=taken, holder=holder)
        # In flight under its cache key, for identical requests to join it;
        # one that reads no cache under a key of its own (nobody joins it).
        self._inflight[r.key if r.request.cache_read else f"{r.key}#{job.seq}"] = job
        if holder is None and r.prefix_end is not None and r.messages is not None and provider.caches_prompt_prefix and (
                prefix_chars(r.messages, r.prefix_end) >= MIN_PREFIX_CHARS):
            key = (r.alias.endpoints, prefix_key(r.alias.model, r.messages, r.prefix_end))
            if self._warmup.hold(job, key):
                return  # queued once the call warming its prefix has finished
            if self._warmup.is_warm(key):
                _charge_warm_prefix(job, provider)
        pool.push(job)

    def _warmed(self, job: Job, ok: bool, error: ProviderError | None = None) -> None:
        """A call ended for good: queue the calls its prefix held back (all of
        them when it succeeded; else the next, which warms it in its place).
        A call failed by a fault of the endpoint (engine/gate.py
        ENDPOINT_FAULTS) holds nothing back any more: its prefix cannot be
        warmed there now, and calls failing one after the other would only
        delay finding a dead endpoint by a whole allowance of attempts each."""
        held = self._warmup.finished(job, ok=ok, alive=_alive)
        if not ok and error is not None and error.kind in ENDPOINT_FAULTS:
            while held:  # each next one warms in the other's place: take them all
                nxt = held[0]
                self._pool(nxt.resolved).push(nxt)
                held = self._warmup.finished(nxt, ok=False, alive=_alive)
            return
        for nxt in held:
            pool = self._pool(nxt.resolved)
            if ok:  # its prefix is warm now
                _charge_warm_prefix(nxt, pool.endpoints[0].provider)
            pool.push(nxt)

    # -- for providers that hold calls (batching.BatchHost) ------------------------------
    def feeding(self) -> bool:
        """Whether a stream is pulling requests (not waiting for outcomes)."""
        return self._streams_open > self._streams_waiting

    async def committed(self) -> bool:
        """Every reply handed to the cache so far is committed. False when
        replies may have been left out (the engine closing stores none)."""
        if self._cache is None or self._closed:
            return False
        await self._cache.flush()
        return self._cache.write_errors == 0

    def _abandon(self, sink: asyncio.Queue[Outcome]) -> None:
        """The stream ended (normally, by an error, or the caller stopped
        early): drop its waiters and cancel calls nobody else waits for."""
        for key, waiting in list(self._claimed_elsewhere.items()):
            self._claimed_elsewhere[key] = [w for w in waiting if w[1] is not sink]
        for key, job in list(self._inflight.items()):
            if not job.leave(sink) or job.waiters:
                continue
            job.cancel()
            del self._inflight[key]
            if self._cache is not None:
                self._cache.release([job.resolved.key])
            self._warmed(job, ok=False)

    # -- called by the endpoint dispatchers (dispatch.CallOwner) -------------------------
    def attempt_done(self, ep: EndpointState, job: Job, outcome: AttemptOutcome) -> None:
        """A call the endpoint's gate is done with: count, cache and settle it
        (a result, a final error, or refused unsent). Whatever raises here
        still settles the call: never a hang."""
        try:
            if outcome.error is None and outcome.result is not None:
                assert outcome.usage is not None  # a reply without an error has its usage
                self._succeeded(ep, job, outcome.result, outcome.usage, outcome.cost)
            elif not job.cancelled:
                self._stats.cost += outcome.cost  # billed without an answer (ProviderError.billed): spent all the same
                self._settle(job, error=outcome.error, cost=outcome.cost, endpoint=ep.name if outcome.sent else None)
        except Exception as exc:  # noqa: BLE001 -- a broken step after the reply settles the call
            log.exception("engine: handling a reply from %s failed", ep.name)
            if not job.cancelled and job.waiters:
                if outcome.error is None and outcome.result is not None:
                    self._settle(job, result=outcome.result, cost=outcome.cost, endpoint=ep.name)
                else:
                    self._settle(job, error=ProviderError(BAD_REPLY, f"engine error after the reply: "
                                                                     f"{type(exc).__name__}: {exc}"),
                                 endpoint=ep.name)

    def _succeeded(self, ep: EndpointState, job: Job, result: Result, usage: tuple[int, int], cost: float) -> None:
        r = job.resolved
        stats = self._stats
        stats.succeeded += 1
        stats.tokens_in += usage[0]
        stats.tokens_out += usage[1]
        stats.cost += cost
        self._warmed(job, ok=True)
        if self._cache is not None and not self._closed and (  # paid for: keep it even if nobody waits
                r.request.cache_write or any(request.cache_write for request, _ in job.waiters)):
            try:
                self._cache.put(r.key, r.identity, result, canonical=r.canonical)  # ends its claim once stored
            except Exception as exc:  # noqa: BLE001 -- the answer stands; the failed write is reported
                self._cache.release([r.key])
                self._cache_put_failed(exc)
        elif self._cache is not None:
            self._cache.release([r.key])
        if not job.cancelled:
            self._settle(job, result=result, cost=cost, endpoint=ep.name)

    def _cache_put_failed(self, exc: BaseException) -> None:
        self._stats.cache_write_errors += 1
        self.notice(f"could not store a reply in the cache ({type(exc).__name__}: {exc})", key=("cache",))

    def notice(self, message: str, *, key: Hashable = None, every: float = 10.0, error: bool = False) -> None:
        """A line on stderr saying why the run waits or what went wrong,
        at most once per `every` seconds per `key`; with the progress line
        off (--quiet) only an `error` is printed."""
        now = time.monotonic()
        if key is not None:
            last = self._notices.get(key)
            if last is not None and now - last < every:
                return
            self._notices[key] = now
        self._stats.notices.append(message)
        if len(self._stats.notices) > 100:
            del self._stats.notices[:50]
        self._progress.notice(message, always=error)

    def _settle(self, job: Job, *, result: Result | None = None, error: ProviderError | None = None,
                cost: float = 0.0, endpoint: str | None = None) -> None:
        """Hand the call's outcome to every request waiting on it (once: a
        call already settled has no waiters left)."""
        key = job.resolved.key
        inflight = self._inflight
        if inflight.get(key) is job:
            del inflight[key]
        elif not job.resolved.request.cache_read:  # in flight under a key of its own (see _queue_new)
            inflight.pop(f"{key}#{job.seq}", None)
        self._warmed(job, ok=result is not None, error=error)
        if result is None and self._cache is not None and job.resolved.request.cache_read:
            self._cache.release([key])  # failed: another process may try it
        first = True
        sent = job.first_sent
        queued = None if sent is None or job.taken_at is None else sent - job.taken_at
        waiters = job.take_waiters()
        for request, sink in waiters:
            sink.put_nowait(Outcome(request=request, result=result if first or result is None else _copy_result(result),
                                    error=error, attempts=job.attempts, cost=cost if first else 0.0,
                                    endpoint=endpoint, key=key, joined=not first, queued=queued,
                                    sent_at=job.last_sent))
            first = False
