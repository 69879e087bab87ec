"""mem0 (the `mem0ai` package) as a Tulving memory system, offline.

mem0 keeps its memories in its own local vector store (Qdrant's local mode,
a folder in the system's workdir) and its history in SQLite there; its LLM
and its embedder are OpenAI clients pointed at Tulving's endpoint on loopback
(`services.openai_base_url`, with the run's secret), so every call it makes is
the run's: cached, priced, counted per phase.

Two systems:
- `mem0` (`Mem0Memory`): `add(..., infer=False)`: each paragraph stored as
  it is, headed as the paper's rag-paragraph chunks ("Chapter k, Paragraph
  j"); mem0 embeds and stores it, and searches with its own scoring;
- `mem0-extract` (`Mem0ExtractMemory`): `add(..., infer=True)`: mem0's own
  pipeline, one LLM extraction call per chapter (its paragraphs as the
  messages), the extracted memories embedded and stored.
Every stored memory keeps its chapter number in its metadata; `recall`
returns mem0's search results with it.

Options (`[memories.NAME]` with `use = "mem0"`): `infer` (bool), `unit`
("paragraph" | "chapter"), `label` (bool: head stored texts with their
chapter; infer=False only), `top_k` (without a passage budget), `threshold`
(mem0's minimum score, default its 0.1), `embedding_dims` (else measured
with one embedding call).

Nothing phones home: MEM0_TELEMETRY=False is set before mem0 is imported
(and mem0's flags are turned off if it was imported earlier), its clients
are checked to point at the loopback endpoint (mem0's OpenAI LLM goes to
OpenRouter when OPENROUTER_API_KEY is set: not here), and the two things
that would download (fastembed's BM25 model, spaCy's en_core_web_sm when
spaCy is installed without it) are marked as unavailable, so mem0 runs
without them as it does when they are not installed.
"""
from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING

from engine.benchmark.memory.adapters.chunks import chapter_of, option, top_k, units
from engine.benchmark.memory.contract import Budget, Chapter, MemoryError, MemoryServices, MemorySystem, Passage, Recall

if TYPE_CHECKING:
    from mem0 import AsyncMemory

USER_ID = "tulving-book"  # mem0 scopes memories by user; the book is one user's
COLLECTION = "tulving"


class Mem0Memory(MemorySystem):
    """mem0, paragraphs stored as they are (infer=False)."""

    description = "mem0 (mem0ai): each paragraph stored as it is (add infer=False), local Qdrant, searched by mem0"
    requires = ("mem0", "qdrant_client")
    concurrency = 1  # one Qdrant local-mode client: searches one at a time
    openai_endpoint = True  # its LLM and embedder are OpenAI clients
    infer_default = False

    def __init__(self, name: str = "", options: Mapping[str, object] | None = None):
        super().__init__(name, options)
        self._memory: AsyncMemory | None = None

    @property
    def memory(self) -> AsyncMemory:
        """mem0's AsyncMemory, once open."""
        if self._memory is None:
            raise MemoryError(self.name, "open", "used before open()")
        return self._memory

    @property
    def infer(self) -> bool:
        return bool(option(self.name, self.options, "infer", self.infer_default, (True, False)))

    async def open(self, services: MemoryServices) -> None:
        await super().open(services)
        if services.openai_base_url is None or services.openai_api_key is None:
            raise MemoryError(self.name, "open", "mem0 needs the run's OpenAI-compatible endpoint on loopback")
        if services.embed_model is None:
            raise MemoryError(self.name, "open", "mem0 needs an embedding model (--embed-model, e.g. local:minilm)")
        if self.infer and services.chat_model is None:
            raise MemoryError(self.name, "open", "mem0 with infer=True needs a chat model for its extraction "
                                                 "(--memory-model, e.g. builtin:reader)")
        option(self.name, self.options, "unit", "paragraph", ("paragraph", "chapter"))
        dims = self.options.get("embedding_dims")
        if not isinstance(dims, int):
            dims = int((await services.embed(["How many dimensions has this embedding?"])).shape[1])
        config = mem0_config(services, Path(services.workdir), dims)
        self._memory = await asyncio.to_thread(make_memory, config, services.openai_base_url, self.name)

    async def ingest(self, chapters: Sequence[Chapter]) -> None:
        unit = str(self.options.get("unit", "paragraph"))
        label = bool(self.options.get("label", True)) and not self.infer
        by_chapter: dict[int, list[dict[str, str]]] = {}
        for piece in units(chapters, unit, label=label):
            by_chapter.setdefault(piece.chapter, []).append({"role": "user", "content": piece.text})
        for chapter, messages in by_chapter.items():
            # One add per chapter: infer=False stores each message as a memory,
            # infer=True makes one extraction call over the chapter's messages.
            await self.memory.add(messages, user_id=USER_ID, metadata={"chapter": chapter}, infer=self.infer)

    async def recall(self, question: str, budget: Budget) -> Recall:
        threshold = self.options.get("threshold", 0.1)
        found = await self.memory.search(question, top_k=top_k(budget, self.options),
                                          filters={"user_id": USER_ID}, threshold=threshold)
        return Recall(passages=[Passage(text=item["memory"], chapter=chapter_of(item.get("metadata")),
                                        score=item.get("score")) for item in found.get("results", [])])

    async def close(self) -> None:
        memory, self._memory = self._memory, None
        if memory is not None:
            await asyncio.to_thread(_close, memory)


class Mem0ExtractMemory(Mem0Memory):
    """mem0 with its LLM extraction (infer=True)."""

    description = "mem0 (mem0ai) with its LLM extraction (add infer=True, one call per chapter), local Qdrant"
    infer_default = True


def mem0_config(services: MemoryServices, workdir: Path, dims: int) -> dict[str, object]:
    """mem0's configuration: everything local to `workdir`, both clients on the loopback endpoint."""
    workdir.mkdir(parents=True, exist_ok=True)
    endpoint = {"api_key": services.openai_api_key, "openai_base_url": services.openai_base_url}
    return {
        "vector_store": {"provider": "qdrant", "config": {
            "collection_name": COLLECTION, "path": str(workdir / "qdrant"), "embedding_model_dims": dims,
            "on_disk": True}},
        # No chat model: mem0 with infer=False never calls its LLM; a call would be refused by the endpoint.
        "llm": {"provider": "openai", "config": {"model": services.chat_model or "no-chat-model-lent", **endpoint}},
        # No embedding_dims here: mem0 would send `dimensions`, which the run's model may refuse.
        "embedder": {"provider": "openai", "config": {"model": services.embed_model, **endpoint}},
        "history_db_path": str(workdir / "history.db"),
    }


def make_memory(config: dict[str, object], base_url: str, name: str = "mem0") -> AsyncMemory:
    """mem0's AsyncMemory, imported with its telemetry off and checked to call
    nothing but the loopback endpoint (see the module's docstring)."""
    os.environ["MEM0_TELEMETRY"] = "False"
    from mem0 import AsyncMemory
    from mem0.memory import main as mem0_main
    from mem0.memory import telemetry

    telemetry.MEM0_TELEMETRY = mem0_main.MEM0_TELEMETRY = False  # imported before with it on: off now
    _no_downloads()
    memory = AsyncMemory.from_config(config)
    for part in ("llm", "embedding_model"):
        client = getattr(getattr(memory, part), "client", None)
        if client is not None and str(client.base_url).rstrip("/") != base_url.rstrip("/"):
            raise MemoryError(name, "open", f"mem0's {part} would call {client.base_url}, not the run's "
                                              f"endpoint (unset OPENROUTER_API_KEY)")
    store = memory.vector_store
    if hasattr(store, "_bm25_encoder"):
        store._bm25_encoder = False  # mem0's sentinel for "fastembed unavailable": no hub download
    return memory


def _no_downloads() -> None:
    """spaCy installed without en_core_web_sm: mem0 would download the model;
    mark it as failed to load, as mem0 does after a failed download."""
    if find_spec("spacy") is None:
        # mem0 then warns once per process that spaCy is missing: it runs without it (no entity boosts).
        logging.getLogger("mem0.utils.spacy_models").setLevel(logging.ERROR)
        return
    import spacy

    if not spacy.util.is_package("en_core_web_sm"):
        from mem0.utils import spacy_models

        spacy_models._load_failed_full = spacy_models._load_failed_lemma = True


def _close(memory: AsyncMemory) -> None:
    """Close mem0's stores' Qdrant clients (local mode holds a lock on its folder) and its history."""
    for store in (getattr(memory, "vector_store", None), getattr(memory, "_entity_store", None)):
        client = getattr(store, "client", None)
        if client is not None and hasattr(client, "close"):
            client.close()
    memory.close()
