"""The evaluation pipeline: book -> questions -> answers -> judgments -> scores.

Every call goes through one Engine, so each answering model shares its
endpoint's limits (and cache) with the judge and with the other jobs.

A job is one (model, mode). Each job streams its requests through the engine
from `feed`: the answering requests come from a generator (in-context prompts
hold the whole book, so only the engine's in-flight window of them exists at a
time), and each judge request is queued into the same feed as soon as its
answer completes -- judging never waits for all answers. Judge requests queued
after the answers ran out (the last judgments, re-draws, chronological calls)
go out in a further round of the same kind. Jobs run concurrently.

Judging (protocol.md, Judging and scores): a judge reply that cannot be parsed
is asked again as a new draw (draw 1, 2, 3); after that the question is a
judge failure: counted and reported, left out of the scores, never a crash.
Chronological questions get the second (chronological) judge call once the
first is parsed (skipped when there is nothing to order: no ground truth or
no identified item, which can only give "no index found").

Memory: every mode is a memory system (engine/benchmark/memory/): the paper's
in-context, RAG and fine-tuned modes, the no-memory baseline and any outside
system. Each system of the run is prepared once (ingest, then a recall per
question), shared by every answering model, beside the jobs that do not
need it; a job waits only for its own system. A job whose answers are given
(an agent-style system's, or an answers file's: `Job.given`) goes straight
to the judge.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.benchmark.evaluation import answers as A
from engine.benchmark.evaluation import judge_parse, rag, scores
from engine.benchmark.evaluation.judge import chrono_judge_request, judge_request
from engine.benchmark.evaluation.judge_parse import JudgeVerdict
from engine.benchmark.evaluation.questions import Question
from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.generation.bookdir import Book
from engine.benchmark.memory.budget import Evidence, coverage
from engine.benchmark.memory.builtin import book_text
from engine.benchmark.memory.contract import BOOK, FINETUNED, Passage
from engine.benchmark.memory.runner import Prepared
from engine.benchmark.memory.session import MemorySession, MemorySettings
from engine.config import Config, ModelAlias
from engine.requests import ChatRequest, Outcome, Request, RequestSettings
from engine.resolve import resolve
from engine.spending import Spending
from engine.tokens import encoding_of_model
from providers.base import ChatResult, TulvingError

if TYPE_CHECKING:
    from engine.scheduler import Engine

JUDGE_REDRAWS = 3  # unparsable judge replies are asked again this many times
AGENT = "agent"    # the model of an agent-style memory system's rows: the system wrote the answer


# -- the feed: answers from a generator, judge follow-ups as answers complete ------

def feed(followups: deque[Request], initial: Iterator[Request]) -> Iterator[Request]:
    """The requests of one `engine.stream` round: follow-ups (judgments) queued
    while outcomes are handled go out first, then further answers. It never
    waits (the engine pulls sources inline): when both are empty it ends, and
    follow-ups queued after that go to the next round."""
    while True:
        if followups:
            yield followups.popleft()
            continue
        request = next(initial, None)
        if request is None:
            return
        yield request


# -- what a run evaluates ----------------------------------------------------------

@dataclass(frozen=True, slots=True)
class GivenAnswer:
    """An answer made elsewhere (an answers file): judged as it is."""

    answer: str
    evidence_chapters: tuple[int | None, ...] | None = None  # the chapters it used, when the file says


@dataclass(slots=True)
class Job:
    model: str                 # the answering model alias; for given answers, who gave them
    mode: str                  # the memory system (in-context, rag-paragraph, ..., no-memory, mem0, ...)
    questions: list[Question]
    sample: int | None = None  # the number of questions when run on a sample
    draw: int = 0              # the repeat (`--repeats`): answers are independent draws, cached apart
    given: dict[int, GivenAnswer] | None = None  # q_idx -> answer made elsewhere: no answering call
    settings: RequestSettings | None = None  # the run's --temperature / --max-tokens, on each answer request

    @property
    def name(self) -> str:
        return f"{self.model} / {self.mode}"


@dataclass(slots=True)
class JobStats:
    calls: int = 0          # outcomes received (answers + judge draws)
    cache_hits: int = 0
    spent: float = 0.0      # USD spent by this run (0 for cached calls)
    wall: float = 0.0       # seconds
    cached_answers: list[int] = field(default_factory=list)  # q_idx whose answer came from the cache


@dataclass(slots=True)
class Evaluation:
    records: list[ResultRecord]
    stats: dict[tuple[str, str], JobStats]
    jobs: list[Job]
    judge: str
    embed_model: str | None
    retrieval_calls: int = 0
    retrieval_cache_hits: int = 0
    retrieval_seconds: float = 0.0
    spending: Spending = field(default_factory=Spending)  # by model and role (answer, judge, embed, memory)
    memory: dict[str, Prepared] = field(default_factory=dict)  # each memory system's figures and evidence


def sample_questions(questions: Sequence[Question], n: int | None) -> list[Question]:
    """`n` questions spread evenly over the set (which is ordered by template,
    bin and cue), so that every part of the benchmark is represented."""
    if n is None or n >= len(questions):
        return list(questions)
    if n <= 0:
        raise TulvingError("the sample size must be positive")
    step = len(questions) / n
    return [questions[int(i * step)] for i in range(n)]


def plan_jobs(questions: Sequence[Question], models: Sequence[str], modes: Sequence[str],
              samples: dict[tuple[str, str], int] | None = None, settings: RequestSettings | None = None) -> list[Job]:
    """One job per (model, memory system); the names are checked by the
    caller against the registry (engine/benchmark/memory/registry.py)."""
    jobs = []
    for model in models:
        for mode in modes:
            n = (samples or {}).get((model, mode))
            chosen = sample_questions(questions, n)
            jobs.append(Job(model=model, mode=mode, questions=chosen,
                            sample=len(chosen) if n is not None and len(chosen) < len(questions) else None,
                            settings=settings))
    return jobs


def check_jobs(config: Config, book: Book, jobs: Sequence[Job], judge: str, embed_model: str | None, *,
               require_keys: bool = True) -> list[str]:
    """Everything that can be refused before a single call: unknown models,
    a book too long for a model's context, a RAG mode without embedder, and
    (`require_keys`) a missing API key. Returns the key variables that are
    unset (only without `require_keys`: a dry run estimates without them)."""
    aliases = [config.alias(judge)]
    for job in jobs:
        indices = [q.q_idx for q in job.questions]
        if len(set(indices)) != len(indices):
            raise TulvingError("the questions' q_idx values are not unique: renumber the questions file")
        if job.given is not None or job.model == AGENT:
            continue  # answers made elsewhere: no answering model
        alias = config.alias(job.model)
        aliases.append(alias)
        if alias.long_prompt_model is not None:  # long prompts go there: its key is needed too
            aliases.append(config.alias(alias.long_prompt_model))
        if job.mode == A.IN_CONTEXT:
            rag.check_in_context_fits(alias, book_tokens(book))
        if job.mode in A.RAG_MODES:
            if not embed_model:
                raise TulvingError(f"mode {job.mode} needs an embedding model (--embed-model)")
            aliases.append(config.alias(embed_model))
    missing: list[str] = []
    for alias in aliases:  # a missing API key: one clear error before any call
        for endpoint in config.endpoints_of(alias):
            try:
                config.api_key(endpoint)
            except TulvingError:
                if require_keys:
                    raise
                if endpoint.key_env and endpoint.key_env not in missing:
                    missing.append(endpoint.key_env)
    return missing


def book_tokens(book: Book) -> int:
    n = getattr(book, "n_tokens", None)
    if n:
        return int(n)
    from engine.tokens import count_tokens

    return count_tokens(book.text)


# -- judging -----------------------------------------------------------------------

@dataclass(slots=True)
class _Pending:
    """One question of one job, while it is being answered and judged."""

    question: Question
    record: ResultRecord
    verdict: JudgeVerdict | None = None


def _chat_result(outcome: Outcome) -> ChatResult:
    """The reply of a call that succeeded (`outcome.ok`): the pipeline sends chat requests only."""
    result = outcome.result
    assert isinstance(result, ChatResult)
    return result


def _list_cost(alias: ModelAlias, result: ChatResult) -> float:
    """A call's cost at the alias's list prices, its prompt-cache reads and
    writes at theirs (the same whether it was made now or came from the cache)."""
    return alias.cost(result.input_tokens, result.output_tokens, cache_read=result.cache_read_tokens,
                      cache_write=result.cache_write_tokens, cache_write_1h=result.cache_write_1h_tokens)


def _error_text(outcome: Outcome) -> str:
    return str(outcome.error) if outcome.error is not None else "no result"


class JobRunner:
    """Runs one job's stream: answers in, judge requests out, records filled."""

    def __init__(self, engine: Engine, config: Config, book: Book, job: Job, judge_model: str,
                 prepared: Prepared | None, spending: Spending | None = None):
        self.engine = engine
        self.config = config
        self.book = book
        self.job = job
        self.judge_model = judge_model
        self.prepared = prepared
        self.alias = config.alias(job.model) if job.given is None and job.model != AGENT else None
        # The evidence is cut to the budget counted in the reader's tokenizer (an agent's: the one handed).
        self.tokenizer = encoding_of_model(self.alias.model) if self.alias is not None else None
        self.judge_alias = config.alias(judge_model)
        self.pending: dict[int, _Pending] = {}
        self.records: list[ResultRecord] = []
        self.stats = JobStats()
        self.spending = spending if spending is not None else Spending()
        self._book_of: tuple[int, str] | None = None  # (id of the passages, the book they join to)

    # requests -------------------------------------------------------------------
    def _answer_requests(self) -> Iterator[ChatRequest]:
        """The answering call of each question, or its judge call when the
        answer is given; a question the memory could not recall ends here."""
        title = A.book_title(self.book)
        for q in self.job.questions:
            item = self.pending[q.q_idx] = _Pending(question=q, record=self._new_record(q))
            if self.job.given is not None:
                yield self._given(item, self.job.given.get(q.q_idx))
                continue
            assert self.prepared is not None  # every job without given answers has its memory
            evidence = self.prepared.for_question(q.question, self.tokenizer)
            self._record_evidence(item.record, evidence)
            if evidence.error is not None:
                item.record.answer_error = evidence.error
                self._finish(item)
            elif self.prepared.answers:
                item.record.answer = evidence.answer or ""
                yield self._judge_request(item, 0)
            else:
                yield self._answer_request(item, evidence, title)

    def _given(self, item: _Pending, given: GivenAnswer | None) -> ChatRequest:
        assert given is not None  # the answers file's jobs hold the questions it answers
        item.record.answer = given.answer
        if given.evidence_chapters is not None:
            chapters = list(given.evidence_chapters)
            item.record.evidence_chapters = chapters
            item.record.retrieval_recall, item.record.retrieval_precision = coverage(chapters, item.question.chapters)
        return self._judge_request(item, 0)

    def _answer_request(self, item: _Pending, evidence: Evidence, title: str) -> ChatRequest:
        assert self.prepared is not None and self.alias is not None
        q = item.question
        shared = None
        if self.prepared.prompt == BOOK:
            text = self._joined(evidence.passages)
            prompt = A.in_context_prompt(text, q.question)
            shared = (1, A.in_context_prefix_chars(text))  # the book: the prefix every question shares
        elif self.prepared.prompt == FINETUNED:
            prompt = A.finetuned_prompt(q.question, title)
        else:
            settings = self.job.settings
            max_out = (settings.max_tokens if settings is not None and settings.max_tokens
                       else int(self.alias.params.get("max_tokens") or 0))
            kept = rag.fit_chunks([p.text for p in evidence.passages], q.question,
                                  context_tokens=self.alias.context_tokens, max_output_tokens=max_out,
                                  model=self.job.model)
            item.record.n_chunks = len(kept)
            prompt = A.rag_prompt(kept, q.question)
        request = ChatRequest(model=self.job.model, messages=A.messages(prompt), tag=("answer", q.q_idx, 0),
                              prefix_end=shared, draw=self.job.draw)
        return self.job.settings.apply(request) if self.job.settings is not None else request

    def _joined(self, passages: Sequence[Passage]) -> str:
        """The book the in-context passages join to, joined once per job."""
        if self._book_of is None or self._book_of[0] != id(passages):
            self._book_of = (id(passages), book_text(passages))
        return self._book_of[1]

    def _record_evidence(self, record: ResultRecord, evidence: Evidence) -> None:
        """What the memory gave, on the record: for systems whose evidence
        is retrieved (not the whole book, not the weights)."""
        assert self.prepared is not None
        if self.prepared.prompt in (BOOK, FINETUNED) or evidence.error is not None:
            return
        chapters = evidence.chapters
        record.evidence_chapters = chapters
        record.evidence_tokens = evidence.tokens
        record.evidence_cut, record.evidence_cut_tokens = evidence.cut_passages, evidence.cut_tokens
        record.retrieval_recall, record.retrieval_precision = coverage(chapters, record.chapters)
        if self.prepared.keep_texts:
            record.evidence = [{"chapter": p.chapter, "text": p.text} for p in evidence.passages]

    def _new_record(self, q: Question) -> ResultRecord:
        data = q.to_json()
        record = ResultRecord.from_json(data)
        record.model, record.mode, record.judge = self.job.model, self.job.mode, self.judge_model
        return record

    # outcomes -------------------------------------------------------------------
    async def run(self) -> list[ResultRecord]:
        start = time.perf_counter()
        initial = self._answer_requests()
        followups: deque[Request] = deque()
        rounds = 0
        while rounds == 0 or followups:
            rounds += 1
            label = f"{self.job.name}" + (f" (round {rounds})" if rounds > 1 else "")
            # No total: evaluate() told the engine every job's calls up front (expected_calls).
            async for outcome in self.engine.stream(feed(followups, initial), label=label):
                self._count(outcome)
                kind, q_idx, draw = outcome.tag
                item = self.pending[q_idx]
                if kind == "answer":
                    follow = self._on_answer(item, outcome)
                elif kind == "judge":
                    follow = self._on_judge(item, outcome, draw)
                else:
                    follow = self._on_chrono(item, outcome, draw)
                if follow is not None:
                    followups.append(follow)
                else:  # this question's chain of calls is over
                    self._finish(item)
        self.stats.wall = time.perf_counter() - start
        # Questions whose chain ended without _finish (should not happen) are kept too.
        for item in list(self.pending.values()):
            self._finish(item)
        return self.records

    def _count(self, outcome: Outcome) -> None:
        if outcome.tag and outcome.tag[0] == "answer":
            assert self.alias is not None  # answering calls are made for jobs with a model
            self.spending.add("answer", self.alias, outcome)
        else:
            self.spending.add("judge", self.judge_alias, outcome)
        self.stats.calls += 1
        self.stats.cache_hits += bool(outcome.cached or outcome.joined)  # nothing sent: cached, as spending counts it
        self.stats.spent += outcome.cost or 0.0
        if outcome.cached and outcome.tag and outcome.tag[0] == "answer":
            self.stats.cached_answers.append(outcome.tag[1])

    def _finish(self, item: _Pending) -> None:
        if self.pending.pop(item.question.q_idx, None) is not None:
            self.records.append(item.record)

    def _on_answer(self, item: _Pending, outcome: Outcome) -> ChatRequest | None:
        rec = item.record
        if not outcome.ok:
            rec.answer_error = _error_text(outcome)
            return None
        result = _chat_result(outcome)
        rec.answer = result.text
        rec.input_tokens, rec.output_tokens = result.input_tokens, result.output_tokens
        rec.cache_read_tokens, rec.cache_write_tokens = result.cache_read_tokens, result.cache_write_tokens
        rec.latency = round(float(result.latency or 0.0), 3)
        rec.cost = round(_list_cost(self._serving_alias(outcome), result), 8)
        rec.reasoning = result.reasoning  # kept beside the answer; the judge is given the answer only
        return self._judge_request(item, 0)

    def _serving_alias(self, outcome: Outcome) -> ModelAlias:
        """The alias whose prices the answer costs: the job's, or its
        long-prompt route's when the prompt went there (engine/resolve.py)."""
        assert self.alias is not None  # answering calls are made for jobs with a model
        if self.alias.long_prompt_model is None:
            return self.alias
        return resolve(self.config, outcome.request).alias

    def _judge_request(self, item: _Pending, draw: int) -> ChatRequest:
        return judge_request(item.question, item.record.answer, book=self.book,
                             model=self.judge_model, draw=draw,
                             tag=("judge", item.question.q_idx, draw))

    def _chrono_request(self, item: _Pending, draw: int) -> ChatRequest:
        assert item.verdict is not None  # set by the main judgment
        return chrono_judge_request(item.question, item.record.answer,
                                    list(item.verdict.identified_items), model=self.judge_model,
                                    draw=draw, tag=("chrono", item.question.q_idx, draw))

    def _judge_cost(self, outcome: Outcome) -> float:
        if not outcome.ok:
            return 0.0
        return _list_cost(self.judge_alias, _chat_result(outcome))

    def _on_judge(self, item: _Pending, outcome: Outcome, draw: int) -> ChatRequest | None:
        rec = item.record
        rec.judge_draws = draw + 1
        rec.judge_cost = round(rec.judge_cost + self._judge_cost(outcome), 8)
        if not outcome.ok:
            rec.judge_failed, rec.judge_error = True, f"judge call failed: {_error_text(outcome)}"
            return None
        rec.judge_reply = _chat_result(outcome).text
        ground_truth = list(item.question.correct_answer)
        try:
            verdict = judge_parse.parse_judge_reply(rec.judge_reply, ground_truth)
        except judge_parse.JudgeReplyError as exc:
            if draw < JUDGE_REDRAWS:
                return self._judge_request(item, draw + 1)
            rec.judge_failed, rec.judge_error = True, f"unparsable judge reply after {draw + 1} draws: {exc}"
            return None
        item.verdict = verdict
        rec.identified_items = list(verdict.identified_items)
        rec.matching_scores = list(verdict.scores)
        rec.f1 = _round(scores.lenient_f1(verdict.identified_items, ground_truth, verdict.scores))
        if item.question.get == "chronological":
            if ground_truth and rec.identified_items:
                return self._chrono_request(item, 0)
            # Nothing to order: no call, the outcome is known (no index found).
            self._set_chrono(rec, [], len(scores.distinct(ground_truth)))
        return None

    def _set_chrono(self, rec: ResultRecord, indices: list[int], n_gt: int) -> None:
        match = scores.chrono_match(indices, n_gt)
        rec.chrono_indices = list(indices)
        rec.exact_match = bool(match.exact_match)
        rec.tau = _round(match.tau)

    def _on_chrono(self, item: _Pending, outcome: Outcome, draw: int) -> ChatRequest | None:
        rec = item.record
        rec.judge_cost = round(rec.judge_cost + self._judge_cost(outcome), 8)
        if not outcome.ok:
            rec.judge_failed, rec.judge_error = True, f"chronological judge call failed: {_error_text(outcome)}"
            rec.f1 = None
            return None
        rec.chrono_reply = _chat_result(outcome).text
        # The chronological judge sees both lists de-duplicated (judge.py).
        assert item.verdict is not None  # set by the main judgment
        identified = scores.distinct(item.verdict.identified_items)
        n_gt = len(scores.distinct(item.question.correct_answer))
        try:
            indices = judge_parse.parse_chrono_reply(rec.chrono_reply, len(identified), n_gt)
        except judge_parse.JudgeReplyError as exc:
            if draw < JUDGE_REDRAWS:
                return self._chrono_request(item, draw + 1)
            rec.judge_failed = True
            rec.judge_error = f"unparsable chronological judge reply after {draw + 1} draws: {exc}"
            rec.f1 = None
            return None
        self._set_chrono(rec, list(indices), n_gt)
        return None


def _round(x: float | None) -> float | None:
    # Full precision: rounding per-question F1 or tau can move a bin mean of
    # exactly x.xx5 across its 2-decimal rounding (scores.bin_mean).
    return None if x is None else float(x)


# -- the whole run -----------------------------------------------------------------

def expected_calls(jobs: Sequence[Job]) -> int:
    """The calls `evaluate` makes, as far as they are known before it starts
    (for the run-wide progress line): an answer and a judgment per question of
    every job, plus the chronological judgments. Re-draws of unparsable
    judge replies come on top; embeddings are counted when their stream opens."""
    return sum(2 * len(job.questions) + sum(q.get == "chronological" and bool(q.correct_answer)
                                            for q in job.questions) for job in jobs)


async def evaluate(engine: Engine, config: Config, book: Book, questions: Sequence[Question], jobs: Sequence[Job], *,
                   judge: str, embed_model: str | None = None, expected: bool = False,
                   memory: MemorySettings | None = None, prepared: Mapping[str, Prepared] | None = None
                   ) -> Evaluation:
    """Answer and judge every job's questions (jobs from `plan_jobs`); the
    records come back sorted as results.jsonl stores them. The paper's
    retrieval K comes from the full question set, also for jobs run on a
    sample. `memory`: the run's memory systems (default: the installed ones,
    the run's first answering model lending its chat calls, the paper's
    budget). `prepared`: systems already prepared (an earlier repeat's: the
    evidence is the same). `expected`: the caller has already told the engine
    these calls (`engine.expect(expected_calls(jobs))`, e.g. for every repeat at once)."""
    check_jobs(config, book, jobs, judge, embed_model)
    if not expected:
        engine.expect(expected_calls(jobs))
    spending = Spending()
    session = MemorySession(engine, config, memory or default_memory_settings(jobs, embed_model), dict(prepared or {}))
    needed = _questions_by_memory(jobs)
    readers = _readers_by_memory(config, jobs)
    runners: dict[int, JobRunner] = {}

    async def run_job(n: int, job: Job) -> list[ResultRecord]:
        # A job waits for its own memory system only: the others' preparation goes on beside it.
        prepared = None if job.given is not None else await session.prepare(book, questions, job.mode,
                                                                            needed[job.mode], readers.get(job.mode))
        runners[n] = JobRunner(engine, config, book, job, judge, prepared, spending)
        return await runners[n].run()

    tasks = [asyncio.ensure_future(run_job(n, job)) for n, job in enumerate(jobs)]
    try:
        per_job = await asyncio.gather(*tasks)
    except BaseException:  # one job failed: stop the others before raising
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        await session.close()
    records = [rec for recs in per_job for rec in recs]
    records.sort(key=lambda r: (r.model, r.mode, r.q_idx))
    ordered = [runners[n] for n in range(len(jobs))]
    made = session.prepared()
    evaluation = Evaluation(records=records, stats={(r.job.model, r.job.mode): r.stats for r in ordered},
                            jobs=list(jobs), judge=judge, spending=spending, memory=made,
                            embed_model=embed_model if any(p.meter.phases for p in made.values()
                                                           if p.name in A.RAG_MODES) else None)
    if not prepared:  # a repeat's memory figures are the first evaluation's
        _add_memory_figures(evaluation)
    return evaluation


def default_memory_settings(jobs: Sequence[Job], embed_model: str | None) -> MemorySettings:
    """The installed memory systems, the run's first answering model lending
    chat calls, its embedding model, the paper's budget."""
    from engine.benchmark.memory.registry import memory_specs

    readers = [j.model for j in jobs if j.given is None and j.model != AGENT]
    return MemorySettings(specs=memory_specs(), chat_model=readers[0] if readers else None, embed_model=embed_model)


def _questions_by_memory(jobs: Sequence[Job]) -> dict[str, list[str]]:
    """The question texts each memory system is asked: those of its jobs."""
    needed: dict[str, dict[str, None]] = {}
    for job in jobs:
        if job.given is None:
            needed.setdefault(job.mode, {}).update(dict.fromkeys(q.question for q in job.questions))
    return {name: list(texts) for name, texts in needed.items()}


def _readers_by_memory(config: Config, jobs: Sequence[Job]) -> dict[str, dict[str, str]]:
    """The answering models of each memory system's jobs, each with the
    tokenizer its evidence budget is counted in."""
    readers: dict[str, dict[str, str]] = {}
    for job in jobs:
        if job.given is None and job.model != AGENT:
            readers.setdefault(job.mode, {})[job.model] = encoding_of_model(config.alias(job.model).model)
    return readers


def _add_memory_figures(evaluation: Evaluation) -> None:
    """The memory systems' calls into the run's spending; the paper's RAG
    modes' embeddings also as the run's retrieval figures (run.json)."""
    for prepared in evaluation.memory.values():
        for row in prepared.meter.spending.rows():
            evaluation.spending.row(row["model"], row["role"]).add(row)
        if prepared.name in A.RAG_MODES:
            for figures in prepared.meter.phases.values():
                evaluation.retrieval_calls += figures.calls
                evaluation.retrieval_cache_hits += figures.cached
                evaluation.retrieval_seconds += figures.seconds
