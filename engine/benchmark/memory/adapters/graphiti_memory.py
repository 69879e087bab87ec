"""graphiti (the `graphiti-core` package) on embedded Kuzu as a Tulving memory
system: a temporal knowledge graph built by an LLM, offline.

Each chapter is one graphiti episode (`add_episode`, in book order, reference
times one minute apart from a fixed date so that its prompts, and so the run's
cache, do not depend on the day). graphiti's LLM (entity and fact extraction,
deduplication, dates, summaries: structured outputs, `response_format`
json_schema) and its embedder are OpenAI clients pointed at Tulving's endpoint
on loopback; the graph lives in a Kuzu database in the workdir. A question is
answered by graphiti's hybrid search (BM25 over Kuzu's full-text indexes,
cosine over the facts' embeddings, reciprocal rank fusion: no cross-encoder
call): the facts found, each with the chapter of the episode it came from.

Two defects of graphiti-core 0.31's deprecated Kuzu backend are worked round
here: `KuzuDriver.build_indices_and_constraints` creates no full-text index
(its search then fails: "Table RelatesToNode_ doesn't have an index with name
edge_name_and_fact"), so they are created as graphiti's own queries
define them; and a `group_id` makes `add_episode` read a `_database` the Kuzu
driver lacks, so the default group is used (one book per database).

Telemetry off: GRAPHITI_TELEMETRY_ENABLED=false before graphiti is imported.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from engine.benchmark.memory.adapters.chunks import paragraphs, top_k
from engine.benchmark.memory.contract import Budget, Chapter, MemoryError, MemoryServices, MemorySystem, Passage, Recall

if TYPE_CHECKING:
    from graphiti_core import Graphiti

BOOK_TIME = datetime(2000, 1, 1, tzinfo=UTC)  # episode k at BOOK_TIME + k minutes: book order, no clock


class GraphitiMemory(MemorySystem):
    """graphiti's knowledge graph on Kuzu: a chapter per episode, facts recalled."""

    description = "graphiti (graphiti-core) on embedded Kuzu: a knowledge graph an LLM builds, one episode per chapter"
    requires = ("graphiti_core", "kuzu")
    concurrency = 1  # one Kuzu database, one connection
    openai_endpoint = True

    def __init__(self, name: str = "", options: Mapping[str, object] | None = None):
        super().__init__(name, options)
        self._graph: Graphiti | None = None
        self._chapter_of: dict[str, int] = {}  # episode uuid -> chapter

    @property
    def graph(self) -> Graphiti:
        if self._graph is None:
            raise MemoryError(self.name, "open", "used before open()")
        return self._graph

    async def open(self, services: MemoryServices) -> None:
        await super().open(services)
        if services.openai_base_url is None or services.openai_api_key is None:
            raise MemoryError(self.name, "open", "graphiti needs the run's OpenAI-compatible endpoint on loopback")
        chat_model, embed_model = services.chat_model, services.embed_model
        if embed_model is None or chat_model is None:
            raise MemoryError(self.name, "open", "graphiti needs a chat model (--memory-model) and an embedding "
                                                 "model (--embed-model)")
        dims = self.options.get("embedding_dims")
        if not isinstance(dims, int):
            dims = int((await services.embed(["How many dimensions has this embedding?"])).shape[1])
        workdir = Path(services.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        endpoint = Endpoint(services.openai_base_url, services.openai_api_key, chat_model, embed_model)
        self._graph = make_graph(endpoint, workdir / "graph.kuzu", dims)
        await self._graph.build_indices_and_constraints()
        await _full_text_indexes(self._graph)

    async def ingest(self, chapters: Sequence[Chapter]) -> None:
        from graphiti_core.nodes import EpisodeType

        for chapter in chapters:
            added = await self.graph.add_episode(
                name=f"Chapter {chapter.id}", episode_body="\n\n".join(paragraphs(chapter)), source=EpisodeType.text,
                source_description="a chapter of a book", reference_time=BOOK_TIME + timedelta(minutes=chapter.id))
            self._chapter_of[added.episode.uuid] = chapter.id

    async def recall(self, question: str, budget: Budget) -> Recall:
        edges = await self.graph.search(question, num_results=top_k(budget, self.options))
        return Recall(passages=[Passage(text=edge.fact, chapter=self._chapter(edge.episodes)) for edge in edges])

    def _chapter(self, episodes: Sequence[str]) -> int | None:
        """The chapter of the first episode a fact came from (graphiti merges the same fact across episodes)."""
        return next((self._chapter_of[e] for e in episodes if e in self._chapter_of), None)

    async def close(self) -> None:
        graph, self._graph = self._graph, None
        if graph is not None:
            close: Callable[[], Awaitable[None]] = graph.close  # graphiti's close() has no annotations
            await close()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where graphiti's clients call, and which models."""

    base_url: str
    api_key: str
    chat_model: str
    embed_model: str


def make_graph(endpoint: Endpoint, path: Path, dims: int) -> Graphiti:
    """Graphiti on a Kuzu database at `path`, every model call through the run's endpoint."""
    os.environ["GRAPHITI_TELEMETRY_ENABLED"] = "false"
    from graphiti_core import Graphiti
    from graphiti_core.cross_encoder.openai_reranker_client import OpenAIRerankerClient
    from graphiti_core.driver.kuzu_driver import KuzuDriver
    from graphiti_core.embedder.openai import OpenAIEmbedder, OpenAIEmbedderConfig
    from graphiti_core.llm_client.config import LLMConfig
    from graphiti_core.llm_client.openai_generic_client import OpenAIGenericClient

    llm = LLMConfig(api_key=endpoint.api_key, base_url=endpoint.base_url, model=endpoint.chat_model,
                    small_model=endpoint.chat_model)
    embedder = OpenAIEmbedderConfig(api_key=endpoint.api_key, base_url=endpoint.base_url,
                                    embedding_model=endpoint.embed_model, embedding_dim=dims)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "The Kuzu backend is deprecated"
        driver = KuzuDriver(db=str(path))
    # The reranker is never called: the default search fuses rankings (RRF) without a cross-encoder.
    return Graphiti(graph_driver=driver, llm_client=OpenAIGenericClient(config=llm),
                    embedder=OpenAIEmbedder(config=embedder), cross_encoder=OpenAIRerankerClient(config=llm))


async def _full_text_indexes(graph: Graphiti) -> None:
    """The full-text indexes graphiti's Kuzu search needs and its Kuzu driver does not create."""
    from graphiti_core.driver.driver import GraphProvider
    from graphiti_core.graph_queries import get_fulltext_indices

    for query in get_fulltext_indices(GraphProvider.KUZU):
        await graph.driver.execute_query(query)
