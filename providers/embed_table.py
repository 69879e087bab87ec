"""Precomputed sentence embeddings, shipped for the published default book.

A pre-seeded cache for the offline embedder (`local-embed`): the vectors
all-MiniLM-L6-v2 gives for the RAG chunks (chapter and paragraph) and the
questions of `synaptic-echoes-short`, so that a cold RAG run on the default
book does not spend 10-50 s embedding them on 2 cores before its first call.

It is content-addressed, so it can never answer for another text: a text is
found by the sha256 of what the encoder reads (the stripped text), and the
table is used only when the model folder's files (weights, tokenizer,
configs) hash to the digest it was computed with. A text not in it is
encoded as usual. Built by `python benchmarks/build_embed_table.py`;
tests/test_local_embed.py compares a sample against a fresh computation and
checks that it covers the book's current chunks and questions.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from providers.local_models import MINILM_FILES

TABLE_PATH = Path(__file__).parent / "data" / "minilm_published.npz"
KEY_BYTES = 16  # of the sha256: collisions among a few thousand texts are out of reach


def text_key(text: str) -> bytes:
    """The key of a text: what the encoder reads (it strips), hashed."""
    return hashlib.sha256(str(text).strip().encode("utf-8")).digest()[:KEY_BYTES]


def model_digest(folder: Path) -> str:
    """sha256 over the model folder's files the encoder reads, in a fixed order."""
    digest = hashlib.sha256()
    for name in MINILM_FILES:
        with open(folder / name, "rb") as f:
            digest.update(name.encode() + b"\0")
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class EmbedTable:
    """Vectors (n, dim) float32 and token counts of texts, by text key."""

    model_digest: str
    rows: dict[bytes, int]
    vectors: np.ndarray
    tokens: np.ndarray

    def find(self, texts: Sequence[str]) -> list[int | None]:
        """The row of each text, None where the table does not hold it."""
        return [self.rows.get(text_key(t)) for t in texts]

    def save(self, path: Path) -> None:
        keys = np.frombuffer(b"".join(self.rows), dtype=np.uint8).reshape(len(self.rows), KEY_BYTES)
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, model_digest=np.array(self.model_digest), keys=keys,
                            vectors=self.vectors.astype(np.float32), tokens=self.tokens.astype(np.int32))


def build(model_digest: str, texts: Sequence[str], vectors: np.ndarray, tokens: Sequence[int]) -> EmbedTable:
    rows = {text_key(t): i for i, t in enumerate(texts)}
    if len(rows) != len(texts):
        raise ValueError("the texts of an embedding table must be distinct once stripped")
    return EmbedTable(model_digest, rows, np.asarray(vectors, dtype=np.float32), np.asarray(tokens, dtype=np.int32))


def load(path: Path = TABLE_PATH) -> EmbedTable | None:
    """The table in `path`, or None if there is none (e.g. removed to save space)."""
    if not path.is_file():
        return None
    with np.load(path) as data:
        keys = data["keys"]
        rows = {bytes(k): i for i, k in enumerate(keys)}
        return EmbedTable(str(data["model_digest"]), rows, data["vectors"], data["tokens"])


@lru_cache(maxsize=4)
def for_folder(folder: Path, path: Path = TABLE_PATH) -> EmbedTable | None:
    """The shipped table if it was computed with the model in `folder`, else
    None; hashing the folder (~90 MB) happens once per process and folder."""
    table = load(path)
    if table is None:
        return None
    try:
        digest = model_digest(folder)
    except OSError:
        return None  # the encoder reports the missing file when it loads the model
    return table if digest == table.model_digest else None
