"""The contract of a memory system, and what Tulving lends it for a run.

A memory system reads the book once and is then asked questions one at a
time. It sees the chapters (number and text, in book order) and each
question's text: never the question set, the answers, the ground-truth
chapters, the template or the bin. Asked a question, it returns *evidence*
(passages, each with the chapter it came from), which the run's answering
model answers from with the paper's RAG prompt -- the fair comparison: same
reader, different memory -- or, for an agent-style system (`answers = True`),
its own answer with the evidence it used.

A Python memory system is a subclass of `MemorySystem` found through the
entry point group `tulving.memories`::

    [project.entry-points."tulving.memories"]
    my-memory = "my_package.memory:MyMemory"

    class MyMemory(MemorySystem):
        async def ingest(self, chapters):
            self.texts = {c.id: c.text for c in chapters}
        async def recall(self, question, budget):
            return Recall(passages=[Passage(text=t, chapter=k) for k, t in self.texts.items()][:budget.passages])

Tulving calls `open(services)`, `ingest(chapters)`, `ready()`, then
`recall(question, budget)` once per distinct question (in a shuffled order,
with up to `concurrency` at once), then `close()`. The same contract spoken
as JSON lines by a subprocess is in engine/benchmark/memory/subprocess_memory.py
(docs/memory-systems.md).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from engine.tokens import CL100K_BASE
from providers.base import TulvingError

# How the answering model is prompted with a memory's evidence. Outside
# systems are always RAG; the paper's in-context and fine-tuned modes keep
# their own prompts (engine/benchmark/evaluation/answers.py).
RAG = "rag"              # the paper's RAG prompt around the passages, most relevant first
BOOK = "book"            # the paper's in-context prompt around the passages joined as the book
FINETUNED = "finetuned"  # the paper's fine-tuning prompt; the passages are none (the book is in the weights)


class MemoryError(TulvingError):
    """A memory system that failed, hung or broke the contract: the message
    names the system and the phase."""

    def __init__(self, system: str, phase: str, message: str):
        super().__init__(f"memory system {system!r} failed at {phase}: {message}")
        self.system, self.phase = system, phase


class RecallFailed(Exception):
    """One recall that failed for its question only (a subprocess's error
    reply to that recall): the question is scored as failed, the run goes on."""

    def __init__(self, system: str, message: str):
        super().__init__(f"memory system {system!r} could not recall: {message}")
        self.system = system


@dataclass(frozen=True, slots=True)
class Chapter:
    """One chapter of the book: its number (1-based, book order) and its text
    as in the book, without the "Chapter k" heading."""

    id: int
    text: str


@dataclass(frozen=True, slots=True)
class Budget:
    """What one recall may return: at most `passages` passages and `tokens`
    evidence tokens, counted by Tulving over the passages' texts in
    `tokenizer` (the answering model's: providers/tokens.py); None: no limit.
    Evidence beyond it is cut, whole passages from the last one, and the cut
    is counted."""

    passages: int | None = None
    tokens: int | None = None
    tokenizer: str = CL100K_BASE

    def to_json(self) -> dict[str, int | str | None]:
        return {"passages": self.passages, "tokens": self.tokens, "tokenizer": self.tokenizer}

    def label(self) -> str:
        parts = [f"{self.passages} passages" if self.passages is not None else "",
                 f"{self.tokens:,} tokens ({self.tokenizer})" if self.tokens is not None else ""]
        return " / ".join(p for p in parts if p) or "no limit"


@dataclass(frozen=True, slots=True)
class Passage:
    """A piece of evidence: its text and the chapter it came from (None when
    the system cannot say: such a passage counts for the budget, not for
    retrieval recall or precision)."""

    text: str
    chapter: int | None = None
    score: float | None = None  # the system's own relevance score, kept for the drill-down


@dataclass(frozen=True, slots=True)
class Recall:
    """What a memory system returns for one question: passages, most
    relevant first, and (agent style only) its own answer."""

    passages: Sequence[Passage] = ()
    answer: str | None = None


class MemoryServices(Protocol):
    """What Tulving lends a memory system for the length of a run. Every model
    call made through it -- `chat`, `embed`, or any OpenAI client pointed at
    `openai_base_url` -- goes through the engine: rate-limited, cached (a
    rerun re-ingests for nothing), priced, capped by --max-cost and counted
    in the phase it was made in."""

    @property
    def workdir(self) -> Path:
        """A folder of the system's own for this run (its index, its database)."""
        ...

    @property
    def chat_model(self) -> str | None:
        """The model alias chat calls use unless they name another, or None."""
        ...

    @property
    def embed_model(self) -> str | None:
        """The embedding model alias embed calls use unless they name another, or None."""
        ...

    @property
    def openai_base_url(self) -> str | None:
        """Tulving's OpenAI-compatible endpoint on loopback for this run
        ("http://127.0.0.1:PORT/v1": chat completions, embeddings), or None
        when the run serves none."""
        ...

    @property
    def openai_api_key(self) -> str | None:
        """The secret made for this run, which that endpoint requires."""
        ...

    @property
    def budget(self) -> Budget | None:
        """The run's evidence budget, the same in every recall (None: none applies)."""
        ...

    @property
    def models(self) -> Sequence[str]:
        """Every alias the system may call (through `chat`, `embed` or the endpoint)."""
        ...

    async def chat(self, messages: Sequence[Mapping[str, str]], *, model: str | None = None,
                   temperature: float | None = None, max_tokens: int | None = None,
                   response_format: Mapping[str, object] | None = None) -> str:
        """The reply text of one chat call."""
        ...

    async def embed(self, texts: Sequence[str], *, model: str | None = None) -> np.ndarray:
        """One vector per text (rows of a float array, as the model returned them)."""
        ...


class MemorySystem:
    """A memory system. Override `ingest` and `recall`; the rest is optional.

    Class attributes a system may set:
    - `answers`: True when `recall` returns the system's own answer (agent
      style): no answering model is called, the judge scores that answer;
    - `concurrency`: how many recalls Tulving may have in flight at once;
    - `description`: one line for `tulving memories`;
    - `requires`: import names the system needs (`tulving memories` says
      which are missing, and the run refuses it with one line);
    - `openai_endpoint`: True when the system calls models through an OpenAI
      client: Tulving then serves its endpoint on loopback for the run
      (`services.openai_base_url`, `openai_api_key`); a subprocess always has it.
    """

    answers: bool = False
    openai_endpoint: bool = False
    concurrency: int = 1
    description: str = ""
    requires: tuple[str, ...] = ()
    prompt: str = RAG  # built-in systems only: how the reader is prompted (RAG, BOOK or FINETUNED)

    def __init__(self, name: str = "", options: Mapping[str, object] | None = None):
        self.name = name or type(self).__name__
        self.options: dict[str, object] = dict(options or {})
        self._services: MemoryServices | None = None

    @property
    def services(self) -> MemoryServices:
        if self._services is None:
            raise TulvingError(f"memory system {self.name!r} used before open()")
        return self._services

    def unavailable(self) -> str | None:
        """Why this system cannot run here (a missing package), or None."""
        from importlib.util import find_spec

        missing = [name for name in self.requires if find_spec(name) is None]
        return f"needs {', '.join(missing)} (not installed)" if missing else None

    async def open(self, services: MemoryServices) -> None:
        """Called once, before `ingest`: keep the services."""
        self._services = services

    async def ingest(self, chapters: Sequence[Chapter]) -> None:
        """Read the book: every chapter, in book order, in one call."""
        raise NotImplementedError

    async def ready(self) -> None:
        """Return once everything ingested can be recalled (an index built)."""
        return None

    async def recall(self, question: str, budget: Budget) -> Recall:
        """The evidence for one question (and, agent style, the answer)."""
        raise NotImplementedError

    async def close(self) -> None:
        """Release what the system holds (processes, files, connections)."""
        return None


@dataclass(slots=True)
class MemorySpec:
    """A memory system as the registry knows it, before it is made."""

    name: str
    origin: str                       # "built-in", "entry point pkg.mod:Class", "command ...", "config"
    make: object = None               # a MemorySystem subclass or a factory (name, options) -> MemorySystem
    options: dict[str, object] = field(default_factory=dict)
    command: Sequence[str] | None = None  # a subprocess speaking the JSON-lines protocol
