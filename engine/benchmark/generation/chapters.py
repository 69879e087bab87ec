"""Chapter generation through the engine: candidates, checks, retries.

Candidate k of event i is the chat request of i's chapter prompt with
`draw=k`; its LLM check is the verification prompt with the same model and
`draw=k`. Both are cached on their own, so a rerun replays every candidate
with zero calls and a larger book (whose first events and meta-events are the
smaller book's) reuses the smaller book's chapters.

Work runs in batches, each one `engine.stream` over a list of ready
requests. The first batch holds candidate 0 of every event; as outcomes
arrive, follow-up requests (the LLM check of a candidate that passed the exact
checks, the next candidate of an event whose candidate failed) collect and go
out as a new batch, concurrently with the batches still running, as soon as
enough have collected or a short delay has passed. (The engine pulls a
stream's input inline, so a stream cannot be fed from its own outcomes; the
batches overlap instead, under the endpoints' shared limits.) Each event's
candidates are tried in order 0, 1, ... up to `itermax`, so the result, the
log and the per-iteration table of the paper (iteration k = candidate k) do
not depend on timing.

Models of a kind with seeded draws (the built-in ones) get `seed=draw`, since a provider
only sees the messages and parameters; for real models the request carries
the alias's parameters only (as in the paper: temperature 1.0, 4096 tokens).
"""
from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.benchmark.generation.bookdir import CandidateLog, MetaEvent
from engine.benchmark.generation.checks import exact_check, parse_llm_check
from engine.benchmark.generation.prompts import chapter_messages, verification_messages
from engine.config import Config
from engine.errors import EXIT_BUDGET
from engine.requests import ChatRequest, Outcome
from engine.scheduler import Engine
from engine.spending import Spending
from providers.base import TulvingError
from providers.kinds import kind_of

DEFAULT_ITERMAX = 10
# A unit of work: ("write", event, draw) or ("check", event, draw, candidate).
_Work = tuple[Any, ...]
# Follow-up requests go out as a new stream once this many have collected
# (or a twentieth of the events, if more) or after BATCH_DELAY seconds.
MIN_BATCH = 8
BATCH_DELAY = 0.05
# Errors that no further candidate can fix: stop the run instead of burning draws.
_FATAL_KINDS = frozenset({"auth", "config", "bad_request", "budget", "cancelled"})

VALID, FAILED_EXACT, FAILED_LLM, ERROR = "valid", "failed_exact", "failed_llm", "error"


class GenerationError(TulvingError):
    """The model cannot be used for generation (bad key, unknown model, ...)."""


class BudgetStop(GenerationError):
    """--max-cost stopped generation."""

    exit_code = EXIT_BUDGET


@dataclass
class ChapterRun:
    """What chapter generation produced."""

    valid: dict[int, tuple[int, str]] = field(default_factory=dict)  # event -> (draw, raw candidate)
    log: list[CandidateLog] = field(default_factory=list)          # one record per candidate
    failed_events: list[int] = field(default_factory=list)
    calls: int = 0        # outcomes that were not cache hits
    cache_hits: int = 0
    call_errors: int = 0  # calls that failed for good (after the engine's retries)
    last_error: str | None = None
    error_events: list[int] = field(default_factory=list)  # dropped because their last candidate's call failed
    batches: int = 0      # engine streams started
    spending: Spending = field(default_factory=Spending)  # the "write" role: chapters and their LLM checks

    def why_none_passed(self) -> str:
        """One line: how many chapters failed the checks, and why (the most
        frequent reasons of the candidates' failures)."""
        exact = [r["reason"] for r in self.log if r["outcome"] == FAILED_EXACT]
        llm = [r["reason"] for r in self.log if r["outcome"] == FAILED_LLM]
        reasons = Counter(str(r).split(":")[0] for r in exact + llm if r)
        common = "; ".join(f"{n}x {reason}" for reason, n in reasons.most_common(2))
        return (f"all {len(self.failed_events)} chapters failed the checks ({len(exact)} candidates failed the "
                f"exact checks, {len(llm)} the LLM check{'; most often: ' + common if common else ''})")


@dataclass(frozen=True)
class _Tag:
    event: int
    draw: int
    check: bool  # False: chapter writing, True: LLM check


def seeds_draws(config: Config, model: str) -> bool:
    """Whether requests of `model` carry `seed=draw` (a kind whose draws are
    picked by the seed: the built-in models)."""
    return kind_of(config.endpoints_of(config.alias(model))[0]).capabilities.seeded_draws


class ChapterRequests:
    """Builds the chat requests of candidate `draw` of event `event` and of its LLM check."""

    def __init__(self, config: Config, events: Sequence[Mapping[str, str]], metas: Sequence[MetaEvent],
                 styles: Mapping[str, Sequence[str]], *, model: str, universe: str = "default",
                 seed_draws: bool | None = None, temperature: float | None = None):
        self.events, self.metas, self.styles = events, metas, styles
        self.model, self.universe, self.temperature = model, universe, temperature
        self.seed_draws = seeds_draws(config, model) if seed_draws is None else seed_draws

    def write(self, event: int, draw: int) -> ChatRequest:
        meta = self.metas[event]
        messages = chapter_messages(self.events[event], meta, self.styles[meta["style"]], self.universe)
        return ChatRequest(model=self.model, messages=messages, temperature=self.temperature,
                           seed=draw if self.seed_draws else None, draw=draw,
                           tag=_Tag(event, draw, False))

    def check(self, event: int, draw: int, candidate: str) -> ChatRequest:
        return ChatRequest(model=self.model, messages=verification_messages(candidate),
                           temperature=self.temperature, seed=draw if self.seed_draws else None,
                           draw=draw, tag=_Tag(event, draw, True))


class ChapterGenerator:
    """Generates the chapters of `events` with `model` through `engine`."""

    def __init__(self, engine: Engine, events: Sequence[Mapping[str, str]], metas: Sequence[MetaEvent],
                 styles: Mapping[str, Sequence[str]], *, model: str, universe: str = "default",
                 itermax: int = DEFAULT_ITERMAX, seed_draws: bool | None = None,
                 temperature: float | None = None):
        if itermax < 1:
            raise TulvingError(f"itermax must be at least 1, got {itermax}")
        self.engine = engine
        self.events, self.metas = events, metas
        self.model, self.itermax = model, itermax
        self.requests = ChapterRequests(engine.config, events, metas, styles, model=model, universe=universe,
                                        seed_draws=seed_draws, temperature=temperature)

    # -- the run --------------------------------------------------------------------------
    async def run(self, progress: Callable[[ChapterRun], None] | None = None) -> ChapterRun:
        """Generate; `progress(result)` is called after every outcome."""
        result = ChapterRun()
        # The progress line's total: a chapter call and its LLM check per event (retries come on top).
        self.engine.expect(2 * len(self.events))
        self._ready: list[_Work] = [("write", i, 0) for i in range(len(self.events))]
        self._enough = asyncio.Event()
        batch_size = max(MIN_BATCH, len(self.events) // 20)
        running: set[asyncio.Task[None]] = set()
        try:
            while self._ready or running:
                if self._ready:
                    batch = sorted(self._ready, key=lambda w: (w[1], w[2], w[0]))
                    self._ready = []
                    self._enough.clear()
                    result.batches += 1
                    running.add(asyncio.create_task(self._consume(batch, result, batch_size, progress)))
                waiter = asyncio.create_task(self._enough.wait())
                done, _ = await asyncio.wait(running | {waiter}, timeout=BATCH_DELAY,
                                             return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                for task in done - {waiter}:
                    running.discard(task)
                    task.result()  # a fatal error ends the run here
        finally:
            for task in running:
                task.cancel()
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        result.failed_events.sort()
        result.log.sort(key=lambda r: (r["event"], r["draw"]))
        return result

    def _follow_up(self, item: _Work, batch_size: int) -> None:
        self._ready.append(item)
        if len(self._ready) >= batch_size:
            self._enough.set()

    async def _consume(self, batch: list[_Work], result: ChapterRun, batch_size: int,
                       progress: Callable[[ChapterRun], None] | None) -> None:
        candidates = {(item[1], item[2]): item[3] for item in batch if item[0] == "check"}
        # A label, not a total: run() told the engine the work up front. Round n: the n-th draw of an event.
        label = f"chapters ({self.model}), round {max(item[2] for item in batch) + 1}"
        async for outcome in self.engine.stream(self._requests(batch), label=label):
            self._count(outcome, result)
            tag: _Tag = outcome.tag
            if outcome.error is not None:
                self._on_error(outcome, tag, result, batch_size)
            elif tag.check:
                candidate = candidates.pop((tag.event, tag.draw))
                passed, reason = parse_llm_check(outcome.text)
                if passed:
                    result.valid[tag.event] = (tag.draw, candidate)
                    self._record(result, tag, VALID, None)
                else:
                    self._record(result, tag, FAILED_LLM, reason)
                    self._retry(tag, result, batch_size)
            else:
                candidate = outcome.text
                problem = exact_check(candidate, self.events[tag.event], self.metas[tag.event])
                if problem is None:
                    self._follow_up(("check", tag.event, tag.draw, candidate), batch_size)
                else:
                    self._record(result, tag, FAILED_EXACT, problem)
                    self._retry(tag, result, batch_size)
            if progress is not None:
                progress(result)

    def _requests(self, work: list[_Work]) -> Iterator[ChatRequest]:
        for item in work:
            if item[0] == "write":
                yield self.requests.write(item[1], item[2])
            else:
                yield self.requests.check(item[1], item[2], item[3])

    def _count(self, outcome: Outcome, result: ChapterRun) -> None:
        result.spending.add("write", self.engine.config.alias(outcome.request.model), outcome)
        if outcome.cached:
            result.cache_hits += 1
        else:
            result.calls += 1

    def _record(self, result: ChapterRun, tag: _Tag, outcome: str, reason: str | None) -> None:
        result.log.append({"event": tag.event, "draw": tag.draw, "outcome": outcome, "reason": reason})

    def _retry(self, tag: _Tag, result: ChapterRun, batch_size: int) -> None:
        if tag.draw + 1 < self.itermax:
            self._follow_up(("write", tag.event, tag.draw + 1), batch_size)
        else:
            result.failed_events.append(tag.event)

    def _on_error(self, outcome: Outcome, tag: _Tag, result: ChapterRun, batch_size: int) -> None:
        err = outcome.error
        assert err is not None  # the caller handles error outcomes only
        if err.kind == "budget":
            raise BudgetStop(f"generation with {self.model} stopped by --max-cost: {err}; finished calls are "
                             f"cached, rerun with a higher --max-cost to continue")
        if err.kind in _FATAL_KINDS:
            raise GenerationError(f"generation with {self.model} stopped: {err}")
        step = "LLM check" if tag.check else "chapter call"
        result.call_errors += 1
        result.last_error = str(err)
        self._record(result, tag, ERROR, f"{step} failed: {err}")
        dropped = len(result.failed_events)
        self._retry(tag, result, batch_size)
        if len(result.failed_events) > dropped:
            result.error_events.append(tag.event)
