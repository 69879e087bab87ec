"""`tulving verify BUNDLE --rejudge JUDGE`: the bundle's answers judged again
by another judge, through the shared judge path (pipeline.Job with given
answers), and the two judges' agreement (agreement.py, as `tulving agreement`).

Offline verification proves the claimed scores follow from the recorded
replies; re-judging is what checks the replies themselves: a forged reply
(or a forged answer with every digest recomputed) shows as disagreement.
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence

from engine.benchmark.evaluation import pipeline
from engine.benchmark.evaluation.agreement import agreement_results, summary_table
from engine.benchmark.evaluation.bundle import Json, bundle_results
from engine.benchmark.evaluation.question_ids import question_of
from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.evaluation.runset import RunKey, RunSet
from engine.benchmark.evaluation.tables import to_markdown
from engine.benchmark.generation.bookdir import Book
from engine.cli import lifecycle
from engine.cli.common import check_models, open_engine
from engine.cli.config_file import load_config
from engine.config import Config
from providers.base import TulvingError


def rejudge_jobs(records: Sequence[ResultRecord], sample: int | None) -> list[pipeline.Job]:
    """One job per configuration of the bundle: its answers given (answer errors left out)."""
    groups: dict[tuple[str, str], list[ResultRecord]] = {}
    for r in records:
        if not r.answer_error:
            groups.setdefault((r.model, r.mode), []).append(r)
    jobs = []
    for (model, mode), recs in groups.items():
        questions = [question_of(r) for r in recs]
        chosen = pipeline.sample_questions(questions, sample)
        answers = {r.q_idx: r.answer for r in recs}
        jobs.append(pipeline.Job(model=model, mode=mode, questions=chosen,
                                 sample=len(chosen) if len(chosen) < len(questions) else None,
                                 given={q.q_idx: pipeline.GivenAnswer(answers[q.q_idx]) for q in chosen}))
    return jobs


def agreement_set(book: str, bundle_judge: str, judge: str, before: Sequence[ResultRecord],
                  after: Sequence[ResultRecord]) -> RunSet:
    """The bundle's judgments and the new ones side by side, as `tulving agreement` reads two runs."""
    if judge == bundle_judge:
        bundle_judge = f"{bundle_judge} (bundle)"
    groups: dict[RunKey, list[ResultRecord]] = {}
    for judge_name, recs in ((bundle_judge, before), (judge, after)):
        for r in recs:
            groups.setdefault(RunKey(book, judge_name, r.model, r.mode), []).append(r)
    return RunSet(folders=[], groups=groups, runs={(book, j): {"book": book, "judge": j, "jobs": []}
                                                   for j in (bundle_judge, judge)})


def rejudge(args: argparse.Namespace, bundle: Json, book: Book | None) -> list[ResultRecord]:
    """Judge the bundle's answers with --rejudge, print the agreement table; the new records."""
    if book is None:
        raise TulvingError("--rejudge needs the bundle's book here (the judge is shown chapter texts): pass --book")
    config = load_config(args)
    check_models(config, args, [args.rejudge])
    records = bundle_results(bundle)
    jobs = rejudge_jobs(records, args.sample)
    started = time.perf_counter()
    rejudged = lifecycle.run(_judge(args, config, book, jobs))
    named = bundle.get("book")
    name = str(named.get("name")) if isinstance(named, Mapping) else str(book.name)
    judged_before = {(r.model, r.mode, r.q_idx) for r in rejudged}
    before = [r for r in records if (r.model, r.mode, r.q_idx) in judged_before]
    results = agreement_results(agreement_set(name, records[0].judge if records else "", args.rejudge, before,
                                              rejudged))
    failed = sum(1 for r in rejudged if r.f1 is None)
    print(f"\nre-judged by {args.rejudge}: {len(rejudged)} answers, {time.perf_counter() - started:.1f} s"
          + (f"; {failed} judgments failed (unparsable replies or failed calls), left out of the agreement"
             if failed else ""))
    print(to_markdown(summary_table(results)))
    if args.out:
        _write(args, book, rejudged)
    return rejudged


async def _judge(args: argparse.Namespace, config: Config, book: Book, jobs: list[pipeline.Job]
                 ) -> list[ResultRecord]:
    questions = {q.q_idx: q for job in jobs for q in job.questions}
    async with open_engine(args, config) as engine:
        evaluation = await pipeline.evaluate(engine, config, book, list(questions.values()), jobs,
                                             judge=args.rejudge)
    return evaluation.records


def _write(args: argparse.Namespace, book: Book, records: list[ResultRecord]) -> None:
    """The re-judged records as a run folder (results.jsonl, scores.json, report.md, run.json)."""
    from pathlib import Path

    from engine.cli.evaluate_handlers import write_run

    jobs = [{"model": m, "mode": mode, "questions": n, "sample": None}
            for (m, mode), n in _counts(records).items()]
    write_run(Path(args.out), records, {"book": str(book.name), "judge": args.rejudge, "jobs": jobs,
                                        "source": f"re-judged bundle {args.bundle}"})
    print(f"re-judged run: {args.out}")


def _counts(records: Sequence[ResultRecord]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for r in records:
        out[(r.model, r.mode)] = out.get((r.model, r.mode), 0) + 1
    return out
