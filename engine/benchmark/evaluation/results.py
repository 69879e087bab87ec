"""Per-question results of an evaluation run: the `results.jsonl` format.

One JSON object per line, one line per (model, mode, question), sorted by
model, mode and question index, keys sorted, so that a rerun of the same
evaluation against the cache writes the same bytes. Nothing specific to one
run (wall time, whether a call came from the cache) is stored here: that goes
to `run.json`.

Keys of a line (besides `results_version`, see RESULTS_VERSION):

Question (as `Question.to_json()` of engine/benchmark/evaluation/questions.py):
    q_idx, question, template, cue, cue_completed, retrieval_type,
    get ("all" | "latest" | "chronological"), correct_answer (list),
    chapters (matching chapter numbers), n_chapters, bin ("0", "1", "2", "3-5", "6+")
Answer:
    model         model alias that answered
    mode          memory mode: in-context | rag-paragraph | rag-chapter | finetuned
    answer        the answer text ("" if the call failed)
    answer_error  null, or the final error of the answering call ("kind status: message")
    n_chunks      RAG: chunks put in the prompt (fewer than top-K when fitted to a small context)
    input_tokens, output_tokens   of the answering call, as the provider counted them
    cache_read_tokens, cache_write_tokens   the parts of input_tokens the provider read from /
                  wrote to its prompt cache (in-context prompts share the book)
    latency       seconds the answering call took when it was made (replayed from the cache)
    cost          USD the answering call costs at the alias's list prices, its prompt-cache
                  reads and writes at theirs (0 if unpriced); what was spent is in run.json
                  (a prompt sent on by the alias's long-prompt route: at the route's prices)
    reasoning     the reasoning text the model sent beside its answer (DeepSeek
                  reasoning_content, OpenRouter reasoning); only present when there was
                  some; never shown to the judge
Evidence (memory systems whose evidence is retrieved: the paper's RAG modes,
no-memory, outside systems, answers files that name chapters; absent for the
in-context book and the fine-tuned weights):
    evidence_chapters  the chapter of each passage kept within the budget, most relevant
                  first (null where the system could not say)
    evidence      outside systems only: the passages kept, [{"chapter", "text"}]
    evidence_tokens    tokens of the passages kept, in the answering model's tokenizer
                  (run.json's memory.NAME.budgets names it; an agent's: memory.NAME.budget)
    evidence_cut, evidence_cut_tokens  passages (and their tokens) the row's budget cut
    retrieval_recall   share of the ground-truth chapters among the evidence's chapters
                  (null for a question without ground truth)
    retrieval_precision  share of the evidence's distinct chapters that are ground truth
                  (null when the evidence names no chapter)
Judgment:
    judge         judge model alias
    judge_reply   the judge's reply text that was scored (the last draw tried)
    judge_draws   number of judge draws made (1 + re-draws after unparsable replies)
    judge_failed  true when no draw could be parsed (or the judge call failed):
                  the question is then left out of the scores and counted
    judge_error   null, or why the judgment failed
    identified_items  items the judge found in the answer
    matching_scores   the judge's score per ground-truth item (0..1)
    f1            lenient F1 (protocol.md, Judging and scores); null if judge_failed
    chrono_reply  chronological questions: the second judge reply (null for other
                  questions, and when there was nothing to order: no ground truth or
                  no identified item -- no call is made, no index is found)
    chrono_indices    the ground-truth index matched to each identified item (-1: none)
    tau           Kendall tau-b over the matched indices (null with fewer than 2);
                  the score uses it for exact matches only
    exact_match   every ground-truth index found (chronological questions; else null)
    judge_cost    USD of the judge calls at the alias's prices
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, TypedDict

import orjson

from engine.benchmark.evaluation.formats import check_version, current
from providers.base import TulvingError

RESULTS_FILE = "results.jsonl"
# Written on every line as "results_version", "MAJOR.MINOR" (engine/benchmark/evaluation/formats.py):
# the major changes with the prompts or the scoring, so lines of another major are refused and
# results made differently are never mixed silently; a minor adds optional keys only, so every
# 2.x is read (keys this version does not know are ignored). The published schema of a line:
# engine/benchmark/evaluation/schemas/results-line.schema.json.
# 1: lines without the key (before the reference's prompt strings).
# 2 (written as the integer 2): the reference's prompt strings, chronological de-duplication
#    and full-precision F1/tau (issue "fidelity").
# 2.1: the same prompts and scoring; optional evidence and retrieval keys (memory systems,
#    answers files). The version written now is formats.VERSIONS'.
RESULTS_VERSION = current("results")


class EvidencePassage(TypedDict):
    chapter: int | None
    text: str


@dataclass(slots=True)
class ResultRecord:
    # question
    q_idx: int
    question: str
    template: int | None = None
    cue: str | None = None
    cue_completed: str | None = None
    retrieval_type: str = ""
    get: str = "all"
    correct_answer: list[str] = field(default_factory=list)
    chapters: list[int] = field(default_factory=list)
    n_chapters: int = 0
    bin: str = ""
    # answer
    model: str = ""
    mode: str = ""
    answer: str = ""
    answer_error: str | None = None
    n_chunks: int | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    latency: float = 0.0
    cost: float = 0.0
    reasoning: str | None = None  # written only when set (lines without reasoning stay as they were)
    # evidence (written only when set, as reasoning)
    evidence_chapters: list[int | None] | None = None
    evidence: list[EvidencePassage] | None = None
    evidence_tokens: int | None = None
    evidence_cut: int | None = None
    evidence_cut_tokens: int | None = None
    retrieval_recall: float | None = None
    retrieval_precision: float | None = None
    # judgment
    judge: str = ""
    judge_reply: str | None = None
    judge_draws: int = 0
    judge_failed: bool = False
    judge_error: str | None = None
    identified_items: list[str] = field(default_factory=list)
    matching_scores: list[float] = field(default_factory=list)
    f1: float | None = None
    chrono_reply: str | None = None
    chrono_indices: list[int] | None = None
    tau: float | None = None
    exact_match: bool | None = None
    judge_cost: float = 0.0

    @property
    def scored(self) -> bool:
        return self.f1 is not None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for key in _WRITTEN_WHEN_SET:
            if data[key] is None:
                del data[key]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ResultRecord:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


# Keys left out of a line while null: lines of the modes that have none stay as they were.
_WRITTEN_WHEN_SET = ("reasoning", "evidence_chapters", "evidence", "evidence_tokens", "evidence_cut",
                     "evidence_cut_tokens", "retrieval_recall", "retrieval_precision")


def sort_key(record: ResultRecord) -> tuple[str, str, int]:
    return (record.model, record.mode, record.q_idx)


def dumps(records: Iterable[ResultRecord]) -> bytes:
    lines = [orjson.dumps({**r.to_json(), "results_version": RESULTS_VERSION}, option=orjson.OPT_SORT_KEYS)
             for r in sorted(records, key=sort_key)]
    return b"".join(line + b"\n" for line in lines)


def write_results(path: str | os.PathLike[str], records: Iterable[ResultRecord]) -> Path:
    """Write atomically (a half-written file never replaces a good one)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(dumps(records))
    tmp.replace(path)
    return path


def load_results(path: str | os.PathLike[str]) -> list[ResultRecord]:
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise TulvingError(f"no results at {path}") from None
    except IsADirectoryError:
        raise TulvingError(f"{path}: is a folder, not a results file") from None
    except OSError as exc:
        raise TulvingError(f"cannot read {path}: {exc.strerror or exc}") from None
    records = []
    for n, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise TulvingError(f"{path}:{n}: not a result record (not JSON: {exc})") from None
        if isinstance(data, dict) and "results_version" in data:  # another major may hold anything: told first
            check_version("results", data["results_version"], f"{path}:{n}")
        problem = record_problem(data)
        if problem:
            raise TulvingError(f"{path}:{n}: not a result record ({problem})")
        check_version("results", data.get("results_version", 1), f"{path}:{n}")
        records.append(ResultRecord.from_json(data))
    return records


_NUMBER = (int, float)
# The type(s) each key of a line may hold (None allowed where the format says null).
_TYPES: dict[str, tuple[type, ...]] = {
    "results_version": (int, str), "q_idx": (int,), "question": (str,), "retrieval_type": (str,), "get": (str,), "correct_answer": (list,),
    "chapters": (list,), "n_chapters": (int,), "bin": (str,), "model": (str,), "mode": (str,),
    "answer": (str,), "answer_error": (str, type(None)), "n_chunks": (int, type(None)),
    "input_tokens": (int,), "output_tokens": (int,), "cache_read_tokens": (int,), "cache_write_tokens": (int,), "latency": _NUMBER, "cost": _NUMBER,
    "reasoning": (str, type(None)),
    "evidence_chapters": (list, type(None)), "evidence": (list, type(None)), "evidence_tokens": (int, type(None)),
    "evidence_cut": (int, type(None)), "evidence_cut_tokens": (int, type(None)),
    "retrieval_recall": (int, float, type(None)), "retrieval_precision": (int, float, type(None)),
    "judge": (str,), "judge_reply": (str, type(None)), "judge_draws": (int,), "judge_failed": (bool,),
    "judge_error": (str, type(None)), "identified_items": (list,), "matching_scores": (list,),
    "f1": (int, float, type(None)), "chrono_reply": (str, type(None)), "chrono_indices": (list, type(None)),
    "tau": (int, float, type(None)), "exact_match": (bool, type(None)), "judge_cost": _NUMBER,
}


def record_problem(data: object) -> str | None:
    """Why `data` is not a results.jsonl line, or None."""
    if not isinstance(data, dict):
        return f"a JSON {type(data).__name__}, not an object"
    for key in ("q_idx", "question"):
        if key not in data:
            return f"no {key}"
    for key, types in _TYPES.items():
        if key in data:
            value = data[key]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                return f"{key} is {type(value).__name__}, expected {' or '.join(t.__name__ for t in types)}"
    if data.get("get", "all") not in ("all", "latest", "chronological"):
        return f"get is {data['get']!r}"
    for key in ("matching_scores", "chrono_indices"):
        values = data.get(key) or []
        if not all(isinstance(v, _NUMBER) and not isinstance(v, bool) for v in values):
            return f"{key} holds a value that is not a number"
    return None
