"""The evidence budget is counted in each answering model's tokenizer: an
OpenAI model that uses o200k_base (served here by the loopback server, an
`openai` endpoint on 127.0.0.1) has its rows' evidence cut and counted in
o200k_base, the built-in reader's in cl100k_base, in the same run; the
memory system is recalled once, handed the loosest of the two budgets; the
paper's budget, computed in each tokenizer, still never cuts the paper's
RAG modes. Token counts are checked against bpe_openai directly."""
from __future__ import annotations

import bpe_openai
import pytest

from engine.benchmark.evaluation import answers as A
from engine.benchmark.evaluation import pipeline
from engine.benchmark.evaluation.report import leaderboard_text, summarize
from engine.benchmark.memory.budget import loosest, paper_budget
from engine.benchmark.memory.contract import Budget, MemorySpec
from engine.benchmark.memory.registry import memory_specs
from engine.benchmark.memory.session import MemorySettings
from engine.config import Config
from engine.loopback.server import LoopbackServer
from engine.scheduler import Engine
from engine.tokens import CL100K_BASE, O200K_BASE, encoding_of_model
from tests.test_memory_systems import KeywordMemory

O200K = bpe_openai.get_encoding("o200k_base")
CL100K = bpe_openai.get_encoding("cl100k_base")
OPENAI_READER = "loop-4o"  # gpt-4o-mini, served by the loopback server
BUILTIN_READER = "builtin:reader"


@pytest.fixture(scope="module")
def questions(short_questions):
    return short_questions[::12]


def _config(tmp_path, server) -> Config:
    path = tmp_path / "tulving.toml"
    path.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n\n'
                    f'[models.{OPENAI_READER}]\nendpoint = "loop"\nmodel = "gpt-4o-mini"\n')
    return Config.load(path)


async def _run(tmp_path, book, questions, modes, budget=None):
    KeywordMemory.received = []
    async with LoopbackServer(in_process=True) as server:
        config = _config(tmp_path, server)
        jobs = pipeline.plan_jobs(questions, [OPENAI_READER, BUILTIN_READER], modes)
        settings = MemorySettings(specs={**memory_specs(), "kw": MemorySpec(name="kw", origin="test", make=KeywordMemory)},
                                  workdir=tmp_path / "memory", chat_model=BUILTIN_READER, embed_model="local:minilm",
                                  budget=budget)
        async with Engine(config, cache_path=str(tmp_path / "cache.sqlite")) as engine:
            return await pipeline.evaluate(engine, config, book, questions, jobs, judge="builtin:judge",
                                           embed_model="local:minilm", memory=settings)


def _counted(records, encoding) -> list[int]:
    return [sum(len(encoding.encode(p["text"])) for p in r.evidence) for r in records]


async def test_each_readers_rows_are_cut_and_counted_in_its_own_tokenizer(tmp_path, short_book, questions):
    ev = await _run(tmp_path, short_book, questions, ["kw"])
    rows = {model: sorted((r for r in ev.records if r.model == model), key=lambda r: r.q_idx)
            for model in (OPENAI_READER, BUILTIN_READER)}
    assert all(len(records) == len(questions) for records in rows.values())
    openai_rows, builtin_rows = rows[OPENAI_READER], rows[BUILTIN_READER]
    # The OpenAI model's evidence tokens are o200k_base's count of the passages it was given, not cl100k_base's.
    assert [r.evidence_tokens for r in openai_rows] == _counted(openai_rows, O200K)
    assert [r.evidence_tokens for r in openai_rows] != _counted(openai_rows, CL100K)
    # The built-in reader, in the same run, keeps cl100k_base's count.
    assert [r.evidence_tokens for r in builtin_rows] == _counted(builtin_rows, CL100K)
    # Every row was cut (the system returns 40 passages) and the cut counted in the row's tokenizer.
    assert all(r.evidence_cut > 0 and r.evidence_cut_tokens > 0 for r in openai_rows + builtin_rows)
    # The system was asked each question once, whatever the number of readers.
    assert len([r for r in KeywordMemory.received if r[0] == "recall"]) == len({q.question for q in questions})


async def test_the_system_gets_the_loosest_budget_and_each_row_its_readers(tmp_path, short_book, questions):
    ev = await _run(tmp_path, short_book, questions, ["kw", A.RAG_PARAGRAPH])
    everyone = short_book_questions(short_book)
    budgets = {t: paper_budget(short_book.text, everyone, t) for t in (CL100K_BASE, O200K_BASE)}
    assert budgets[CL100K_BASE].tokens != budgets[O200K_BASE].tokens
    handed = loosest(budgets.values())
    assert {r[2] for r in KeywordMemory.received if r[0] == "recall"} == {handed}
    for record in ev.records:
        own = budgets[O200K_BASE if record.model == OPENAI_READER else CL100K_BASE]
        assert len(record.evidence_chapters) <= own.passages and record.evidence_tokens <= own.tokens
        if record.mode == A.RAG_PARAGRAPH:
            assert record.evidence_cut == 0  # the paper's budget, in the reader's tokenizer, never cuts its modes

    from engine.cli.run_memories import memory_record

    entry = memory_record(ev, None)["kw"]
    assert entry["budget"] == {"passages": handed.passages, "tokens": handed.tokens, "tokenizer": handed.tokenizer}
    assert entry["budgets"] == {
        BUILTIN_READER: {"passages": 12, "tokens": budgets[CL100K_BASE].tokens, "tokenizer": CL100K_BASE},
        OPENAI_READER: {"passages": 12, "tokens": budgets[O200K_BASE].tokens, "tokenizer": O200K_BASE}}
    summary = summarize(ev.records, {"memory": memory_record(ev, None), "jobs": []})
    labels = {(r["model"], r["mode"]): r["memory"]["budget"] for r in summary["runs"]}
    assert labels[(OPENAI_READER, "kw")] == f"12 passages / {budgets[O200K_BASE].tokens:,} tokens (o200k_base)"
    assert labels[(BUILTIN_READER, "kw")] == f"12 passages / {budgets[CL100K_BASE].tokens:,} tokens (cl100k_base)"
    # One budget, counted in each reader's tokens: the rows are not set apart.
    assert "different evidence budgets" not in leaderboard_text(summary)


async def test_a_set_budget_is_counted_in_each_readers_tokens(tmp_path, short_book, questions):
    ev = await _run(tmp_path, short_book, questions, ["kw"], budget=Budget(passages=None, tokens=300))
    assert all(0 < r.evidence_tokens <= 300 for r in ev.records)
    openai_rows = [r for r in ev.records if r.model == OPENAI_READER]
    assert [r.evidence_tokens for r in openai_rows] == _counted(openai_rows, O200K)
    assert {r[2] for r in KeywordMemory.received if r[0] == "recall"} == {Budget(12, 300, CL100K_BASE)}


def short_book_questions(book):
    from engine.benchmark.evaluation.questions import build_questions

    return build_questions(book)


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4o-mini-2024-07-18", "chatgpt-4o-latest", "gpt-4.1",
                                   "gpt-4.1-nano-2025-04-14", "gpt-4.5-preview", "gpt-5", "gpt-5-mini", "gpt-5.1",
                                   "o1", "o1-mini-2024-09-12", "o3", "o3-mini", "o4-mini", "gpt-6-luna",
                                   "gpt-6.1-terra", "openai/gpt-4o", "ft:gpt-4o-mini:org::abc"])
def test_openais_o200k_models(model):
    assert encoding_of_model(model) == O200K_BASE


@pytest.mark.parametrize("model", ["gpt-4", "gpt-4-turbo", "gpt-3.5-turbo", "claude-sonnet-5-5", "gemini-2.5-pro",
                                   "grok-4", "deepseek-chat", "reader", "SmolLM2-360M-Instruct-Q8_0.gguf", "o100"])
def test_other_models_are_counted_in_cl100k_the_stand_in(model):
    assert encoding_of_model(model) == CL100K_BASE


def test_the_encodings_count_as_bpe_openai_does():
    from engine.tokens import count_tokens

    text = "Eleanor Rigby met Marcus in the Central Park on 2026-11-28, naïvely."
    assert count_tokens(text) == len(CL100K.encode(text))
    assert count_tokens(text, O200K_BASE) == len(O200K.encode(text))


def _rows(*labels):
    return [{"model": f"m{n}", "mode": f"s{n}", "memory": {"budget": label}} for n, label in enumerate(labels)]


def test_rows_differing_only_in_their_readers_tokenizer_are_not_set_apart():
    from engine.benchmark.evaluation.memory_report import budget_note

    same = _rows("12 passages / 2,176 tokens (cl100k_base)", "12 passages / 2,155 tokens (o200k_base)")
    assert budget_note(same) is None
    for other in ("12 passages / 2,000 tokens (cl100k_base)", "10 passages / 2,155 tokens (o200k_base)",
                  "whole book", "12 passages"):
        note = budget_note(same + _rows(other))
        assert note is not None and other in note


def test_the_protocols_budget_names_its_tokenizer():
    import jsonschema

    from tests.test_memory_subprocess import validator

    recall = {"type": "recall", "id": "r1", "question": "Where?", "budget": Budget(3, 2000, O200K_BASE).to_json()}
    validator("toProcess").validate(recall)
    assert recall["budget"] == {"passages": 3, "tokens": 2000, "tokenizer": "o200k_base"}
    del recall["budget"]["tokenizer"]
    with pytest.raises(jsonschema.ValidationError):
        validator("toProcess").validate(recall)
