"""CLI: `tulving score ANSWERS --book BOOK [--judge J] [--out DIR]`.

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

from engine.cli.commands import command_help
from engine.cli.config_file import load_config
from engine.cli.evaluate_defaults import DEFAULT_BOOK, DEFAULT_JUDGE


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
