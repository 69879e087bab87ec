"""The engine: turns a stream of requests into a stream of outcomes.

    async with Engine(config, cache_path="runs/cache.sqlite") as engine:
        async for outcome in engine.stream(requests):   # any (async) iterable
            ...                                          # outcomes in completion order
        outcomes = await engine.run(requests)            # list, in input order

For each request pulled (lazily, never more than `window` ahead of the
outcomes yielded): resolve the alias, look the cache up in batches, yield hits
at once, join an identical call already in flight, or queue a new call for the
alias's endpoints (engine/dispatch.py starts it under the endpoint's limits).
A failed attempt of a retryable kind is queued again after a backoff
(engine/retry.py); a call that fails for good yields its error and the run goes
on. Only successful replies are cached.

User errors stop the stream by raising `ConfigError` from it: an unknown model
alias, or an endpoint whose API key variable is unset (checked when the first
request for that endpoint is pulled, before anything is sent to it). Outcomes
already yielded stay yielded; calls still in flight for that stream are
cancelled. A caller that stops iterating early should close the stream
(`contextlib.aclosing(engine.stream(...))`) so its calls are cancelled at
once rather than when the generator is collected.

Memory stays bounded whatever the number of requests: at most `window`
requests (default 2 x the concurrency of the endpoints in use, 16..4096) and
MAX_PENDING_CHARS prompt characters are pulled ahead of the outcomes yielded,
and no more are pulled while the cache's writer still holds more than
MAX_CACHE_BACKLOG_CHARS of request text to store.
Costs: `max_cost` (USD) refuses, with a "budget" error, any uncached call whose
worst-case cost (prompt estimate + max_tokens) would take spending plus the
calls in flight past it; cached requests still yield.
"""
from __future__ import annotations

import asyncio
import itertools
import operator
import time
from collections import Counter, defaultdict, deque
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterable, AsyncIterator, Iterable

import aiohttp

from engine import gc_tuning
from engine.config import Config
from engine.dispatch import EndpointState, Job, Pool
from engine.progress import Progress
from engine.requests import ChatRequest, Outcome, Request
from providers.base import ChatResult, EmbedResult, Result
from engine.resolve import Resolved, resolve_many
from engine.retry import RetryPolicy
from providers import make_provider
from providers.base import BAD_REPLY, BUDGET, CONNECTION, TIMEOUT, EndpointSpec, ProviderError

# Output tokens reserved for a call that sets no max_tokens (reasoning models).
DEFAULT_OUTPUT_RESERVE = 4096
# Tokens of chat formatting per message, added to the prompt estimate.
_PER_MESSAGE_TOKENS = 4
# Pulled-but-not-yielded requests: 2 x the concurrency of the endpoints in use,
# within these bounds.
MIN_WINDOW = 16
MAX_WINDOW = 4096
# Prompt characters held by pulled-but-not-yielded requests (a book in context
# is ~4 MB per request): pulling pauses above this, down to one request.
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
    errors: Counter = field(default_factory=Counter)  # final errors by kind
    tokens_in: int = 0
    tokens_out: int = 0
    cost: float = 0.0          # USD
    elapsed: float = 0.0       # seconds the engine has been open

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["errors"] = dict(self.errors)
        return d


# -- cache records ---------------------------------------------------------------

def result_to_record(result: Result) -> dict[str, Any]:
    """The cache's response: the result's fields (an embedding has `vectors`)."""
    if isinstance(result, ChatResult):
        return {"text": result.text, "finish_reason": result.finish_reason,
                "input_tokens": result.input_tokens, "output_tokens": result.output_tokens,
                "latency": result.latency, "request_id": result.request_id}
    return {"vectors": result.vectors, "input_tokens": result.input_tokens,
            "latency": result.latency, "request_id": result.request_id}


def result_from_record(record: dict[str, Any]) -> Result:
    if "vectors" in record:
        return EmbedResult(vectors=record["vectors"], input_tokens=record.get("input_tokens", 0),
                           latency=record.get("latency", 0.0), request_id=record.get("request_id"))
    return ChatResult(text=record["text"], finish_reason=record.get("finish_reason", "stop"),
                      input_tokens=record.get("input_tokens", 0), output_tokens=record.get("output_tokens", 0),
                      latency=record.get("latency", 0.0), request_id=record.get("request_id"))


def _copy_result(result: Result) -> Result:
    if isinstance(result, ChatResult):
        return ChatResult(result.text, result.finish_reason, result.input_tokens, result.output_tokens,
                          result.latency, result.request_id)
    return EmbedResult(result.vectors, result.input_tokens, result.latency, result.request_id)


_content = operator.itemgetter("content")


def _request_chars(request: Request) -> int:
    if isinstance(request, ChatRequest):
        return sum(map(len, map(_content, request.messages)))
    return sum(map(len, request.texts))


def _as_provider_error(exc: BaseException, timeout: float) -> ProviderError:
    """A provider broke its contract by raising something else: classify it."""
    if isinstance(exc, TimeoutError):
        return ProviderError(TIMEOUT, f"no reply within {timeout:g} s")
    if isinstance(exc, (aiohttp.ClientError, OSError)):
        return ProviderError(CONNECTION, f"{type(exc).__name__}: {exc}")
    return ProviderError(BAD_REPLY, f"provider raised {type(exc).__name__}: {exc}")


class Engine:
    def __init__(self, config: Config, *, cache_path: str | None = None, progress: bool = False,
                 max_cost: float | None = None, window: int | None = None,
                 retry_policy: RetryPolicy | None = None):
        self.config = config
        self.cache_path = cache_path
        self.progress = progress
        self.max_cost = max_cost
        self.window = window
        self.retry_policy = retry_policy or RetryPolicy()
        self._cache = None
        self._endpoints: dict[str, EndpointState] = {}
        self._pools: dict[tuple[str, ...], Pool] = {}
        self._inflight: dict[str, Job] = {}
        self._seq = itertools.count()
        self._spent = 0.0
        self._reserved_cost = 0.0
        self._stats = EngineStats()
        self._opened_at = time.monotonic()
        self._closed = False
        self._timers: set[asyncio.TimerHandle] = set()
        self._gc_tuned = False

    # -- lifecycle -------------------------------------------------------------------
    async def __aenter__(self) -> "Engine":
        await self.open()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def open(self) -> None:
        if not self._gc_tuned and not self._closed:
            gc_tuning.engine_opened()
            self._gc_tuned = True
        if self.cache_path is not None and self._cache is None:
            from cache.store import ResponseCache

            cache = ResponseCache(self.cache_path)
            try:
                await cache.open()
            except BaseException:  # `async with` will not call close(): undo the tuning here
                self._untune_gc()
                raise
            self._cache = cache

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for timer in self._timers:
            timer.cancel()
        for job in list(self._inflight.values()):
            job.cancelled = True
            if job.task is not None:
                job.task.cancel()
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
        try:
            if self._cache is not None:
                await self._cache.flush()
                await self._cache.close()
                self._cache = None
        finally:
            self._untune_gc()

    def _untune_gc(self) -> None:
        if self._gc_tuned:
            self._gc_tuned = False
            gc_tuning.engine_closed()

    @property
    def stats(self) -> EngineStats:
        self._stats.elapsed = time.monotonic() - self._opened_at
        return self._stats

    # -- endpoints -------------------------------------------------------------------
    def _endpoint(self, spec: EndpointSpec) -> EndpointState:
        ep = self._endpoints.get(spec.name)
        if ep is None:
            key = self.config.api_key(spec)  # ConfigError naming the variable
            ep = EndpointState(spec, make_provider(spec, key), self)
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
        if self._closed:
            raise RuntimeError("engine is closed")
        if total is None and hasattr(requests, "__len__"):
            total = len(requests)  # type: ignore[arg-type]
        is_async = hasattr(requests, "__aiter__")
        source = requests.__aiter__() if is_async else iter(requests)  # type: ignore[union-attr]
        sink: asyncio.Queue[Outcome] = asyncio.Queue()
        progress = Progress(enabled=self.progress, total=total, label=label, stats=self._stats)
        stats = self._stats
        pending = 0
        pending_chars = 0
        exhausted = False
        try:
            while True:
                if not exhausted and sink.empty():
                    window = self._window_size()
                    room = window - pending
                    # Pull in batches (one cache lookup each), not one by one.
                    if room >= max(1, window // 4) and (pending_chars < MAX_PENDING_CHARS or pending == 0):
                        cache = self._cache
                        if cache is not None and cache.backlog_chars > MAX_CACHE_BACKLOG_CHARS:
                            await cache.wait_for_room(MAX_CACHE_BACKLOG_CHARS)
                        chunk, chars, exhausted = await self._pull(source, is_async, room,
                                                                   MAX_PENDING_CHARS - pending_chars)
                        if chunk:
                            pending += len(chunk)
                            pending_chars += chars
                            await self._submit(chunk, sink)
                        continue
                if pending == 0:
                    if exhausted:
                        break
                    continue
                outcome = sink.get_nowait() if not sink.empty() else await sink.get()
                pending -= 1
                pending_chars -= _request_chars(outcome.request)
                stats.requests += 1
                if outcome.cached:
                    stats.cache_hits += 1
                elif outcome.error is not None:
                    stats.errors[outcome.error.kind] += 1
                progress.advance(outcome)
                yield outcome
        finally:
            progress.close()
            self._abandon(sink)

    async def run(self, requests: Iterable[Request] | AsyncIterable[Request], *,
                  total: int | None = None, label: str = "") -> list[Outcome]:
        """All outcomes, in input order."""
        # Input positions by request object (the same object may come twice).
        order: dict[int, deque[int]] = defaultdict(deque)
        counter = itertools.count()

        def numbered(items):
            for r in items:
                order[id(r)].append(next(counter))
                yield r

        async def anumbered(items):
            async for r in items:
                order[id(r)].append(next(counter))
                yield r

        if total is None and hasattr(requests, "__len__"):
            total = len(requests)  # type: ignore[arg-type]
        source = anumbered(requests) if hasattr(requests, "__aiter__") else numbered(requests)
        slots: list[Outcome | None] = []
        async for outcome in self.stream(source, total=total, label=label):
            positions = order[id(outcome.request)]
            index = positions.popleft()
            if not positions:
                del order[id(outcome.request)]
            if index >= len(slots):
                slots.extend([None] * (index + 1 - len(slots)))
            slots[index] = outcome
        return slots  # type: ignore[return-value]

    async def _pull(self, source: Any, is_async: bool, limit: int, char_budget: int
                    ) -> tuple[list[Request], int, bool]:
        """Up to `limit` requests holding up to `char_budget` prompt characters
        (at least one); returns (requests, their characters, exhausted)."""
        chunk: list[Request] = []
        chars = 0
        try:
            while len(chunk) < limit and (chars < char_budget or not chunk):
                r = await source.__anext__() if is_async else next(source)
                chunk.append(r)
                chars += _request_chars(r)
        except (StopIteration, StopAsyncIteration):
            return chunk, chars, True
        return chunk, chars, False

    async def _submit(self, chunk: list[Request], sink: asyncio.Queue) -> None:
        config = self.config
        resolved = resolve_many(config, chunk)  # ConfigError: unknown alias
        for r in resolved:  # missing keys fail before anything is queued
            for spec in r.endpoints:
                if spec.name not in self._endpoints:
                    self._endpoint(spec)
        inflight = self._inflight
        hits: dict[str, Any] = {}
        if self._cache is not None:
            lookup = [r.key for r in resolved if r.key not in inflight]
            if lookup:
                hits = await self._cache.get_many(lookup)
        for r in resolved:
            record = hits.get(r.key)
            if record is not None:
                sink.put_nowait(Outcome(request=r.request, result=result_from_record(record), cached=True,
                                        key=r.key))
                continue
            job = inflight.get(r.key)
            if job is not None:
                job.waiters.append((r.request, sink))
                self._stats.deduplicated += 1
                continue
            self._queue_new(r, sink)

    def _queue_new(self, r: Resolved, sink: asyncio.Queue) -> None:
        pool = self._pool(r)
        provider = pool.endpoints[0].provider
        if r.messages is not None:
            input_est = sum(provider.count_tokens(m["content"]) + _PER_MESSAGE_TOKENS for m in r.messages)
            output_est = int(r.params.get("max_tokens") or r.params.get("max_completion_tokens")
                             or DEFAULT_OUTPUT_RESERVE)
        else:
            input_est = sum(provider.count_tokens(t) for t in r.request.texts)  # type: ignore[union-attr]
            output_est = 0
        prompt = None
        if pool.prefix_order and r.messages is not None:
            prompt = tuple(itertools.chain.from_iterable((m["role"], m["content"]) for m in r.messages))
        job = Job(resolved=r, seq=next(self._seq), input_estimate=input_est, output_estimate=output_est,
                  prompt=prompt, waiters=[(r.request, sink)], pool=pool)
        self._inflight[r.key] = job
        pool.push(job)

    def _abandon(self, sink: asyncio.Queue) -> None:
        """The stream ended (normally, by an error, or the caller stopped
        early): drop its waiters and cancel calls nobody else waits for."""
        for key, job in list(self._inflight.items()):
            waiters = [w for w in job.waiters if w[1] is not sink]
            if len(waiters) == len(job.waiters):
                continue
            job.waiters = waiters
            if not waiters:
                job.cancelled = True
                del self._inflight[key]
                if job.task is not None:
                    job.task.cancel()

    # -- called by the endpoint dispatchers --------------------------------------------
    def admit(self, job: Job) -> bool:
        """False (and the job settled with a budget error) when sending it
        could take spending past max_cost."""
        if job.cancelled:
            return False
        if self.max_cost is None:
            return True
        estimate = job.resolved.alias.cost(job.input_estimate, job.output_estimate)
        if estimate > 0 and self._spent + self._reserved_cost + estimate > self.max_cost:
            self._settle(job, error=ProviderError(
                BUDGET, f"not sent: max cost ${self.max_cost:.2f} reached "
                        f"(spent ${self._spent:.2f}, this call up to ${estimate:.4f})"))
            return False
        return True

    def fail(self, job: Job, error: ProviderError) -> None:
        self._settle(job, error=error)

    def launch(self, ep: EndpointState, job: Job) -> None:
        job.cost_reserved = job.resolved.alias.cost(job.input_estimate, job.output_estimate)
        self._reserved_cost += job.cost_reserved
        job.task = asyncio.get_running_loop().create_task(self._attempt(ep, job))

    async def _attempt(self, ep: EndpointState, job: Job) -> None:
        r = job.resolved
        spec = ep.spec
        policy = r.endpoints[0]  # retry settings of the alias's first endpoint
        start = time.monotonic()
        job.attempts += 1
        self._stats.calls += 1
        if job.deadline is None and policy.total_timeout:
            job.deadline = start + policy.total_timeout
        timeout = spec.timeout if job.deadline is None else max(0.001, min(spec.timeout, job.deadline - start))
        result: Result | None = None
        error: ProviderError | None = None
        usage: tuple[int, int] | None = None
        try:
            try:
                if ep.enforces_timeout:  # the provider's own timer bounds the call: no second one
                    result = await self._call(ep.provider, r, timeout)
                else:
                    async with asyncio.timeout(timeout):
                        result = await self._call(ep.provider, r, timeout)
                usage = (result.input_tokens, getattr(result, "output_tokens", 0))
            except ProviderError as exc:
                error = exc
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- a provider bug must not end the run
                error = _as_provider_error(exc, timeout)
        finally:
            self._reserved_cost -= job.cost_reserved
            job.cost_reserved = 0.0
            cost = 0.0
            if usage is not None:  # spent before release(), which may start the next call under max_cost
                cost = r.alias.cost(usage[0], usage[1])
                self._spent += cost
            ep.release(job, usage)
        now = time.monotonic()
        if error is None:
            stats = self._stats
            stats.succeeded += 1
            stats.tokens_in += usage[0]
            stats.tokens_out += usage[1]
            stats.cost += cost
            if self._cache is not None and not self._closed:  # paid for: keep it even if nobody waits
                self._cache.put(r.key, r.identity, result_to_record(result), canonical=r.canonical)
            if not job.cancelled:
                self._settle(job, result=result, cost=cost, endpoint=ep.name)
            return
        if job.cancelled:
            return
        if error.kind == "rate_limited":
            self._stats.rate_limited += 1
            ep.on_rate_limited(error.retry_after, now, sent_at=start)
        job.last_error = error
        if error.retryable and job.attempts < policy.max_attempts:
            delay = self.retry_policy.delay(job.attempts, error.retry_after)
            if job.deadline is None or now + delay < job.deadline:
                self._stats.retries += 1
                loop = asyncio.get_running_loop()
                timer: asyncio.TimerHandle | None = None

                def requeue() -> None:
                    self._timers.discard(timer)
                    if not job.cancelled and not self._closed:
                        job.pool.push(job)

                timer = loop.call_later(delay, requeue)
                self._timers.add(timer)
                return
        self._settle(job, error=error, endpoint=ep.name)

    @staticmethod
    def _call(provider: Any, r: Resolved, timeout: float) -> Any:
        if r.messages is not None:
            return provider.chat(r.alias.model, r.messages, params=r.params, timeout=timeout)
        return provider.embed(r.alias.model, r.request.texts, timeout=timeout)  # type: ignore[union-attr]

    def _settle(self, job: Job, *, result: Result | None = None, error: ProviderError | None = None,
                cost: float = 0.0, endpoint: str | None = None) -> None:
        """Hand the call's outcome to every request waiting on it."""
        key = job.resolved.key
        if self._inflight.get(key) is job:
            del self._inflight[key]
        first = True
        for request, sink in job.waiters:
            sink.put_nowait(Outcome(request=request, result=result if first or result is None else _copy_result(result),
                                    error=error, attempts=job.attempts, cost=cost if first else 0.0,
                                    endpoint=endpoint, key=key))
            first = False
        job.waiters = []
