"""Memory systems through the real pipeline and engine (built-in reader and
judge, SQLite cache on disk): the paper's modes through the contract give
exactly the prompts they gave before; outside systems receive chapters and
question texts only; the budget cuts and counts; agent-style answers go to
the judge; a failing, hanging or misbehaving system is named with its phase
while the rest of the run goes on."""
from __future__ import annotations

import asyncio

import pytest

from engine.benchmark.evaluation import answers as A
from engine.benchmark.evaluation import pipeline, rag
from engine.benchmark.evaluation.report import leaderboard_text, summarize
from engine.benchmark.memory.budget import Budget, coverage, paper_budget, within_budget
from engine.benchmark.memory.builtin import book_text
from engine.benchmark.memory.contract import Chapter, MemorySpec, MemorySystem, Passage, Recall
from engine.benchmark.memory.registry import memory_specs
from engine.benchmark.memory.session import MemorySettings
from engine.config import Config
from engine.requests import ChatRequest
from engine.scheduler import Engine


@pytest.fixture(scope="module")
def questions(short_questions):
    return short_questions[::8]  # spread over templates and bins


class RecordingEngine:
    """The engine, with the answering prompts it was asked kept aside."""

    def __init__(self, engine):
        self.engine, self.config, self.prompts = engine, engine.config, []

    def expect(self, n):
        self.engine.expect(n)

    async def run(self, requests, **kw):
        return await self.engine.run(requests, **kw)

    async def stream(self, requests, **kw):
        def noted():
            for r in requests:
                if isinstance(r, ChatRequest) and r.tag and r.tag[0] == "answer":
                    self.prompts.append(r.messages[-1]["content"])
                yield r
        async for outcome in self.engine.stream(noted(), **kw):
            yield outcome


async def _evaluate(tmp_path, book, questions, modes, *, specs=None, budget=None, embed="local:minilm",
                    model="builtin:reader", wrap=None):
    config = Config.load()
    jobs = pipeline.plan_jobs(questions, [model], modes)
    all_specs = {**memory_specs(), **(specs or {})}
    settings = MemorySettings(specs=all_specs, workdir=tmp_path / "memory", chat_model=model, embed_model=embed,
                              budget=budget)
    async with Engine(config, cache_path=str(tmp_path / "cache.sqlite")) as engine:
        target = wrap(engine) if wrap else engine
        ev = await pipeline.evaluate(target, config, book, questions, jobs, judge="builtin:judge",
                                     embed_model=embed, memory=settings)
    return ev, target


# -- the paper's modes, through the contract ---------------------------------------------------

def test_the_chapters_join_back_to_the_book_byte_for_byte(short_book, long_book):
    for book in (short_book, long_book):
        chapters = [Chapter(id=k, text=t) for k, t in enumerate(book.chapter_texts, 1)]
        assert book_text(chapters) == book.text


async def test_built_in_modes_send_the_papers_prompts(tmp_path, short_book, questions):
    """Every answering prompt equals the one answers.py builds (in-context,
    fine-tuned, no-memory) or the one the reference's retrieval gives (RAG),
    and nothing else is sent."""
    modes = [A.IN_CONTEXT, A.FINETUNED, A.NO_MEMORY, A.RAG_PARAGRAPH, A.RAG_CHAPTER]
    ev, rec = await _evaluate(tmp_path, short_book, questions, modes, wrap=RecordingEngine)
    expected = []
    for mode in (A.IN_CONTEXT, A.FINETUNED, A.NO_MEMORY):
        expected += [r.messages[-1]["content"]
                     for r in A.answer_requests(questions, model="builtin:reader", mode=mode, book=short_book)]
    by_mode = {mode: {r.q_idx: r for r in ev.records if r.mode == mode} for mode in modes}
    async with Engine(Config.load(), cache_path=str(tmp_path / "cache.sqlite")) as engine:
        for mode in (A.RAG_PARAGRAPH, A.RAG_CHAPTER):
            reference = await rag.retrieve(engine, short_book.text, short_book_questions(short_book), mode,
                                           "local:minilm")
            for q in questions:
                chunks = reference.chunks_for(q.question)
                expected.append(A.rag_prompt(chunks, q.question))
                record = by_mode[mode][q.q_idx]
                assert record.n_chunks == len(chunks)
                assert record.evidence_cut == 0  # the paper's budget never cuts the paper's modes
                assert record.evidence_chapters == [int(c.split("\n")[0].split(",")[0].split()[1]) for c in chunks]
    assert sorted(rec.prompts) == sorted(expected)


def short_book_questions(book):
    from engine.benchmark.evaluation.questions import build_questions

    return build_questions(book)


def test_the_papers_budget_holds_both_rag_modes(short_book, long_book, short_questions, long_questions):
    for book, questions in ((short_book, short_questions), (long_book, long_questions)):
        budget = paper_budget(book.text, questions)
        assert budget.passages == rag.top_k(questions, A.RAG_PARAGRAPH)
        for mode in (A.RAG_PARAGRAPH, A.RAG_CHAPTER):
            chunks = rag.chunks_for_mode(book.text, mode)
            biggest = sorted(chunks, key=lambda c: -len(c))[:rag.top_k(questions, mode)]
            ev = within_budget([Passage(c) for c in biggest], budget)
            assert ev.cut_passages == 0


def test_budget_cuts_whole_passages_from_the_end_and_counts_them():
    passages = [Passage(text="alpha beta gamma", chapter=1), Passage(text="delta " * 50, chapter=2),
                Passage(text="epsilon", chapter=3)]
    ev = within_budget(passages, Budget(passages=None, tokens=20))
    assert [p.chapter for p in ev.passages] == [1]
    assert ev.cut_passages == 2 and ev.cut_tokens > 50 and ev.tokens <= 20
    ev = within_budget(passages, Budget(passages=2, tokens=None))
    assert ev.chapters == [1, 2] and ev.cut_passages == 1


def test_coverage_of_the_ground_truth_chapters():
    assert coverage([3, 3, 5, None], [3, 7]) == (0.5, 0.5)
    assert coverage([], [1]) == (0.0, None)
    assert coverage([1, 2], []) == (None, 0.0)


# -- outside systems -----------------------------------------------------------------------------

class KeywordMemory(MemorySystem):
    """A tiny outside system: paragraphs ranked by words shared with the question."""

    received: list = []
    concurrency = 4

    async def ingest(self, chapters):
        type(self).received.append(("ingest", [(type(c), c.id, c.text) for c in chapters]))
        self.paragraphs = [(c.id, p) for c in chapters for p in c.text.split("\n\n") if p.strip()]

    async def recall(self, question, budget):
        type(self).received.append(("recall", question, budget))
        words = set(question.lower().split())
        ranked = sorted(self.paragraphs, key=lambda cp: -len(words & set(cp[1].lower().split())))
        return Recall(passages=[Passage(text=p, chapter=k) for k, p in ranked[:40]])


def _spec(name, cls):
    return {name: MemorySpec(name=name, origin="test", make=cls)}


async def test_an_outside_system_gets_chapters_and_question_texts_only(tmp_path, short_book, questions):
    KeywordMemory.received = []
    ev, _ = await _evaluate(tmp_path, short_book, questions, ["kw"], specs=_spec("kw", KeywordMemory))
    ingests = [r for r in KeywordMemory.received if r[0] == "ingest"]
    recalls = [r for r in KeywordMemory.received if r[0] == "recall"]
    assert len(ingests) == 1 and ingests[0][1] == [(Chapter, k, t) for k, t in enumerate(short_book.chapter_texts, 1)]
    asked = [r[1] for r in recalls]
    assert sorted(asked) == sorted(q.question for q in questions)  # each question's text, once
    assert asked != [q.question for q in questions]  # not in the question set's order
    assert all(isinstance(r[2], Budget) for r in recalls)
    records = [r for r in ev.records if r.mode == "kw"]
    assert len(records) == len(questions) and all(r.f1 is not None for r in records)
    budget = paper_budget(short_book.text, short_book_questions(short_book))
    assert all(len(r.evidence_chapters) <= budget.passages and r.evidence_tokens <= budget.tokens for r in records)
    assert all(r.evidence_cut > 0 for r in records)  # it returned 40 passages: cut and counted
    assert all(r.evidence and r.evidence[0]["text"] for r in records)  # an outside system's passages are kept
    assert any(r.retrieval_recall for r in records)


class AgentMemory(MemorySystem):
    answers = True

    async def ingest(self, chapters):
        self.first = chapters[0]

    async def recall(self, question, budget):
        return Recall(passages=[Passage(self.first.text, self.first.id)], answer="I do not know.")


async def test_an_agent_system_answers_itself_and_is_judged(tmp_path, short_book, questions):
    config = Config.load()
    jobs = [pipeline.Job(model=pipeline.AGENT, mode="agent-kw", questions=list(questions))]
    settings = MemorySettings(specs={**memory_specs(), **_spec("agent-kw", AgentMemory)}, workdir=tmp_path / "m")
    async with Engine(config, cache_path=str(tmp_path / "cache.sqlite")) as engine:
        ev = await pipeline.evaluate(engine, config, short_book, questions, jobs, judge="builtin:judge",
                                     memory=settings)
    assert {r.model for r in ev.records} == {"agent"}
    assert all(r.answer == "I do not know." and r.judge_reply for r in ev.records)
    assert all(row["role"] != "answer" for row in ev.spending.rows())  # no answering call was made
    assert all(r.evidence_chapters == [1] for r in ev.records)


class BrokenIngest(KeywordMemory):
    async def ingest(self, chapters):
        raise RuntimeError("index server unreachable")


class HangingRecall(KeywordMemory):
    async def recall(self, question, budget):
        await asyncio.sleep(3600)


class OneBadQuestion(KeywordMemory):
    async def recall(self, question, budget):
        if question == self.bad:
            raise ValueError("no such entity")
        return await super().recall(question, budget)


async def test_a_failing_system_is_named_with_its_phase_and_the_run_goes_on(tmp_path, short_book, questions):
    specs = {**_spec("broken", BrokenIngest), "hangs": MemorySpec(name="hangs", origin="test", make=HangingRecall,
                                                                  options={"timeout_recall": 0.05})}
    ev, _ = await _evaluate(tmp_path, short_book, questions, ["broken", "hangs", A.NO_MEMORY], specs=specs)
    failures = {name: p.failure for name, p in ev.memory.items()}
    assert "'broken' failed at ingest: RuntimeError: index server unreachable" in failures["broken"]
    assert "'hangs' failed at recall: took longer than 0.05 s" in failures["hangs"]
    for name in ("broken", "hangs"):
        rows = [r for r in ev.records if r.mode == name]
        assert len(rows) == len(questions) and all(r.answer_error and r.f1 is None for r in rows)
    assert all(r.f1 is not None for r in ev.records if r.mode == A.NO_MEMORY)  # the rest went on


async def test_one_failed_recall_fails_that_question_only(tmp_path, short_book, questions):
    OneBadQuestion.bad = questions[3].question
    ev, _ = await _evaluate(tmp_path, short_book, questions, ["one-bad"], specs=_spec("one-bad", OneBadQuestion))
    failed = [r for r in ev.records if r.answer_error]
    assert [r.q_idx for r in failed] == [questions[3].q_idx]
    assert "failed at recall: ValueError: no such entity" in failed[0].answer_error
    assert ev.memory["one-bad"].failure is None


async def test_rows_with_different_budgets_are_said_so(tmp_path, short_book, questions):
    ev, _ = await _evaluate(tmp_path, short_book, questions, [A.IN_CONTEXT, "kw"], specs=_spec("kw", KeywordMemory),
                            budget=Budget(passages=3, tokens=400))
    from engine.cli.run_memories import memory_record

    summary = summarize(ev.records, {"memory": memory_record(ev, None), "jobs": []})
    text = leaderboard_text(summary)
    assert "different evidence budgets (whole book: in-context; 3 passages / 400 tokens (cl100k_base): kw)" in text
    kw = next(r for r in summary["runs"] if r["mode"] == "kw")
    assert kw["memory"]["budget"] == "3 passages / 400 tokens (cl100k_base)" and kw["memory"]["cut_questions"] == len(questions)
    assert 0 <= kw["memory"]["retrieval_recall"] <= 1
