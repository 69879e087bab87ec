"""Answering prompts (paper, appendix "Generating answers ...") and RAG retrieval.

Expected prompt texts are typed here from the paper's listings, not taken
from the code under test.
"""
from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

from engine.benchmark.evaluation import answers as A
from engine.benchmark.evaluation import rag
from engine.config import Config
from engine.errors import TulvingError
from engine.loopback.server import LoopbackServer, hashed_embedding
from engine.scheduler import Engine

# -- prompts ---------------------------------------------------------------------------

PAPER_IN_CONTEXT_HEAD = (
    "# Episodic Memory Benchmark\n\n"
    "You are participating in an episodic memory test. You will be presented with a text to read and "
    "internalize as if you had personally experienced the events described. After the text, you will find a "
    "question about the content. Please answer this question based solely on the information provided in the "
    "text.\n\n## The Text to Memorize:\n\n")
PAPER_IN_CONTEXT_TAIL = (
    "\n\nPlease answer the question to the best of your ability, based only on the information provided in "
    "the text above. If you are unsure about an answer, it's okay to say so. Do not invent or assume "
    "information that was not explicitly stated in the text.\n")


def test_in_context_prompts_are_lazy_and_the_papers(short_book, short_questions):
    requests = A.answer_requests(short_questions, model="gpt-4o", mode=A.IN_CONTEXT, book=short_book)
    assert inspect.isgenerator(requests)  # no list of 456 book-sized prompts
    known = "Consider all events that Ezra Edwards has been involved in. List all the locations where these " \
            "events took place, without mentioning the events themselves."
    count, found = 0, False
    for q, request in zip(short_questions, requests):
        count += 1
        assert request.tag == q.q_idx
        assert request.messages[0] == {"role": "system", "content": "You are an expert in memory tests."}
        if q.question == known:
            expected = (PAPER_IN_CONTEXT_HEAD + short_book.text + "\n\n## Question:\n\n" + known
                        + PAPER_IN_CONTEXT_TAIL)
            assert request.messages[1] == {"role": "user", "content": expected}
            found = True
    assert count == len(short_questions) == 456
    assert found


def test_rag_prompt_is_the_papers():
    chunks = ["Chapter 2, Paragraph 1\n\nFirst.", "Chapter 1, Paragraph 3\n\nSecond."]
    expected = (
        "# Episodic Memory Benchmark\n\n"
        "You are participating in an episodic memory test, based on the data below, which was retrieved from a "
        "book. You need to read it and internalize as if you had personally experienced the events described. "
        "After the text, you will find a question about the content. Please answer this question based solely "
        "on the information provided in the retrieved data.\n\n"
        "## Retrieved Relevant Chunks from the Book:\n\n"
        '\n\n"""\nChapter 2, Paragraph 1\n\nFirst.\n"""\n\n"""\nChapter 1, Paragraph 3\n\nSecond.\n"""'
        "\n\n## Question:\n\nWhere?\n\n"
        "Please answer the question to the best of your ability, based only on the information provided in the "
        "relevant chunks above. If you are unsure about an answer, it's okay to say so. Do not invent or assume "
        "information that was not explicitly stated in the text.\n")
    assert A.rag_prompt(chunks, "Where?") == expected


def test_finetuned_prompt_is_the_question_only(short_book):
    expected = ('This question is about the book "Synaptic Echoes 2026: The Neuro-Temporal Paradox of Episodic '
                'Precognition". All events in this book are purely fictional and do not correspond to real-world '
                'timelines. Please answer based solely on the content of this fictional story./n/n Question: Who?')
    assert A.finetuned_prompt("Who?", A.book_title(short_book)) == expected


def test_unknown_mode_is_a_clear_error(short_book):
    with pytest.raises(TulvingError, match="unknown memory mode 'rag'"):
        next(A.answer_requests([], model="m", mode="rag", book=short_book), None)


# -- chunks and top-K ------------------------------------------------------------------------

def test_chunk_counts_and_top_k(long_book, long_questions, short_book, short_questions):
    assert len(rag.chapter_chunks(long_book.text)) == 196
    paragraphs = rag.paragraph_chunks(long_book.text)
    assert len(paragraphs) == sum(c["nb_paragraphs"] for c in long_book.chapters)
    assert paragraphs[0].startswith("Chapter 1, Paragraph 1\n\nThe harsh glare")
    last = long_book.chapters[-1]
    assert paragraphs[-1].startswith(f"Chapter 196, Paragraph {last['nb_paragraphs']}\n\n")
    assert rag.top_k(long_questions, A.RAG_CHAPTER) == 17
    assert rag.top_k(long_questions, A.RAG_PARAGRAPH) == 68
    assert rag.top_k(short_questions, A.RAG_CHAPTER) == 3
    assert rag.top_k(short_questions, A.RAG_PARAGRAPH) == 12
    assert len(rag.chapter_chunks(short_book.text)) == 19


# -- retrieval through the engine, embeddings from an OpenAI-format server ------------------

def loopback_config(tmp_path, server) -> Config:
    path = tmp_path / "tulving.toml"
    path.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n\n'
                    '[models.loop-embed]\nendpoint = "loop"\nmodel = "text-embedding-3-small"\n')
    return Config.load(path)


async def test_retrieval_through_the_engine_is_cached(tmp_path, short_book, short_questions):
    async with LoopbackServer(in_process=True, embed_dim=256) as server:
        config = loopback_config(tmp_path, server)
        cache = str(tmp_path / "cache.sqlite")
        async with Engine(config, cache_path=cache) as engine:
            got = await rag.retrieve(engine, short_book.text, short_questions, A.RAG_PARAGRAPH, "loop-embed")
        calls = server.stats.by_path["/v1/embeddings"]
        assert calls >= 2  # chunks and questions, in batches

        # Independent check: the server's vectors, cosine with numpy, best first.
        chunks = rag.paragraph_chunks(short_book.text)
        c = np.array([hashed_embedding(t, 256) for t in chunks])
        for q in short_questions[:40]:
            v = np.array(hashed_embedding(q.question, 256))
            sims = c @ v / (np.linalg.norm(c, axis=1) * np.linalg.norm(v))
            expected_top = sorted(range(len(chunks)), key=lambda i: (-sims[i], i))[:12]
            assert np.allclose(sims[got.ranked[q.question]], sims[expected_top])
            assert got.chunks_for(q.question)[0] == chunks[got.ranked[q.question][0]]
            assert len(got.chunks_for(q.question)) == 12

        async with Engine(config, cache_path=cache) as engine:  # rerun: all from the cache
            again = await rag.retrieve(engine, short_book.text, short_questions, A.RAG_PARAGRAPH, "loop-embed")
        assert server.stats.by_path["/v1/embeddings"] == calls
        assert again.ranked == got.ranked


# -- fitting a small context ------------------------------------------------------------------

def test_fit_drops_least_similar_chunks_for_the_local_model(long_book):
    alias = Config.load().alias("local:smollm2")
    assert alias.context_tokens == 8192
    chunks = sorted(rag.paragraph_chunks(long_book.text), key=len, reverse=True)[:68]  # worst case
    question = "Think about all events that have occurred at Central Park. Provide a list of all dates."
    max_out = alias.params["max_tokens"]
    kept = rag.fit_chunks(chunks, question, context_tokens=alias.context_tokens, max_output_tokens=max_out)
    assert 0 < len(kept) < len(chunks)
    assert kept == chunks[:len(kept)]  # dropped from the least similar end
    budget = rag.prompt_budget(alias.context_tokens, max_out)
    assert rag.estimate_tokens(A.rag_prompt(kept, question)) <= budget
    assert rag.estimate_tokens(A.rag_prompt(chunks[:len(kept) + 1], question)) > budget * 0.98
    # Models without a context limit keep all.
    assert rag.fit_chunks(chunks, question, context_tokens=None) == chunks


def test_fitted_prompt_fits_smollm2s_own_tokenizer(long_book):
    llama_cpp = pytest.importorskip("llama_cpp")
    from providers.local_models import gguf_path

    model = llama_cpp.Llama(str(gguf_path("smollm2", {})), vocab_only=True, verbose=False)
    chunks = sorted(rag.paragraph_chunks(long_book.text), key=len, reverse=True)[:68]
    question = "Think about all events that have occurred at Central Park. Provide a list of all dates."
    kept = rag.fit_chunks(chunks, question, context_tokens=8192, max_output_tokens=256)
    text = A.SYSTEM_PROMPT + A.rag_prompt(kept, question)
    n = len(model.tokenize(text.encode(), add_bos=True)) + 32  # + chat template markup
    assert n + 256 <= 8192


def test_nothing_fits_is_a_clear_error():
    with pytest.raises(TulvingError, match="context"):
        rag.fit_chunks(["a chunk"], "What?", context_tokens=300, max_output_tokens=256, model="tiny")


def test_whole_book_too_long_for_the_context(long_book, short_book):
    config = Config.load()
    with pytest.raises(TulvingError, match=r"local:smollm2 has a 8192-token context.*rag-paragraph"):
        rag.check_in_context_fits(config.alias("local:smollm2"), long_book.n_tokens)
    with pytest.raises(TulvingError):  # the short book (10,397 tokens) does not fit 8,192 either
        rag.check_in_context_fits(config.alias("local:smollm2"), short_book.n_tokens)
    rag.check_in_context_fits(config.alias("gpt-4o"), long_book.n_tokens)  # 128k: fits
    assert math.isclose(long_book.n_tokens, 102_870, abs_tol=0)
