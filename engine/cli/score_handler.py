"""The work of `tulving score` (options: engine/cli/score.py): an answers file
through the shared judge path (pipeline.Job with given answers), written as a run."""
from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engine.benchmark.evaluation import pipeline
from engine.benchmark.evaluation.answers_file import ANSWERS_MODE, AnswersFile, AnswersFileError, read_answers
from engine.benchmark.evaluation.provenance import command_line, provenance, utc_now
from engine.benchmark.evaluation.question_ids import book_sha256, question_ids
from engine.benchmark.evaluation.questions import Question, build_questions
from engine.benchmark.evaluation.report import leaderboard_text
from engine.benchmark.evaluation.results import RESULTS_FILE
from engine.benchmark.evaluation.run_record import check_out_folder
from engine.benchmark.generation.bookdir import Book, check_output_folder
from engine.benchmark.generation.published import load_book
from engine.cli import lifecycle
from engine.cli.common import check_models, open_engine
from engine.cli.evaluate_handlers import _run_record, run_exit_code, write_run
from engine.config import Config
from engine.errors import printable

if TYPE_CHECKING:
    from engine.benchmark.evaluation.report import Scores


def answer_jobs(answers: AnswersFile) -> list[pipeline.Job]:
    """One job per system of the file: its answers given, so they go straight
    to the judge; a system that leaves questions out is a partial job (`sample`)."""
    jobs = []
    for system, given in answers.systems.items():
        jobs.append(pipeline.Job(
            model=system, mode=ANSWERS_MODE, questions=[a.question for a in given.values()],
            sample=len(given) if answers.partial(system) else None,
            given={q: pipeline.GivenAnswer(a.answer, None if a.evidence_chapters is None
                                           else tuple(a.evidence_chapters)) for q, a in given.items()}))
    return jobs


def _read(args: argparse.Namespace, book: Book, questions: list[Question]) -> AnswersFile:
    try:
        return read_answers(args.answers, question_ids(questions, book), system=args.system)
    except AnswersFileError as exc:
        for line in exc.lines():  # one line per bad line of the file, then the error
            print(printable(line), file=sys.stderr)
        raise


def _configuration(args: argparse.Namespace, config: Config, book: Book, digest: str) -> dict[str, object]:
    alias = config.alias(args.judge)
    return {"book": str(book.name), "book_sha256": book_sha256(book), "answers_sha256": digest,
            "judge": args.judge, "resolved": {args.judge: {"model": alias.model, "params": dict(alias.params)}}}


def score(args: argparse.Namespace, config: Config) -> int:
    check_models(config, args, [args.judge])
    book = load_book(args.book)
    questions = build_questions(book)
    answers = _read(args, book, questions)
    for note in answers.notes():
        print(f"note: {printable(note)}", file=sys.stderr)
    digest = hashlib.sha256(Path(args.answers).read_bytes()).hexdigest()
    out = Path(args.out or Path("runs") / f"{book.name}-{Path(args.answers).stem}")
    args.configuration = _configuration(args, config, book, digest)
    check_output_folder(out)
    check_out_folder(out, args.configuration, overwrite=args.overwrite)
    return lifecycle.run(_score(args, config, book, questions, answers, out))


async def _score(args: argparse.Namespace, config: Config, book: Book, questions: list[Question],
                 answers: AnswersFile, out: Path) -> int:
    started, began = time.perf_counter(), utc_now()
    jobs = answer_jobs(answers)
    async with open_engine(args, config) as engine:
        evaluation = await pipeline.evaluate(engine, config, book, questions, jobs, judge=args.judge)
    engine_stats = engine.stats.as_dict() if hasattr(engine.stats, "as_dict") else {}
    engine_stats.pop("notices", None)
    run = _run_record(book, questions, evaluation, time.perf_counter() - started, engine_stats)
    run.update(source="answers file", answers_file={"path": str(Path(args.answers).resolve()),
                                                    "sha256": args.configuration["answers_sha256"],
                                                    "systems": list(answers.systems)},
               configuration=args.configuration,
               provenance=provenance(config, [args.judge], argv=command_line(), started=began, ended=utc_now(),
                                     cache=getattr(args, "cache", None)))
    partial = [s for s in answers.systems if answers.partial(s)]
    if partial:
        run["partial"] = (f"PARTIAL: the answers file leaves questions out for {', '.join(partial)}: those rows "
                          f"are scored on the questions answered only, not comparable to full runs")
    summary: Scores = write_run(out, evaluation.records, run)
    print(leaderboard_text(summary))
    print(f"\nresults: {out / RESULTS_FILE}  report: {out / 'report.md'}  ({time.perf_counter() - started:.1f} s)")
    return run_exit_code(evaluation.records, engine_stats, args)
