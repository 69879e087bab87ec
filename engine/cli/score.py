"""CLI: `tulving score ANSWERS --book BOOK [--judge J] [--out DIR]`, and `tulving questions --ids`.

    tulving questions --book B --ids                 one "ID<TAB>question" line per question
    tulving questions --book B --ids --out q.jsonl   the question set, each line with its "id"
    tulving score answers.jsonl --book B --judge J --out runs/mine

`score` judges an answers file made anywhere (answers_file.py: one JSON line
per answer, naming the question by its id, question_ids.py) with the paper's
judge prompts, through the same judge path as `tulving run`
(pipeline.py: a job whose answers are given), and writes the same run folder:
results.jsonl, scores.json, report.md, run.json. A file that leaves questions
out is scored as partial (marked in scores.json, the report and the
leaderboard, like a sample); a bad line stops it before any call.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.cli.commands import command_help
from engine.cli.config_file import load_config
from engine.cli.evaluate_defaults import DEFAULT_BOOK, DEFAULT_JUDGE
from providers.base import TulvingError

if TYPE_CHECKING:
    from engine.benchmark.evaluation.questions import Question
    from engine.benchmark.generation.bookdir import Book


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "score", help=command_help("score"),
        description="Judge a JSON Lines file of answers made anywhere ({\"id\", \"answer\", optional "
                    "\"evidence_chapters\", \"system\"} per line; ids from `tulving questions --ids`) with the "
                    "paper's judge prompts, and score it exactly as a Tulving run: results.jsonl, scores.json, "
                    "report.md and run.json in --out.")
    p.add_argument("answers", metavar="ANSWERS", help="the answers file (JSON Lines)")
    p.add_argument("--book", default=DEFAULT_BOOK, help="published book name or book folder (default %(default)s)")
    p.add_argument("--judge", default=DEFAULT_JUDGE, help="judge model alias (default %(default)s)")
    p.add_argument("--system", help="the name the answers are scored under when a line names none "
                                    "(default: the file's name without extension)")
    p.add_argument("--out", metavar="DIR", help="run folder (default runs/<book>-<file name>)")
    p.add_argument("--overwrite", action="store_true", help="replace the run --out holds")
    p.set_defaults(func=cmd_score)


def cmd_score(args: argparse.Namespace) -> int:
    config = load_config(args)  # a bad config is told before the benchmark's modules load
    from engine.cli.score_handler import score

    return score(args, config)


def questions_with_ids(args: argparse.Namespace, book: Book, questions: Sequence[Question]) -> int:
    """`tulving questions --ids`: the ids beside the questions (see the module docstring)."""
    from engine.benchmark.evaluation.question_ids import question_ids

    if args.out is None and not args.ids:
        raise TulvingError("tulving questions: pass --out FILE (or --ids to print the question ids)")
    by_id = question_ids(questions, book)
    if args.out is None:
        for qid, q in by_id.items():
            sys.stdout.write(f"{qid}\t{q.question}\n")
        return 0
    lines = [json.dumps({"id": qid, **q.to_json()}, ensure_ascii=False) + "\n" for qid, q in by_id.items()]
    if args.out == "-":
        sys.stdout.writelines(lines)
        return 0
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(lines), encoding="utf-8")
    tmp.replace(path)
    print(f"{len(lines)} questions with their ids -> {path}")
    return 0
