"""One memory system through a run: open, ingest, ready, recall, close.

    prepared = await prepare(system, services, chapters, question_texts, budget, budgets=per_tokenizer)
    prepared.for_question(question_text, tokenizer)   # Evidence: passages kept, cuts, answer, error
    prepared.failure   # one line when the system failed, else None

Every distinct question text is recalled once, whatever the number of
answering models (the evidence is the same for every reader: the fair
comparison), in a shuffled order (seeded: the same every run) so that the
order of the questions says nothing about them, up to the system's
`concurrency` at once. The system is handed `budget` (the loosest of its
readers'); what it returns is cut to each reader's own (`budgets`, one per
tokenizer), so that a row's evidence tokens are its reader's. Each phase has
a time limit; a system that fails, hangs or breaks the contract is stopped
and named, with its phase, in one line, and its unanswered questions carry
that line as their error: the rest of the run goes on. A recall that fails alone fails its question only.
"""
from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from engine.benchmark.memory.budget import Evidence, within_budget
from engine.benchmark.memory.contract import (
    BOOK,
    FINETUNED,
    Budget,
    Chapter,
    MemoryError,
    MemorySystem,
    Passage,
    Recall,
    RecallFailed,
)
from engine.benchmark.memory.meter import PhaseMeter
from engine.benchmark.memory.services import EngineServices
from providers.base import TulvingError

SHUFFLE_SEED = 20250122  # any fixed seed: the order must not follow the question set's
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds each phase may take (recall: each question)."""

    open: float = 300.0
    ingest: float = 4 * 3600.0
    ready: float = 3600.0
    recall: float = 300.0
    close: float = 60.0

    @classmethod
    def from_options(cls, options: dict[str, object]) -> Timeouts:
        """`timeout_ingest = 600` and the like, from a memory's config table."""
        values = {}
        for name in ("open", "ingest", "ready", "recall", "close"):
            value = options.get(f"timeout_{name}")
            if value is None:
                continue
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise TulvingError(f"timeout_{name} must be a positive number of seconds, not {value!r}")
            values[name] = float(value)
        return cls(**values)


@dataclass(slots=True)
class Prepared:
    """A memory system's evidence for the run's questions, and its figures."""

    name: str
    prompt: str
    answers: bool
    budget: Budget | None  # the budget the system was handed (the loosest of its readers'), None: none applies
    meter: PhaseMeter
    evidence: dict[str, Evidence] = field(default_factory=dict)  # each question's, cut to `budget`
    failure: str | None = None
    keep_texts: bool = False  # the results keep the passages' texts (outside systems: for the drill-down)
    budgets: dict[str, Budget] = field(default_factory=dict)  # each reader's tokenizer -> the budget of its rows
    readers: dict[str, str] = field(default_factory=dict)     # each answering model -> its tokenizer
    recalls: dict[str, Recall] = field(default_factory=dict)  # what the system returned, before any cut
    _cuts: dict[tuple[str, str], Evidence] = field(default_factory=dict)

    def for_question(self, text: str, tokenizer: str | None = None) -> Evidence:
        """The question's evidence cut to the budget of `tokenizer`'s readers
        (None, or a tokenizer without its own budget: to `budget`)."""
        found = self.evidence.get(text)
        if found is None:
            return Evidence(error=self.failure or f"memory system {self.name!r} gave no evidence for this question")
        own = self.budgets.get(tokenizer) if tokenizer is not None else None
        recall = self.recalls.get(text)
        if own is None or own == self.budget or recall is None or found.error is not None:
            return found
        cut = self._cuts.get((text, own.tokenizer))
        if cut is None:
            cut = within_budget(recall.passages, own, recall.answer if self.answers else None)
            self._cuts[(text, own.tokenizer)] = cut
        return cut

    def budget_of(self, model: str) -> Budget | None:
        """The budget of `model`'s rows (an agent-style system's: the one it was handed)."""
        tokenizer = self.readers.get(model)
        return self.budgets.get(tokenizer, self.budget) if tokenizer is not None else self.budget


def chapters_of(chapter_texts: Sequence[str]) -> list[Chapter]:
    """The book's chapters as a memory system receives them."""
    return [Chapter(id=k, text=text) for k, text in enumerate(chapter_texts, 1)]


async def _within(seconds: float, step: Awaitable[_T]) -> _T:
    """`step`, or TimeoutError after `seconds`. asyncio.timeout, not wait_for:
    Python 3.11's wait_for returns the step's result when the cancellation of
    Ctrl-C arrives as the step ends, and the run goes on as if never stopped."""
    async with asyncio.timeout(seconds):
        return await step


def _checked(system: MemorySystem, recall: object) -> Recall:
    """`recall` if it keeps the contract, else the reason it does not."""
    if not isinstance(recall, Recall):
        raise TypeError(f"recall returned {type(recall).__name__}, not a Recall")
    if not all(isinstance(p, Passage) for p in recall.passages):
        raise TypeError("recall returned passages that are not Passage objects")
    if system.answers and not isinstance(recall.answer, str):
        raise TypeError("an answering (agent-style) system returned no answer")
    return recall


class _Preparation:
    """The phases of one system, with the state they share."""

    def __init__(self, system: MemorySystem, services: EngineServices, budget: Budget | None, timeouts: Timeouts,
                 budgets: Mapping[str, Budget] | None = None):
        self.system, self.services, self.timeouts = system, services, timeouts
        self.meter = services.meter
        no_budget = system.prompt in (BOOK, FINETUNED)  # the whole book, or the weights
        self.prepared = Prepared(name=system.name, prompt=system.prompt, answers=system.answers,
                                 budget=None if no_budget else budget, meter=self.meter,
                                 budgets={} if no_budget else dict(budgets or {}))
        self.phase = "open"

    def _fail(self, exc: BaseException) -> None:
        if isinstance(exc, MemoryError):
            self.prepared.failure = str(exc)
        elif isinstance(exc, TimeoutError):
            limit = getattr(self.timeouts, self.phase)
            self.prepared.failure = str(MemoryError(self.system.name, self.phase, f"took longer than {limit:g} s "
                                                    f"(timeout_{self.phase} in its [memories] table)"))
        else:
            self.prepared.failure = str(MemoryError(self.system.name, self.phase, f"{type(exc).__name__}: {exc}"))

    async def run(self, chapters: Sequence[Chapter], questions: Sequence[str]) -> Prepared:
        try:
            await self._step("open", self.system.open(self.services))
            await self._step("ingest", self.system.ingest(chapters))
            await self._step("ready", self.system.ready())
            self.phase = "recall"
            with self.meter.phase("recall"):
                await self._recall_all(questions)
        except Exception as exc:  # any failure of the system's own code is its failure (cancelling is not)
            self._fail(exc)
        finally:
            await self._close()
        return self.prepared

    async def _step(self, name: str, step: Awaitable[None]) -> None:
        self.phase = name
        with self.meter.phase(name):
            await _within(getattr(self.timeouts, name), step)

    async def _close(self) -> None:
        self.phase = "close"
        try:
            with self.meter.phase("close"):
                await _within(self.timeouts.close, self.system.close())
        except Exception as exc:
            if self.prepared.failure is None:
                self._fail(exc)

    async def _recall_all(self, questions: Sequence[str]) -> None:
        order = list(dict.fromkeys(questions))
        random.Random(SHUFFLE_SEED).shuffle(order)
        slots = asyncio.Semaphore(max(1, min(int(self.system.concurrency or 1), 256)))
        budget = self.prepared.budget or Budget()

        async def one(text: str) -> None:
            async with slots:
                if self.prepared.failure is None:
                    self.prepared.evidence[text] = await self._recall(text, budget)

        tasks = [asyncio.ensure_future(one(text)) for text in order]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _recall(self, text: str, budget: Budget) -> Evidence:
        start = time.perf_counter()
        try:
            recall = _checked(self.system, await _within(self.timeouts.recall, self.system.recall(text, budget)))
        except MemoryError as exc:  # the system is broken: no further recall
            self.prepared.failure = str(exc)
            return Evidence(error=str(exc))
        except TimeoutError:
            self._fail(TimeoutError())
            return Evidence(error=self.prepared.failure)
        except RecallFailed as exc:  # the system said so itself: its words, once
            return Evidence(error=str(exc))
        except Exception as exc:  # this question's failure only
            return Evidence(error=f"memory system {self.system.name!r} failed at recall: {type(exc).__name__}: {exc}")
        finally:
            self.meter.recalled(time.perf_counter() - start)
        self.prepared.recalls[text] = recall
        return within_budget(recall.passages, self.prepared.budget, recall.answer if self.system.answers else None)


async def prepare(system: MemorySystem, services: EngineServices, chapters: Sequence[Chapter],
                  questions: Sequence[str], budget: Budget | None, timeouts: Timeouts | None = None, *,
                  budgets: Mapping[str, Budget] | None = None) -> Prepared:
    """Run `system` through its phases over the book's `chapters`, recalling
    every text of `questions` under `budget`; `budgets`: each reader
    tokenizer's own, which its rows are cut to (see the module's docstring)."""
    return await _Preparation(system, services, budget, timeouts or Timeouts(), budgets).run(chapters, questions)
