"""LanceDB, an embedded vector database, as a Tulving memory system.

The book's paragraphs, headed as the paper's rag-paragraph chunks ("Chapter
k, Paragraph j"), are embedded through the run's embedding model
(`services.embed`: cached, priced, counted) and written to a LanceDB table in
the system's workdir (Lance files on disk, no server), with their chapter and
paragraph numbers as columns. A question is embedded the same way and the
table searched for its nearest rows by cosine distance, top-k under the
passage budget. Without a vector index LanceDB searches exhaustively (exact);
`index = true` builds its IVF-PQ index in `ready()` (approximate; it needs
at least 256 rows).

Options (`[memories.NAME]` with `use = "lancedb"`): `unit` ("paragraph" |
"chapter"), `label` (bool), `top_k` (without a passage budget), `index`.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.benchmark.memory.adapters.chunks import option, top_k, units
from engine.benchmark.memory.contract import Budget, Chapter, MemoryError, MemoryServices, MemorySystem, Passage, Recall

if TYPE_CHECKING:
    from lancedb import AsyncConnection, AsyncTable

TABLE = "passages"
INDEX_MIN_ROWS = 256  # IVF-PQ trains its partitions and codebooks on the rows


class LanceDBMemory(MemorySystem):
    """Paragraphs in a LanceDB table, searched by cosine distance."""

    description = "LanceDB (embedded vector database): paragraphs embedded by the run's model, cosine top-k"
    requires = ("lancedb", "pyarrow")
    concurrency = 4

    def __init__(self, name: str = "", options: dict[str, object] | None = None):
        super().__init__(name, options)
        self._db: AsyncConnection | None = None
        self._table: AsyncTable | None = None

    @property
    def table(self) -> AsyncTable:
        """The passages' table, once ingested."""
        if self._table is None:
            raise MemoryError(self.name, "recall", "no table: recall before ingest()")
        return self._table

    async def open(self, services: MemoryServices) -> None:
        await super().open(services)
        if services.embed_model is None:
            raise MemoryError(self.name, "open", "LanceDB needs an embedding model (--embed-model, e.g. local:minilm)")
        option(self.name, self.options, "unit", "paragraph", ("paragraph", "chapter"))
        os.environ.setdefault("LANCEDB_LOG", "error")  # else a warning on stderr for every table it creates
        import lancedb

        folder = Path(services.workdir) / "lancedb"
        folder.mkdir(parents=True, exist_ok=True)
        self._db = await lancedb.connect_async(str(folder))

    async def ingest(self, chapters: Sequence[Chapter]) -> None:
        import pyarrow as pa

        pieces = units(chapters, str(self.options.get("unit", "paragraph")), label=bool(self.options.get("label", True)))
        vectors = await self.services.embed([p.text for p in pieces])
        if len(vectors) != len(pieces):
            raise MemoryError(self.name, "ingest", f"{len(vectors)} vectors for {len(pieces)} passages")
        width = int(vectors.shape[1])
        schema = pa.schema([pa.field("vector", pa.list_(pa.float32(), width)), pa.field("text", pa.string()),
                            pa.field("chapter", pa.int32()), pa.field("paragraph", pa.int32())])
        table = pa.Table.from_pydict({
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.astype("float32").ravel()), width),
            "text": [p.text for p in pieces], "chapter": [p.chapter for p in pieces],
            "paragraph": [p.paragraph for p in pieces]}, schema=schema)
        if self._db is None:
            raise MemoryError(self.name, "ingest", "ingest before open()")
        self._table = await self._db.create_table(TABLE, data=table, mode="overwrite")

    async def ready(self) -> None:
        if self.options.get("index") and await self.table.count_rows() >= INDEX_MIN_ROWS:
            import lancedb

            await self.table.create_index("vector", config=lancedb.index.IvfPq(distance_type="cosine"))

    async def recall(self, question: str, budget: Budget) -> Recall:
        [vector] = await self.services.embed([question])
        rows = await (self.table.query().nearest_to(vector.astype("float32")).distance_type("cosine")
                      .select(["text", "chapter", "paragraph"]).limit(top_k(budget, self.options)).to_list())
        return Recall(passages=[Passage(text=r["text"], chapter=r["chapter"], score=1.0 - float(r["_distance"]))
                                for r in rows])

    async def close(self) -> None:
        for handle in (self._table, self._db):
            if handle is not None:
                close: Callable[[], None] = handle.close  # lancedb's close() has no annotations
                close()
        self._table = self._db = None
