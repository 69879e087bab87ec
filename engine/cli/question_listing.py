"""`tulving questions --ids`: the question set with each question's stable id (question_ids.py).

    tulving questions --book B --ids                 one "ID<TAB>question" line per question
    tulving questions --book B --ids --out q.jsonl   the question set, each line with its "id"

The ids are what an answers file names (`tulving score`).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from providers.base import TulvingError

if TYPE_CHECKING:
    from engine.benchmark.evaluation.questions import Question
    from engine.benchmark.generation.bookdir import Book


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
