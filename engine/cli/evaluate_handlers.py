"""The work of `tulving run`, `questions`, `finetune`, `report`, `compare` and
`agreement`, whose options engine/cli/evaluate.py parses: imported only when
one of them runs (numpy, scipy and aiohttp come in with it).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from engine.benchmark.evaluation import answers as A
from engine.benchmark.evaluation import pipeline, rag
from engine.benchmark.evaluation.formats import check_version
from engine.benchmark.evaluation.formats import current as current_version
from engine.benchmark.evaluation.provenance import command_line, provenance, utc_now
from engine.benchmark.evaluation.questions import Question
from engine.benchmark.evaluation.repeats import repeat_file, repeat_spread
from engine.benchmark.evaluation.report import Scores, add_realism, leaderboard_text, render_markdown, summarize
from engine.benchmark.evaluation.results import RESULTS_FILE, ResultRecord, load_results, write_results
from engine.benchmark.evaluation.run_record import carried_spending, check_out_folder, configuration, run_key
from engine.benchmark.generation.bookdir import Book, check_output_folder
from engine.cli import dry_run_view, lifecycle, run_spending
from engine.cli.common import (
    check_models,
    dry_run_estimate,
    dry_run_report,
    open_engine,
    print_estimate,
    unpriced_line,
)
from engine.cli.evaluate_defaults import (
    DEFAULT_EMBED,
    DEFAULT_LOCAL_SAMPLE,
    DEFAULT_MODES,
    DEFAULT_READER,
    LOCAL_LLM,
    OFFLINE_EMBED,
)
from engine.cli.run_counts import cached_line, planned_line
from engine.cli.run_memories import (
    memory_failures,
    memory_identity,
    memory_plan,
    memory_record,
    memory_settings,
    plan_memory_jobs,
)
from engine.config import Config
from engine.errors import EXIT_BUDGET, EXIT_INCOMPLETE, EXIT_STORAGE, StorageError, printable
from engine.estimate import Estimator
from engine.requests import ChatRequest, EmbedRequest, RequestSettings, output_tokens_allowed
from engine.scheduler import Engine
from engine.spending import spending_lines
from providers.base import BUDGET, UNMATCHED, Result, TulvingError
from providers.kinds import batch_capable, kind_of

# -- helpers -------------------------------------------------------------------------------

AGENT_ANSWER_TOKENS = 512  # --dry-run: the judge prompt's room for an agent-style system's answer

def _shard(args: argparse.Namespace, jobs: list[pipeline.Job]) -> list[pipeline.Job]:
    if not getattr(args, "shard", None):
        return jobs
    from engine.benchmark.evaluation.shard import shard_jobs

    return shard_jobs(jobs, *args.shard)


def _load_book(name: str) -> Book:
    from engine.benchmark.generation.published import load_book

    return load_book(name)


def _questions(args: argparse.Namespace, book: Book) -> list[Question]:
    from engine.benchmark.evaluation.questions import build_questions, read_questions

    if getattr(args, "questions", None):
        return read_questions(args.questions)
    return build_questions(book)


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


# -- run ----------------------------------------------------------------------------------

def cmd_run(args: argparse.Namespace, config: Config) -> int:
    default_run = args.models is None and args.modes is None and not args.memory
    models = args.models or [DEFAULT_READER]
    modes = args.modes or ([] if args.memory else [A.IN_CONTEXT])
    # Every mode is a memory system: unknown names and systems that cannot run here, one line each.
    args.memory_plan = memory_plan(args, config, DEFAULT_MODES if default_run else modes)
    # Unknown, retired or (under --max-cost) unpriced models: one line before any work.
    check_models(config, args, [*models, args.judge, args.embed_model or "", args.memory_model or ""])
    if args.batch and args.models:
        _refuse_batch_without_api(config, args.models)
    book = _load_book(args.book)
    questions = _questions(args, book)
    out = Path(args.out or Path("runs") / str(book.name))
    args.out_dir = str(out)
    # The default run's local LLM answers a question or two within its minute: a smoke check, never ranked.
    args.smoke = {(LOCAL_LLM, A.RAG_PARAGRAPH)} if default_run else set()
    args.started = utc_now()
    args.configuration = _configuration(args, _described(config, models, _settings(args)), book, default_run)
    args.run_key = run_key(args.configuration, book.text)  # the run in the cache's spending ledger
    args.previous = None
    made = _missing_folders(out)
    if not args.dry_run:
        check_output_folder(out)  # an unwritable --out is found before the first call, not after the last
        args.previous = check_out_folder(out, args.configuration, overwrite=args.overwrite)
    try:
        return lifecycle.run(_run(args, config, book, questions, models, args.memory_plan.names, default_run,
                                  out))
    except BaseException:  # an error, Ctrl-C: the folders this run made and left empty go
        _remove_empty(made)
        raise


def _missing_folders(folder: Path) -> list[Path]:
    """`folder` and those of its parents that do not exist yet, deepest first."""
    missing = []
    for path in (folder, *folder.parents):
        if path.exists():
            break
        missing.append(path)
    return missing


def _remove_empty(folders: list[Path]) -> None:
    """Remove the folders a command made (deepest first) that are still empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:  # not empty (the run wrote something), or gone: leave it
            return


async def _before_the_engine(args: argparse.Namespace, config: Config, models: list[str]) -> float:
    """Under --batch, ask each endpoint whether its server has a batch API (a
    vLLM or llama.cpp server has none: stop, or go direct if it says "auto");
    then what --max-cost counts as spent already (earlier invocations of the
    run, in any folder, by the cache's spending ledger; unless --max-cost-scope invocation)."""
    if args.batch:
        from engine.batching_mode import check_batch_apis

        for note in await check_batch_apis(config, [*models, args.judge]):
            _note(note)
    return await run_spending.spending_before(args)


def _refuse_batch_without_api(config: Config, models: list[str]) -> None:
    """`--batch` for a model whose endpoints' kind has no batch API (xai,
    deepseek, openrouter, ...): one line before any work, rather than a run
    that silently goes direct at the full price."""
    for model in models:
        endpoints = config.endpoints_of(config.alias(model))
        if not any(kind_of(spec).can_batch for spec in endpoints):
            first = endpoints[0]
            raise TulvingError(f"--batch: {model} is served by endpoint {first.name!r} of kind {first.kind!r}, "
                               f"which has no batch API: run it without --batch")


def _settings(args: argparse.Namespace) -> RequestSettings | None:
    """--temperature / --max-tokens: settings every answering request carries
    (engine/requests.py), so they reach the cache key, the estimate and the
    provenance; the loaded config is left as it is."""
    if args.temperature is None and args.max_tokens is None:
        return None
    return RequestSettings(temperature=args.temperature, max_tokens=args.max_tokens)


def _described(config: Config, models: list[str], settings: RequestSettings | None) -> Config:
    """The config as the run's records (configuration, provenance) describe
    it: the answering models' params with the run's settings, as they were
    sent. A copy: the engine's config is left as it is."""
    if settings is None:
        return config
    given = {k: v for k, v in (("temperature", settings.temperature), ("max_tokens", settings.max_tokens))
             if v is not None}
    described = dataclasses.replace(config, models=dict(config.models))
    for name in models:
        alias = described.alias(name)
        described.models[name] = dataclasses.replace(alias, params={**alias.params, **given})
    return described


def _configuration(args: argparse.Namespace, config: Config, book: Book, default_run: bool) -> dict[str, Any]:
    return configuration(
        config, book=str(Path(book.path).resolve()) if book.path is not None else str(book.name),
        questions_file=args.questions, models=None if default_run else args.models,
        modes=None if default_run else args.memory_plan.names, judge=args.judge, embed_model=args.embed_model,
        settings={"sample": args.sample, "local_sample": args.local_sample,
                  "shard": "{}/{}".format(*args.shard) if args.shard else None,
                  "temperature": args.temperature, "max_tokens": args.max_tokens,
                  "repeats": args.repeats if args.repeats > 1 else None, **memory_identity(args, args.memory_plan)})


def _minilm_installed() -> bool:
    from providers.local_models import MINILM_PACKAGE, package_dir

    return package_dir(MINILM_PACKAGE) is not None


async def _embedder_works(engine: Engine, model: str) -> str | None:
    """None if `model` embeds a probe text, else why not."""
    from engine.requests import EmbedRequest

    try:
        [outcome] = await engine.run([EmbedRequest(model=model, texts=["probe"])], label=f"probe {model}",
                                     counted=False)  # a failed probe is a note, not a failed call of the run
    except TulvingError as exc:
        return str(exc)
    return None if outcome.ok else str(outcome.error)


def _default_plan(args: argparse.Namespace, questions: list[Question], rag_ok: bool) -> list[pipeline.Job]:
    modes = [m for m in DEFAULT_MODES if rag_ok or m != A.RAG_PARAGRAPH]
    jobs = pipeline.plan_jobs(questions, [DEFAULT_READER], modes,
                              settings=_settings(args))  # the answering model's (the local one keeps its own)
    if rag_ok and importlib.util.find_spec("llama_cpp") is not None:
        n = args.local_sample or DEFAULT_LOCAL_SAMPLE
        jobs += pipeline.plan_jobs(questions, [LOCAL_LLM], [A.RAG_PARAGRAPH], {(LOCAL_LLM, A.RAG_PARAGRAPH): n})
    elif rag_ok:
        _note(f"llama-cpp-python is not installed: {LOCAL_LLM} is left out (pip install 'tulving-bench[local]')")
    return jobs


def _plan(args: argparse.Namespace, questions: list[Question], models: list[str], modes: list[str]
          ) -> list[pipeline.Job]:
    samples: dict[tuple[str, str], int] = {}
    for model in models:
        for mode in modes:
            if args.sample:
                samples[(model, mode)] = args.sample
            if args.local_sample and model.startswith("local:"):
                samples[(model, mode)] = args.local_sample
    return plan_memory_jobs(args.memory_plan, pipeline.plan_jobs(questions, models, modes, samples,
                                                                 settings=_settings(args)), questions)


async def _run(args: argparse.Namespace, config: Config, book: Book, questions: list[Question], models: list[str],
               modes: list[str], default_run: bool, out: Path) -> int:

    started = time.perf_counter()
    embed_model = args.embed_model or (OFFLINE_EMBED if default_run else DEFAULT_EMBED)
    if args.dry_run:
        if default_run:
            jobs = _default_plan(args, questions, rag_ok=_minilm_installed())
        else:
            jobs = _plan(args, questions, models, modes)
        jobs = _shard(args, jobs)
        return await _dry_run(args, config, book, questions, jobs, embed_model)
    before = await _before_the_engine(args, config, models)
    async with open_engine(args, config, spent_before=before, spending_run=args.run_key,
                           spending_label=run_spending.label(str(book.name), args.models)) as engine:
        if default_run:
            problem = await _embedder_works(engine, embed_model)
            if problem:
                _note(f"{embed_model} is unavailable ({problem}): running without rag-paragraph")
            jobs = _default_plan(args, questions, rag_ok=problem is None)
        else:
            jobs = _plan(args, questions, models, modes)
        jobs = _shard(args, jobs)
        evaluation, extra = await _evaluate_repeats(engine, args, config, book, questions, jobs, embed_model)
    # After closing: the cache's last writes (and their failures) are counted by then.
    engine_stats = engine.stats.as_dict() if hasattr(engine.stats, "as_dict") else {}
    engine_stats.pop("notices", None)
    wall = time.perf_counter() - started
    run = _run_record(book, questions, evaluation, wall, engine_stats)
    run["memory"] = memory_record(evaluation, args.memory_plan)
    for line in memory_failures(evaluation):
        _error(line)
    if getattr(args, "shard", None):
        run["shard"] = "{}/{}".format(*args.shard)
    _add_history(run, args, config, jobs)
    if extra:
        run["repeats"] = repeat_spread([evaluation.records, *extra])
    try:
        summary = write_run(out, evaluation.records, run, extra)
    except OSError as exc:
        lost = int(engine_stats.get("cache_write_errors", 0))
        then = (f"and {lost} replies could not be stored in the cache {getattr(args, 'cache', '')} either: a rerun "
                f"would pay for them again" if lost else "the replies are in the cache: rerun to write it "
                                                          "without new calls")
        raise StorageError(f"cannot write the run folder {out}: {exc.strerror or exc}; {then}") from None
    _print_counts(args, run, jobs, [*evaluation.records, *(r for rs in extra for r in rs)])
    if unpriced_line(args):
        print(unpriced_line(args), file=sys.stderr)
    print(leaderboard_text(summary))
    for name, spread in run.get("repeats", {}).items():
        sr, ca = spread["simple_recall"], spread["chronological_awareness"]
        print(f"run-to-run spread over {spread['repeats']} repeats, {name}: Simple Recall {sr['mean']} "
              f"(sd {sr['sd']}), Chronological Awareness {ca['mean']} (sd {ca['sd']})")
    print(f"\nresults: {out / RESULTS_FILE}  report: {out / 'report.md'}  ({wall:.1f} s)")
    return run_exit_code([*evaluation.records, *(r for rs in extra for r in rs)], engine_stats, args)


def _print_counts(args: argparse.Namespace, run: dict[str, Any], jobs: list[pipeline.Job],
                  records: list[ResultRecord]) -> None:
    """Under the progress line's total (stderr, not with --quiet): why the
    calls differ from the plan, then what each model and role cost."""
    if getattr(args, "quiet", False):
        return
    spent = run["spending_this_invocation"]
    planned = planned_line(args.repeats * pipeline.expected_calls(jobs), records, spent)
    for line in [planned, cached_line(spent), *spending_lines(spent)]:
        if line:
            print(line, file=sys.stderr)


async def _evaluate_repeats(engine: Engine, args: argparse.Namespace, config: Config, book: Book,
                            questions: list[Question], jobs: list[pipeline.Job], embed_model: str
                            ) -> tuple[pipeline.Evaluation, list[list[ResultRecord]]]:
    """The run, then its repeats 2..N (--repeats): the same jobs with answers
    drawn anew (draw k), judged anew; their spending joins the run's."""
    embed = embed_model if any(j.mode in A.RAG_MODES for j in jobs) else None
    engine.expect(args.repeats * pipeline.expected_calls(jobs))  # the progress line's total, every repeat known up front
    memory = memory_settings(args, args.memory_plan, Path(args.out_dir), [j.model for j in jobs], embed_model)
    evaluation = await pipeline.evaluate(engine, config, book, questions, jobs, judge=args.judge, embed_model=embed,
                                         expected=True, memory=memory)
    extra = []
    for k in range(1, args.repeats):  # the memory systems' evidence is the same for every repeat: kept
        again = await pipeline.evaluate(engine, config, book, questions,
                                        [dataclasses.replace(j, draw=k) for j in jobs],
                                        judge=args.judge, embed_model=embed, expected=True, memory=memory,
                                        prepared=evaluation.memory)
        for row in again.spending.rows():
            evaluation.spending.row(row["model"], row["role"]).add(row)
        extra.append(again.records)
    return evaluation, extra


def run_exit_code(records: Sequence[ResultRecord], engine_stats: dict[str, Any], args: argparse.Namespace) -> int:
    """0 only when every planned answer and judgment exists; else say what is
    missing and why on stderr, and return the exit code that tells it apart
    (engine/errors.py): --max-cost (4), storage (5), calls that failed (3),
    or a configuration without a single valid judgment (3: nothing to score)."""
    missing = incomplete_records(records)
    errors = engine_stats.get("errors") or {}
    budget = int(errors.get(BUDGET, 0))
    failed = sum(n for kind, n in errors.items() if kind != BUDGET)
    stored_badly = int(engine_stats.get("cache_write_errors", 0))
    if stored_badly:
        _error(f"{stored_badly} replies could not be stored in the cache {getattr(args, 'cache', '')}: the results "
               f"of this run are written, but a rerun would pay for those calls again (check the disk, "
               f"`tulving cache check`, or use --cache elsewhere)")
        return EXIT_STORAGE
    if budget:
        _error(f"stopped by --max-cost {args.max_cost:g}: {budget} calls not sent, {missing} results missing; "
               f"rerun with a higher --max-cost to continue (finished calls are cached)")
        return EXIT_BUDGET
    if missing or failed:
        unmatched = int(errors.get(UNMATCHED, 0))  # paid, no answer: a rerun pays again (engine/batch_matching.py)
        retry = (f"{unmatched} of them were paid but their batch answers came back without their keys: a rerun "
                 f"pays for those again, best without --batch; rerun the same command to retry the others"
                 if unmatched else "rerun the same command to retry them")
        _error(f"incomplete: {missing} results missing, {failed} calls failed ({_kinds(errors)}); {retry} "
               f"(finished calls are cached)")
        return EXIT_INCOMPLETE
    unjudged = no_valid_judgments(records)
    if unjudged:
        _error(f"no valid judgments for {', '.join(unjudged)}: every judgment failed (see judge_error in "
               f"results.jsonl; check the --judge model), so these are not scored nor ranked")
        return EXIT_INCOMPLETE
    return 0


def no_valid_judgments(records: Sequence[ResultRecord]) -> list[str]:
    """The configurations ("model / mode") none of whose questions got a valid judgment."""
    judged: dict[str, bool] = {}
    for r in records:
        name = f"{r.model} / {r.mode}"
        judged[name] = judged.get(name, False) or r.f1 is not None
    return [name for name, ok in judged.items() if not ok]


def incomplete_records(records: Sequence[ResultRecord]) -> int:
    """Records whose answer or judgment is missing because a call failed
    (an unparsable judge reply is a result, counted apart)."""
    return sum(1 for r in records if r.answer_error or (r.judge_failed and "call failed" in (r.judge_error or "")))


def _kinds(errors: dict[str, int]) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in sorted(errors.items())) or "none final"


def _cached_text(result: Result | None) -> str | None:
    """The reply text of a cached chat result, or None."""
    text = getattr(result, "text", None)
    return text if isinstance(text, str) else None


def _error(message: str) -> None:
    print(f"tulving: {printable(message)}", file=sys.stderr)


def _run_record(book: Book, questions: list[Question], ev: pipeline.Evaluation, wall: float,
                engine_stats: dict[str, Any]) -> dict[str, Any]:
    jobs = []
    for job in ev.jobs:
        st = ev.stats[(job.model, job.mode)]
        jobs.append({"model": job.model, "mode": job.mode, "questions": len(job.questions), "sample": job.sample,
                     "calls": st.calls, "cache_hits": st.cache_hits, "spent_usd": round(st.spent, 6),
                     "wall_seconds": round(st.wall, 3), "cached_answers": sorted(st.cached_answers)})
    return {"run_version": current_version("run"), "book": str(book.name), **({"book_path": str(Path(book.path).resolve())} if book.path is not None
                                       else {}),
            "questions": len(questions), "judge": ev.judge, "embed_model": ev.embed_model,
            "jobs": jobs, "retrieval": {"calls": ev.retrieval_calls, "cache_hits": ev.retrieval_cache_hits,
                          "wall_seconds": round(ev.retrieval_seconds, 3)},
            "wall_seconds": round(wall, 3), "spending": ev.spending.rows(), "engine": engine_stats}


def _add_history(run: dict[str, Any], args: argparse.Namespace, config: Config, jobs: list[pipeline.Job]) -> None:
    """run.json's configuration, provenance and spending over every invocation of the run; the
    jobs that are a smoke check (the default run's local LLM on a question or two) marked so."""
    for job in run["jobs"]:
        if (job["model"], job["mode"]) in getattr(args, "smoke", ()):
            job["smoke"] = True
    run["configuration"] = args.configuration
    models = [*(j.model for j in jobs), args.judge, *([run["embed_model"]] if run.get("embed_model") else [])]
    settings = next((j.settings for j in jobs if j.settings is not None), None)
    described = _described(config, [j.model for j in jobs if j.settings is not None], settings)
    run["provenance"] = provenance(described, models, argv=command_line(), started=args.started, ended=utc_now(),
                                   cache=getattr(args, "cache", None))
    previous = args.previous or {}
    run["invocations"] = int(previous.get("invocations", 1)) + 1 if args.previous else 1
    run["spending_this_invocation"] = run["spending"]
    run["spending"] = carried_spending(args.previous, run["spending"])


def write_run(out: Path, records: Sequence[ResultRecord], run: dict[str, Any],
              repeats: Sequence[Sequence[ResultRecord]] = ()) -> Scores:
    out.mkdir(parents=True, exist_ok=True)
    write_results(out / RESULTS_FILE, records)
    for k, again in enumerate(repeats, start=2):
        write_results(out / repeat_file(k), again)
    summary = summarize(records, run)
    _add_realism(summary, records, None, run)
    (out / "scores.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "report.md").write_text(render_markdown(summary))
    (out / "run.json").write_text(json.dumps(run, indent=1, default=str) + "\n")
    return summary


def _dry_run_embeds(book: Book, jobs: list[pipeline.Job], embed_model: str) -> Iterator[EmbedRequest]:
    """The embeddings as the paper's RAG memory makes them: its chunks in batches, each question alone."""
    rag_modes = list(dict.fromkeys(j.mode for j in jobs if j.mode in A.RAG_MODES))
    asked = list(dict.fromkeys(q.question for j in jobs if j.mode in rag_modes for q in j.questions))
    for mode in rag_modes:
        chunks = rag.chunks_for_mode(book.text, mode)
        for i in range(0, len(chunks), rag.EMBED_BATCH):
            yield EmbedRequest(model=embed_model, texts=chunks[i:i + rag.EMBED_BATCH])
    for text in asked:
        yield EmbedRequest(model=embed_model, texts=[text])


def _retrieved(job: pipeline.Job) -> bool:
    """Answers whose prompts are known only after the memory's recall: the
    paper's RAG modes, and every outside memory system."""
    return job.mode in A.RAG_MODES or job.mode not in A.MODES


async def _estimate_job(estimator: Estimator, args: argparse.Namespace, config: Config, book: Book,
                        questions: list[Question], job: pipeline.Job) -> None:
    from engine.tokens import count_tokens

    if job.model == pipeline.AGENT:  # the system answers itself: its answers' length is unknown
        await _add_judge_calls(estimator, job, {q.q_idx: None for q in job.questions}, book, args.judge,
                               AGENT_ANSWER_TOKENS)
        return
    alias = config.alias(job.model)
    answer_max = (job.settings and job.settings.max_tokens) or output_tokens_allowed(alias.params)
    if _retrieved(job):
        # the template with top-K chunks of the book (an outside memory system: as many paragraphs as
        # the paper's rag-paragraph, the default budget)
        chunks_of = job.mode if job.mode in A.RAG_MODES else A.RAG_PARAGRAPH
        chunks = rag.chunks_for_mode(book.text, chunks_of)[:rag.top_k(questions, chunks_of)]
        sample = A.rag_prompt(chunks, job.questions[0].question) if job.questions else ""
        first = config.endpoints_of(alias)[0]
        estimator.add_unknown("answer", alias, len(job.questions),
                              count_tokens(A.SYSTEM_PROMPT) + count_tokens(sample) + 8, answer_max,
                              batchable=batch_capable(first))
        answers: dict[int, str | None] = {q.q_idx: None for q in job.questions}
    else:
        requests = list(A.answer_requests(job.questions, model=job.model, mode=job.mode, book=book,
                                          settings=job.settings))
        found = await estimator.add("answer", requests)
        answers = {q.q_idx: _cached_text(record) for q, record in zip(job.questions, found)}
    await _add_judge_calls(estimator, job, answers, book, args.judge, answer_max)


async def _dry_run(args: argparse.Namespace, config: Config, book: Book, questions: list[Question],
                   jobs: list[pipeline.Job], embed_model: str) -> int:
    unset = pipeline.check_jobs(config, book, jobs, args.judge, embed_model, require_keys=False)
    for variable in unset:  # an estimate needs no key; the run will
        _note(f"{variable} is not set: the run itself will need it (this estimate does not)")
    n_rag = sum(len(j.questions) for j in jobs if _retrieved(j))

    async def fill(estimator: Estimator) -> None:
        await estimator.add("embed", _dry_run_embeds(book, jobs, embed_model))
        for job in jobs:
            await _estimate_job(estimator, args, config, book, questions, job)

    estimator = await dry_run_estimate(config, args.cache, fill)
    uncached = _print_dry_run(estimator, jobs, n_rag)
    dry_run_view.print_view(config, estimator, jobs, batch=args.batch)
    outside = [j.mode for j in jobs if j.mode not in A.MODES]
    if outside:
        print(f"memory systems {', '.join(dict.fromkeys(outside))}: their own model calls (ingest, recall) depend "
              f"on each system and are not in this estimate; --max-cost caps them with the rest")
    print(await run_spending.dry_run_line(args))
    if unpriced_line(args):
        print(unpriced_line(args))
    if args.repeats > 1:
        print(f"--repeats {args.repeats}: the answer and judge calls above are for one repeat; each further "
              f"repeat draws its answers anew (about {args.repeats} times the calls and cost in all)")
    if args.batch:
        def direct_answers() -> Iterator[ChatRequest]:  # prompts known without retrieval
            for job in jobs:
                if not _retrieved(job) and job.model != pipeline.AGENT:
                    yield from A.answer_requests(job.questions, model=job.model, mode=job.mode, book=book,
                                                 settings=job.settings)

        by_batch: Counter[str] = Counter()
        await dry_run_report(config, args.cache, itertools.chain(_dry_run_embeds(book, jobs, embed_model),
                                                                 direct_answers()), by_batch=by_batch)
        _print_batch_plan(config, jobs, args.judge, by_batch, uncached)
    return 0


async def _add_judge_calls(estimator: Estimator, job: pipeline.Job, answers: dict[int, str | None], book: Book,
                           judge: str, answer_max: int) -> None:
    """Judge prompts hold the answer: exact where it is cached, else up to its max_tokens."""
    from engine.benchmark.evaluation.judge import chrono_judge_request, judge_request
    from engine.benchmark.evaluation.scores import distinct

    for known in (True, False):
        picked = [q for q in job.questions if (answers[q.q_idx] is not None) == known]
        judge_requests = [judge_request(q, answers[q.q_idx] or "", book=book, model=judge) for q in picked]
        judge_requests += [chrono_judge_request(q, answers[q.q_idx] or "", distinct(q.correct_answer), model=judge)
                           for q in picked if q.get == "chronological" and q.correct_answer]
        await estimator.add("judge", judge_requests, extra_input_tokens=0 if known else answer_max)


def _print_dry_run(estimator: Estimator, jobs: list[pipeline.Job], n_rag: int) -> int:
    """Print the calls a run needs and what they cost; return the known calls the cache lacks."""
    known = [r for r in estimator.rows() if r.role == "embed" or r.role == "answer"]
    total, cached = sum(r.calls for r in known) - n_rag, sum(r.cached for r in known)
    n_answers = sum(len(j.questions) for j in jobs)
    n_chrono = sum(1 for j in jobs for q in j.questions if q.get == "chronological" and q.correct_answer)
    print(f"jobs: {', '.join(j.name + (f' (sample {j.sample})' if j.sample else '') for j in jobs)}")
    print(f"embedding and answering calls known now: {total:,}, of which the cache holds {cached:,}")
    if n_rag:
        print(f"RAG answering calls (prompts built after retrieval): {n_rag}")
    print(f"judge calls: {n_answers:,} to {n_answers + n_chrono:,} first draws (+ re-draws of unparsable replies), "
          f"made for answers not already judged in the cache")
    print_estimate(estimator, assumptions_below=True)
    return total - cached


def _print_batch_plan(config: Config, jobs: list[pipeline.Job], judge: str, by_batch: Counter[str],
                      uncached: int) -> None:
    """Where --batch sends the calls: through which endpoints' batch APIs, and what stays direct."""
    def route(model: str) -> str:
        names = [s.name for s in config.endpoints_of(config.alias(model)) if batch_capable(s)]
        return f"by batch through {names[0]}" if names else "direct"

    known = sum(by_batch.values())
    where = ", ".join(f"{name}: {n}" for name, n in sorted(by_batch.items()))
    print(f"--batch: {known:,} of the {uncached:,} uncached calls known now go by batch" + (f" ({where})" if where else "")
          + f", {uncached - known} direct")
    for model in dict.fromkeys(j.model for j in jobs if j.mode in A.RAG_MODES):
        print(f"--batch: RAG answers of {model}: {route(model)}")
    judging = route(judge)
    print(f"--batch: judge calls ({judge}): {judging}"
          + (", one batch per round (judgments, then re-draws)" if judging != "direct" else ""))


# -- questions, finetune, report ------------------------------------------------------------

def cmd_questions(args: argparse.Namespace) -> int:
    from engine.benchmark.evaluation.questions import build_questions, write_questions

    book = _load_book(args.book)
    questions = build_questions(book)
    if args.ids or args.out is None:
        from engine.cli.question_listing import questions_with_ids

        return questions_with_ids(args, book, questions)
    if args.out == "-":  # JSON Lines on stdout, the summary on stderr (a pipe gets the questions only)
        for q in questions:
            sys.stdout.write(json.dumps(q.to_json(), ensure_ascii=False) + "\n")
        path: Path | str = "standard output"
    else:
        path = write_questions(args.out, questions)
    counts = {g: sum(1 for q in questions if q.get == g) for g in ("all", "latest", "chronological")}
    print(f"{len(questions)} questions ({', '.join(f'{n} {g}' for g, n in counts.items())}) -> {path}",
          file=sys.stderr if args.out == "-" else sys.stdout)
    return 0


def cmd_finetune(args: argparse.Namespace, config: Config) -> int:
    from engine.benchmark.evaluation import finetune
    from engine.benchmark.evaluation.questions import single_event_questions

    book = _load_book(args.book)
    data_path = Path(args.data_out or Path("runs") / "finetune" / f"{book.name}.jsonl")
    examples = finetune.training_examples(book, single_event_questions(book))
    finetune.write_training_file(data_path, examples)
    print(f"{len(examples)} training examples -> {data_path}")
    training = _training_estimate(args, finetune.training_tokens(examples))
    if args.data_only:
        return 0
    spec = config.endpoints.get(args.endpoint)
    if spec is not None and "//api.openai.com" in (spec.base_url or ""):  # OpenAI's own API
        _note(finetune.FINETUNING_WIND_DOWN)
    started = time.perf_counter()
    job = lifecycle.run(finetune.run_finetune(config, endpoint=args.endpoint, model=args.model,
                                            training_file=data_path, suffix=args.suffix,
                                            poll_interval=args.poll_interval, timeout=args.timeout,
                                            hyperparameters={"n_epochs": args.epochs, "batch_size": args.batch_size,
                                                             "learning_rate_multiplier": args.lr_multiplier}))
    model_id = job.get("fine_tuned_model")
    if not model_id:
        raise TulvingError(f"fine-tuning job {job.get('job_id')} ended {job.get('status')} without a model")
    alias = args.alias or f"ft:{book.name}"
    base = config.models.get(args.model) or next((m for m in config.models.values() if m.model == args.model),
                                                 None)
    snippet = finetune.alias_snippet(alias, args.endpoint, model_id, base, base_model=base.model if base else args.model)
    record_path = Path(args.record or data_path.with_suffix(".model.json"))
    record = {"book": str(book.name), "base_model": args.model, "endpoint": args.endpoint, "alias": alias,
              "training_data": str(data_path), "examples": len(examples), "training_estimate": training, **job,
              "seconds": round(time.perf_counter() - started, 1), "config_snippet": snippet}
    record_path.parent.mkdir(parents=True, exist_ok=True)
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"fine-tuned model {model_id} (job {job.get('job_id')}) -> {record_path}")
    print("Add to your config to evaluate it (tulving run --models "
          f"{alias} --modes finetuned):\n\n{snippet}")
    return 0


def _training_estimate(args: argparse.Namespace, tokens_per_epoch: int) -> dict[str, object]:
    """The training's tokens and estimated price (printed, and recorded with
    the job); one line refusing it when it would exceed --max-cost."""
    from engine.benchmark.evaluation import finetune

    usd = finetune.training_cost(args.model, tokens_per_epoch, args.epochs)
    tokens = tokens_per_epoch * args.epochs
    if usd is None:
        print(f"training: {tokens_per_epoch:,} tokens x {args.epochs} epochs = {tokens:,} tokens; the training "
              f"price of {args.model} is not known to Tulving")
        if args.max_cost is not None and not args.data_only:
            raise TulvingError(f"--max-cost cannot bound fine-tuning {args.model}: its training price is not "
                               f"known (known: {', '.join(finetune.TRAINING_PRICES)})")
    else:
        print(f"training: {tokens_per_epoch:,} tokens x {args.epochs} epochs = {tokens:,} tokens, about "
              f"${usd:,.2f} at ${finetune.TRAINING_PRICES[args.model]:.2f} per million (OpenAI, checked "
              f"{finetune.FINETUNED_PRICES_CHECKED})")
        if args.max_cost is not None and usd > args.max_cost and not args.data_only:
            raise TulvingError(f"--max-cost {args.max_cost:g}: fine-tuning {args.model} would cost about "
                               f"${usd:,.2f}; nothing was submitted")
    return {"tokens_per_epoch": tokens_per_epoch, "epochs": args.epochs, "tokens": tokens,
            "usd": None if usd is None else round(usd, 4), "prices_checked": finetune.FINETUNED_PRICES_CHECKED}


def cmd_report(args: argparse.Namespace) -> int:
    if args.out or len(args.run_dir) > 1:
        return cmd_report_folder(args)
    run_dir = Path(args.run_dir[0])
    records = load_results(run_dir)
    run_path = run_dir / "run.json"
    run = None
    if run_path.is_file():
        try:
            run = json.loads(run_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TulvingError(f"{run_path}: not a readable run record ({exc})") from None
        if not isinstance(run, dict) or not isinstance(run.get("jobs", []), list) or not all(
                isinstance(j, dict) and isinstance(j.get("model"), str) and isinstance(j.get("mode"), str)
                for j in run.get("jobs", [])):
            raise TulvingError(f"{run_path}: not a run record (expected an object with a list of jobs)")
        check_version("run", run.get("run_version"), str(run_path))
    summary = summarize(records, run)
    _add_realism(summary, records, args.realism, run)
    (run_dir / "scores.json").write_text(json.dumps(summary, indent=1) + "\n")
    (run_dir / "report.md").write_text(render_markdown(summary))
    print(leaderboard_text(summary))
    return 0


def _add_realism(summary: Scores, records: Sequence[ResultRecord], realism: str | None,
                 run: dict[str, Any] | None) -> None:
    """The realism split when ratings are given (--realism) or lie in the run's book folder."""
    from engine.benchmark.evaluation.realism import find_ratings

    ratings = find_ratings(realism or None, run)
    if ratings is not None:
        add_realism(summary, records, ratings)


def cmd_report_folder(args: argparse.Namespace) -> int:
    from engine.benchmark.evaluation.report_folder import write_report

    if not args.out:
        raise TulvingError("several run folders: pass --out DIR for their report")
    files = write_report(args.run_dir, args.out, realism=args.realism, figures=not args.no_figures)
    for note in files.notes:
        _note(note)
    print(f"report: {files.out / 'index.html'} ({files.tables} tables, {files.figures} figures, "
          f"{files.results} results of {files.questions} questions, {files.seconds:.1f} s)")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from engine.benchmark.evaluation.compare import Comparison, RealismComparison, compare, compare_realism

    result: Comparison | RealismComparison
    if args.run_b is None:
        result = compare_realism(args.run_a.split(","), a=args.a, get=args.get, realism=args.realism, out=args.out)
    else:
        result = compare(args.run_a.split(","), args.run_b.split(","), a=args.a, b=args.b, get=args.get,
                         resamples=args.resamples, seed=args.seed, out=args.out, realism=args.realism)
    print(result.text())
    if args.out:
        print(f"\nwritten: {Path(args.out) / 'compare.md'}")
    return 0


def cmd_agreement(args: argparse.Namespace) -> int:
    from engine.benchmark.evaluation import agreement as AG
    from engine.benchmark.evaluation.runset import load_runs
    from engine.benchmark.evaluation.tables import to_csv, to_markdown

    results = AG.agreement_results(load_runs(args.run_dir))
    if not results:
        raise TulvingError("no configuration of these runs was judged by two judges (run the same models and "
                           "modes with another --judge, same cache)")
    tables = [AG.summary_table(results), AG.disagreement_table(results, args.top)]
    print(to_markdown(tables[0]))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for t in tables:
            (out / f"{t.key}.md").write_text(to_markdown(t))
            (out / f"{t.key}.csv").write_text(to_csv(t))
        figures = AG.agreement_figures(results, out)
        print(f"written: {', '.join(t.key for t in tables)} (.md, .csv), "
              f"{', '.join(f.name + '.png' for f in figures)} in {out}")
    return 0
