"""The evaluation pipeline through the real engine: answers, streaming
judgments, judge re-draws and failures, answer errors, scores."""
from __future__ import annotations

import pytest

from engine.benchmark.builtin import judge as builtin_judge
from engine.benchmark.evaluation import answers as A
from engine.benchmark.evaluation import pipeline
from engine.benchmark.evaluation.judge import judge_request
from engine.benchmark.evaluation.questions import build_questions
from engine.benchmark.evaluation.report import summarize
from engine.config import Config
from engine.errors import TulvingError
from engine.loopback.server import LoopbackServer
from engine.scheduler import Engine

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["judge", "answerer"]


@pytest.fixture(scope="module")
def book(short_book):
    return short_book


@pytest.fixture(scope="module")
def questions(short_questions):
    qs = short_questions
    picked = qs[::6]  # spread over templates and bins
    assert any(q.get == "chronological" and len(q.correct_answer) >= 2 for q in picked)
    return picked


def loop_config(tmp_path, server, judge_model="judge") -> Config:
    path = tmp_path / "tulving.toml"
    path.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n'
                    'max_concurrency = 8\nmax_attempts = 2\n\n'
                    f'[models.loop-judge]\nendpoint = "loop"\nmodel = "{judge_model}"\n\n'
                    '[models.loop-answerer]\nendpoint = "loop"\nmodel = "answerer"\n')
    return Config.load(path)


async def evaluate(config, book, questions, tmp_path, *, model="builtin:reader", mode=A.IN_CONTEXT,
                   judge="builtin:judge", engine_wrapper=None):
    jobs = pipeline.plan_jobs(questions, [model], [mode])
    async with Engine(config, cache_path=str(tmp_path / "cache.sqlite")) as engine:
        target = engine_wrapper(engine) if engine_wrapper else engine
        return await pipeline.evaluate(target, config, book, questions, jobs, judge=judge)


async def test_reader_and_judge_score_every_question(tmp_path, book, questions):
    ev = await evaluate(Config.load(), book, questions, tmp_path)
    assert [r.q_idx for r in ev.records] == sorted(q.q_idx for q in questions)
    assert all(r.f1 is not None and 0.0 <= r.f1 <= 1.0 for r in ev.records)
    assert all(r.answer and r.judge_reply and r.judge_draws == 1 for r in ev.records)
    chrono = [r for r in ev.records if r.get == "chronological"]
    assert chrono and all(r.exact_match is not None for r in chrono)
    assert any(r.chrono_reply for r in chrono)  # the second judge call happened
    stats = ev.stats[("builtin:reader", A.IN_CONTEXT)]
    assert stats.calls == len(questions) + len(questions) + sum(1 for r in chrono if r.chrono_reply)
    summary = summarize(ev.records)
    [row] = summary["runs"]
    assert 0 < row["simple_recall"] <= 1 and row["judge_failures"] == 0 and row["scored"] == len(questions)


class RecordingEngine:
    """Passes everything to the engine, noting the order requests are pulled in."""

    def __init__(self, engine):
        self.engine, self.pulled = engine, []

    def stream(self, requests, **kw):
        def note():
            for r in requests:
                self.pulled.append(r.tag[0] if isinstance(r.tag, tuple) else "other")
                yield r
        return self.engine.stream(note(), **kw)

    async def run(self, requests, **kw):
        return await self.engine.run(requests, **kw)

    def expect(self, calls):
        self.engine.expect(calls)


async def test_judgments_stream_while_answers_are_still_coming(tmp_path, book):
    questions = build_questions(book)  # 456: many more than the engine's window
    recorder = {}

    def wrap(engine):
        recorder["r"] = RecordingEngine(engine)
        return recorder["r"]

    await evaluate(Config.load(), book, questions, tmp_path, engine_wrapper=wrap)
    pulled = recorder["r"].pulled
    last_answer = max(i for i, kind in enumerate(pulled) if kind == "answer")
    first_judge = pulled.index("judge")
    assert first_judge < last_answer
    assert pulled.count("answer") == len(questions) == pulled.count("judge")


async def test_unparsable_judge_reply_is_drawn_again(tmp_path, book, questions):
    seen: dict[str, int] = {}

    def flaky(api, body):  # garbage the first time a prompt is seen, then a real verdict
        key = body["messages"][-1]["content"]
        seen[key] = seen.get(key, 0) + 1
        return "I refuse to output JSON." if seen[key] == 1 else builtin_judge.respond(body["messages"], {})

    async with LoopbackServer(in_process=True, models=SERVED, reply=flaky) as server:
        config = loop_config(tmp_path, server)
        ev = await evaluate(config, book, questions, tmp_path, judge="loop-judge")
    (tmp_path / "ref").mkdir()
    reference = await evaluate(Config.load(), book, questions, tmp_path / "ref")
    assert all(r.judge_draws == 2 and not r.judge_failed for r in ev.records)
    assert [r.f1 for r in ev.records] == [r.f1 for r in reference.records]


async def test_judge_that_never_parses_gives_failures_not_a_crash(tmp_path, book, questions):
    async with LoopbackServer(in_process=True, models=SERVED, reply=lambda api, body: "garbage, no JSON here") as server:
        config = loop_config(tmp_path, server)
        ev = await evaluate(config, book, questions, tmp_path, judge="loop-judge")
        sent = server.stats.by_path["/v1/chat/completions"]
    assert all(r.judge_failed and r.f1 is None and r.judge_draws == 1 + pipeline.JUDGE_REDRAWS
               for r in ev.records)
    # Each distinct judge prompt is sent once per draw (identical ones are shared).
    by_idx = {q.q_idx: q for q in questions}
    prompts = {judge_request(by_idx[r.q_idx], r.answer, book=book, model="loop-judge").messages[-1]["content"]
               for r in ev.records}
    assert sent == len(prompts) * (1 + pipeline.JUDGE_REDRAWS)
    assert "unparsable judge reply after 4 draws" in ev.records[0].judge_error
    [row] = summarize(ev.records)["runs"]
    assert row["judge_failures"] == len(questions) and row["scored"] == 0 and row["simple_recall"] is None


async def test_failed_answers_are_recorded_and_not_judged(tmp_path, book, questions):
    async with LoopbackServer(in_process=True, models=SERVED, context_tokens=50) as server:  # every in-context prompt is too long
        config = loop_config(tmp_path, server)
        ev = await evaluate(config, book, questions[:5], tmp_path, model="loop-answerer")
    assert all(r.answer_error and r.f1 is None and r.judge_draws == 0 for r in ev.records)
    [row] = summarize(ev.records)["runs"]
    assert row["answer_errors"] == 5


async def test_too_long_book_is_refused_before_any_call(tmp_path, book, questions):
    config = Config.load()
    jobs = pipeline.plan_jobs(questions, ["local:smollm2"], [A.IN_CONTEXT])
    with pytest.raises(TulvingError, match="8192-token context"):
        pipeline.check_jobs(config, book, jobs, "builtin:judge", None)


def test_sample_is_spread_over_the_set(questions):
    sample = pipeline.sample_questions(questions, 7)
    assert len(sample) == 7 and sample[0] is questions[0]
    assert len({q.template for q in sample}) == 7
    assert pipeline.sample_questions(questions, 10_000) == list(questions)


class IndexWatchingEngine(RecordingEngine):
    """Also notes when the RAG index's embeddings are asked for and answered."""

    def __init__(self, engine):
        super().__init__(engine)
        self.config = engine.config

    async def run(self, requests, **kw):
        self.pulled.append("embed asked")
        outcomes = await self.engine.run(requests, **kw)
        self.pulled.append("embed answered")
        return outcomes


async def test_in_context_answers_go_out_while_the_rag_index_is_embedded(tmp_path, book, questions):
    from engine.loopback.server import constant

    async with LoopbackServer(in_process=True, embed_dim=64, latency=constant(0.2), models=["text-embedding-3-small"]) as server:
        path = tmp_path / "tulving.toml"
        path.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n\n'
                        '[models.loop-embed]\nendpoint = "loop"\nmodel = "text-embedding-3-small"\n')
        config = Config.load(path)
        jobs = pipeline.plan_jobs(questions, ["builtin:reader"], [A.IN_CONTEXT, A.RAG_PARAGRAPH])
        async with Engine(config, cache_path=str(tmp_path / "cache.sqlite")) as engine:
            watched = IndexWatchingEngine(engine)
            ev = await pipeline.evaluate(watched, config, book, questions, jobs, judge="builtin:judge",
                                         embed_model="loop-embed")
    first_answer = watched.pulled.index("answer")
    last_embedding = len(watched.pulled) - 1 - watched.pulled[::-1].index("embed answered")
    assert first_answer < last_embedding  # the in-context job did not wait for the index
    assert {(r.mode, r.q_idx) for r in ev.records} == {(m, q.q_idx) for m in (A.IN_CONTEXT, A.RAG_PARAGRAPH) for q in questions}
    assert ev.retrieval_calls > 0 and all(r.answer for r in ev.records)
