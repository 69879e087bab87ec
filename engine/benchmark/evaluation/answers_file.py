"""Answers made anywhere: the answers file `tulving score` reads, checked line by line.

One JSON object per line (JSON Lines, UTF-8):

    {"id": "q0042-3f9a0c1be2", "answer": "Central Park; the High Line",
     "evidence_chapters": [3, 17], "system": "my-memory"}

- `id` (required): the question's id (question_ids.py; `tulving questions --ids`).
- `answer` (required): the answer text, as the judge is to read it ("" is an answer).
- `evidence_chapters` (optional): the chapter numbers (or null for a passage of
  no known chapter) of the passages the system answered from, as memory systems
  report them: they give retrieval recall and precision (results.py).
- `system` (optional): the name the answers are scored under (the `model` of
  results.jsonl); default: `--system`, else the file's name without extension.
  A file may hold several systems: each is scored as its own row.

Every line that cannot be used gets one line naming the file and line number:
not JSON, not an object, a missing or mistyped key, an unknown key, an id of no
question of this set (another book, another version of the set, or a typo), the
same (system, id) twice. Questions with no line are listed once per system
(a file that leaves some out is scored as partial, never as complete).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.benchmark.evaluation.questions import Question
from providers.base import TulvingError

ANSWERS_MODE = "answers-file"  # the `mode` of a scored answers file's rows
REQUIRED = ("id", "answer")
OPTIONAL = ("evidence_chapters", "system")
SHOWN_PROBLEMS = 20            # problems printed before "... and N more"
SHOWN_MISSING = 5              # missing ids named per system


class AnswersFileError(TulvingError):
    """An answers file that cannot be scored: `problems` holds one line per bad
    line of the file, the message says how many there are."""

    def __init__(self, message: str, problems: Sequence[str] = ()):
        super().__init__(message)
        self.problems = list(problems)

    def lines(self) -> list[str]:
        """The problems to print, at most SHOWN_PROBLEMS of them, then "... and N more"."""
        shown = self.problems[:SHOWN_PROBLEMS]
        if len(self.problems) > SHOWN_PROBLEMS:
            shown.append(f"... and {len(self.problems) - SHOWN_PROBLEMS} more")
        return shown


@dataclass(slots=True)
class FileAnswer:
    """One answer from the file, ready for the judge."""

    question: Question
    answer: str
    line: int
    evidence_chapters: list[int | None] | None = None


@dataclass(slots=True)
class AnswersFile:
    """The answers of a file by system, each system's by q_idx (set order)."""

    path: Path
    systems: dict[str, dict[int, FileAnswer]]
    total: int                                   # questions in the set
    missing: dict[str, list[str]] = field(default_factory=dict)  # system -> ids without an answer

    def partial(self, system: str) -> bool:
        return bool(self.missing.get(system))

    def notes(self) -> list[str]:
        """One line per system that leaves questions out."""
        out = []
        for system, ids in self.missing.items():
            if ids:
                named = ", ".join(ids[:SHOWN_MISSING]) + (", ..." if len(ids) > SHOWN_MISSING else "")
                out.append(f"{self.path}: system {system!r} answers {self.total - len(ids)} of {self.total} "
                           f"questions; missing: {named}: scored as PARTIAL (not comparable to full runs)")
        return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _evidence_problem(data: Mapping[str, object]) -> str | None:
    chapters = data.get("evidence_chapters")
    if chapters is not None and not (isinstance(chapters, list)
                                     and all(c is None or (_is_int(c) and c >= 1) for c in chapters)):
        return "evidence_chapters must be a list of chapter numbers (>= 1) or nulls"
    return None


def line_problem(data: object) -> str | None:
    """Why a parsed line is not an answer line (its id not yet looked up), or None."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        return f"no {' and no '.join(missing)}"
    unknown = sorted(k for k in data if k not in REQUIRED and k not in OPTIONAL)
    if unknown:
        return f"unknown key(s) {', '.join(unknown)} (known: {', '.join(REQUIRED + OPTIONAL)})"
    if not isinstance(data["id"], str):
        return "id must be a string (a question id: tulving questions --ids)"
    if not isinstance(data["answer"], str):
        return f"answer must be a string, not {type(data['answer']).__name__}"
    if data.get("system") is not None and not (isinstance(data["system"], str) and data["system"].strip()):
        return "system must be a non-empty string"
    return _evidence_problem(data)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise AnswersFileError(f"answers file {path} not found") from None
    except IsADirectoryError:
        raise AnswersFileError(f"{path}: is a folder, not an answers file") from None
    except UnicodeDecodeError as exc:
        raise AnswersFileError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def _given(data: dict[str, object], question: Question, line: int) -> FileAnswer:
    chapters = data.get("evidence_chapters")
    return FileAnswer(question=question, answer=str(data["answer"]), line=line,
                      evidence_chapters=list(chapters) if isinstance(chapters, list) else None)


def read_answers(path: str | Path, by_id: Mapping[str, Question], *, system: str | None = None) -> AnswersFile:
    """Read and check an answers file against a question set (`question_ids.question_ids`).
    Raises AnswersFileError holding one line per problem; missing questions are
    not an error: they are listed in `missing` (see `AnswersFile.notes`)."""
    path = Path(path)
    default_system = system or path.stem
    problems: list[str] = []
    systems: dict[str, dict[int, FileAnswer]] = {}
    first_line: dict[tuple[str, str], int] = {}
    for n, text in enumerate(_lines(path), start=1):
        if not text.strip():
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            problems.append(f"{path}:{n}: not JSON ({exc.msg} at column {exc.colno})")
            continue
        problem = line_problem(data)
        if problem is None and data["id"] not in by_id:
            problem = (f"unknown question id {data['id']!r}: no question of this book's set has it (another book, "
                       f"another version of the question set, or a typo; tulving questions --ids lists them)")
        if problem is None:
            name = str(data.get("system") or default_system)
            if (name, data["id"]) in first_line:
                problem = f"duplicate answer to {data['id']} for system {name!r} (first on line " \
                          f"{first_line[(name, data['id'])]})"
            else:
                first_line[(name, data["id"])] = n
                question = by_id[data["id"]]
                systems.setdefault(name, {})[question.q_idx] = _given(data, question, n)
        if problem is not None:
            problems.append(f"{path}:{n}: {problem}")
    if problems:
        raise AnswersFileError(f"{path}: {len(problems)} line(s) cannot be scored: fix them and run again "
                               f"(nothing was judged)", problems)
    if not systems:
        raise AnswersFileError(f"{path}: holds no answers")
    missing = {name: [qid for qid, q in by_id.items() if q.q_idx not in given] for name, given in systems.items()}
    return AnswersFile(path=path, systems={k: dict(sorted(v.items())) for k, v in systems.items()},
                       total=len(by_id), missing=missing)

