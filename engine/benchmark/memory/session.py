"""The memory systems of one run, prepared side by side.

    session = MemorySession(engine, config, settings)
    prepared = await session.prepare(book, questions, "mem0", texts, readers)   # once per system

Each system gets its own workdir (under the run folder), its own meter, the
run's evidence budget (counted in its readers' tokenizers: the loosest is
handed to it, each reader's rows are cut to their own), and the models the
run lends it: `--memory-model` (default: the run's first answering model)
for chat, the run's embedding model for embeddings. When an outside system
is in the run, Tulving serves its OpenAI-compatible endpoint on loopback
(proxy.py) for the length of the run, with a secret per system. The paper's
RAG systems get the paper's K (computed here from the question set, which
they never see).
"""
from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.benchmark.evaluation import rag
from engine.benchmark.evaluation.questions import Question
from engine.benchmark.generation.bookdir import Book
from engine.benchmark.memory.budget import loosest, paper_budget
from engine.benchmark.memory.builtin import RagMemory
from engine.benchmark.memory.contract import BOOK, FINETUNED, Budget, MemorySpec, MemorySystem
from engine.benchmark.memory.meter import PhaseMeter
from engine.benchmark.memory.registry import make_memory
from engine.benchmark.memory.runner import Prepared, Timeouts, chapters_of, prepare
from engine.benchmark.memory.services import EngineServices
from engine.config import Config
from engine.tokens import CL100K_BASE

if TYPE_CHECKING:
    from engine.benchmark.memory.proxy import ModelEndpoint
    from engine.scheduler import Engine

BUILTIN_ORIGIN = "entry point engine.benchmark.memory.builtin:"


def is_builtin(spec: MemorySpec) -> bool:
    return spec.origin.startswith(BUILTIN_ORIGIN)


@dataclass(slots=True)
class MemorySettings:
    """What a run decides for its memory systems."""

    specs: dict[str, MemorySpec]
    workdir: Path | None = None        # each system's folder is workdir/NAME, emptied at the start (None: a temp folder)
    chat_model: str | None = None      # --memory-model
    embed_model: str | None = None     # the run's embedding model
    budget: Budget | None = None       # the figures the run sets (a None figure, or None: the paper's);
                                       # its tokens are counted in each reader's tokenizer
    serve_endpoint: bool = True        # serve the OpenAI-compatible endpoint to outside systems


@dataclass(slots=True)
class MemorySession:
    engine: Engine
    config: Config
    settings: MemorySettings
    ready: dict[str, Prepared] = field(default_factory=dict)  # systems prepared before (a repeat's)
    _futures: dict[str, asyncio.Future[Prepared]] = field(default_factory=dict)
    _endpoint: ModelEndpoint | None = None
    _endpoint_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def budget(self, book: Book, questions: Sequence[Question], tokenizer: str = CL100K_BASE) -> Budget:
        """The run's budget counted in `tokenizer`: the figures the settings
        set, the paper's (in that tokenizer) for those they leave unset."""
        chosen = self.settings.budget or Budget()
        if chosen.passages is not None and chosen.tokens is not None:
            return Budget(passages=chosen.passages, tokens=chosen.tokens, tokenizer=tokenizer)
        paper = paper_budget(book.text, questions, tokenizer)
        return Budget(passages=paper.passages if chosen.passages is None else chosen.passages,
                      tokens=paper.tokens if chosen.tokens is None else chosen.tokens, tokenizer=tokenizer)

    def prepare(self, book: Book, questions: Sequence[Question], name: str, texts: Sequence[str],
                readers: dict[str, str] | None = None) -> asyncio.Future[Prepared]:
        """The preparation of system `name`, recalling `texts` (the question
        texts its jobs ask), started at the first ask: every job of that
        system awaits the same one. `questions`: the whole set, for the
        paper's K and budget; `readers`: the answering models of its jobs,
        each with its tokenizer (none: an agent-style system's, cl100k_base)."""
        found = self._futures.get(name)
        if found is None:
            if name in self.ready:
                found = asyncio.get_running_loop().create_future()
                found.set_result(self.ready[name])
            else:
                found = asyncio.ensure_future(self._prepare(book, questions, name, texts, readers or {}))
            self._futures[name] = found
        return found

    def models_for(self, spec: MemorySpec) -> list[str]:
        return [m for m in dict.fromkeys([self.settings.chat_model, self.settings.embed_model]) if m]

    async def _prepare(self, book: Book, questions: Sequence[Question], name: str, texts: Sequence[str],
                       readers: dict[str, str]) -> Prepared:
        spec = self.settings.specs[name]
        system = make_memory(spec)
        if isinstance(system, RagMemory):
            system.k = rag.top_k(questions, system.mode)
        meter = PhaseMeter(name)
        services = await self._services(spec, system, meter)
        budgets = {t: self.budget(book, questions, t) for t in sorted(set(readers.values()) or {CL100K_BASE})}
        budget = loosest(budgets.values())
        services.budget = None if system.prompt in (BOOK, FINETUNED) else budget
        try:
            prepared = await prepare(system, services, chapters_of(book.chapter_texts), texts, budget,
                                     Timeouts.from_options(spec.options), budgets=budgets)
            prepared.keep_texts = not is_builtin(spec)  # the built-ins' passages are the book's chunks
            prepared.readers = dict(readers)
            return prepared
        finally:
            if self._endpoint is not None and services.openai_api_key:
                self._endpoint.revoke(services.openai_api_key)

    def _workdir(self, spec: MemorySpec) -> Path:
        """The system's folder, emptied: a resumed run re-ingests (from the
        cache: at no cost). The built-ins keep nothing there: none is made."""
        if is_builtin(spec):
            return (self.settings.workdir or Path(tempfile.gettempdir())) / spec.name
        if self.settings.workdir is None:
            return Path(tempfile.mkdtemp(prefix=f"tulving-memory-{spec.name}-"))
        workdir = self.settings.workdir / spec.name
        shutil.rmtree(workdir, ignore_errors=True)
        workdir.mkdir(parents=True, exist_ok=True)
        return workdir

    async def _services(self, spec: MemorySpec, system: MemorySystem, meter: PhaseMeter) -> EngineServices:
        workdir = self._workdir(spec)
        models = self.models_for(spec)
        services = EngineServices(engine=self.engine, config=self.config, meter=meter, workdir=workdir,
                                  chat_model=self.settings.chat_model, embed_model=self.settings.embed_model,
                                  models=tuple(models))
        if self.settings.serve_endpoint and (system.openai_endpoint or spec.command is not None):
            endpoint = await self._started_endpoint()
            services.openai_base_url = endpoint.base_url
            services.openai_api_key = endpoint.grant(meter, models)
        return services

    async def _started_endpoint(self) -> ModelEndpoint:
        async with self._endpoint_lock:
            if self._endpoint is None:
                from engine.benchmark.memory.proxy import ModelEndpoint

                endpoint = ModelEndpoint(self.engine, self.config)
                await endpoint.start()
                self._endpoint = endpoint
            return self._endpoint

    def prepared(self) -> dict[str, Prepared]:
        """The systems prepared so far (their futures done)."""
        return {name: f.result() for name, f in self._futures.items() if f.done() and not f.cancelled()
                and f.exception() is None}

    async def close(self) -> None:
        for future in self._futures.values():
            future.cancel()
        await asyncio.gather(*self._futures.values(), return_exceptions=True)
        if self._endpoint is not None:
            await self._endpoint.close()
            self._endpoint = None
