"""A run in one file anyone can verify: `tulving bundle RUN` (the format: bundle.schema.json).

    {"bundle_version": "1.0", "created": ..., "judgments": "judge-reply" | "released-evaluation",
     "book": {"name", "sha256"}, "questions": {"count", "sha256"},
     "judge": {"model", "prompt_version"}, "scorer": {"version", "tulving_version"},
     "run": run.json (provenance, configuration, jobs, spending),
     "claimed": scores.json (the scores the run claims),
     "records": [one results.jsonl line each, plus "question_id", "judge_prompt_sha256",
                 "chrono_prompt_sha256" and "sha256"],
     "sha256": digest of everything above}

Digests (SHA-256 over canonical JSON: keys sorted, no spaces, UTF-8):
- `judge_prompt_sha256`: the main judge prompt built from the record's question
  and answer (judge.py), so a reply stays tied to the answer it judged;
  `chrono_prompt_sha256`: the chronological prompt built from the items the
  reply identified (null when no chronological call was made).
- a record's `sha256`: the record without it; the bundle's `sha256`: the bundle without it.
- `judge.prompt_version`: the judge prompt templates (judge.py); `scorer.version`:
  the source of the scorer (scores.py, judge_parse.py, intervals.py).
`judgments` says what `judge_reply` holds: the judge's reply text (Tulving
runs), or the released evaluation JSON (the paper's runs: its judges' reply
text was not released). verify.py reads a bundle back and checks all of it.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

from engine import __version__ as TULVING_VERSION
from engine.benchmark.evaluation import judge
from engine.benchmark.evaluation.formats import check_version, stamp
from engine.benchmark.evaluation.provenance import utc_now
from engine.benchmark.evaluation.question_ids import book_sha256, question_id, questions_sha256
from engine.benchmark.evaluation.questions import Question
from engine.benchmark.evaluation.results import RESULTS_VERSION, ResultRecord, load_results
from engine.benchmark.evaluation.templates import FULL_DETAILS
from engine.benchmark.generation.bookdir import Book
from providers.base import JSONObject, JSONValue, TulvingError

JUDGE_REPLY = "judge-reply"
RELEASED = "released-evaluation"
Json = JSONObject  # a bundle, run.json or record as read or written
_BUNDLE_KEYS = ("question_id", "judge_prompt_sha256", "chrono_prompt_sha256", "sha256")
_SCORER_MODULES = ("scores.py", "judge_parse.py", "intervals.py")


class BundleError(TulvingError):
    """A bundle that cannot be read or written."""


def canonical(data: JSONValue) -> bytes:
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def sha256(data: JSONValue) -> str:
    return hashlib.sha256(canonical(data)).hexdigest()


def judge_prompt_version() -> str:
    """Digest of the judge prompts' system prompts and templates."""
    return sha256([judge.JUDGE_SYSTEM_PROMPT, judge._JUDGE_TEMPLATE, judge.CHRONO_SYSTEM_PROMPT,
                   judge._CHRONO_TEMPLATE])


def scorer_version() -> str:
    """Digest of the scorer's source files (any change to them changes it)."""
    folder = resources.files("engine.benchmark.evaluation")
    return sha256([folder.joinpath(name).read_text("utf-8") for name in _SCORER_MODULES])


def _messages_digest(messages: Sequence[Mapping[str, str]]) -> str:
    return sha256([dict(m) for m in messages])


def judge_prompt_digest(question: Question, answer: str, book: Book | None) -> str | None:
    """Digest of the main judge prompt of `answer`; None when it needs the
    book's chapter text (a full-detail question) and no book is given."""
    if book is None and question.retrieval_type == FULL_DETAILS and question.correct_answer:
        return None
    request = judge.judge_request(question, answer, book=book, model="")
    return _messages_digest(request.messages)


def chrono_prompt_digest(correct_answer: Sequence[str], identified_items: Sequence[str]) -> str:
    return _messages_digest(judge.chrono_judge_request({"correct_answer": list(correct_answer)}, "",
                                                       list(identified_items), model="").messages)


def _chrono_was_asked(rec: ResultRecord) -> bool:
    """Whether the run made a chronological judge call for this record."""
    return rec.get == "chronological" and rec.chrono_reply is not None


def bundle_record(rec: ResultRecord, question: Question, qid: str, book: Book, reply: str | None = None) -> Json:
    """One record of the bundle: the results line, its question id and digests.
    `reply`: what `judge_reply` holds instead of the record's (a released evaluation)."""
    line: Json = {**rec.to_json(), "results_version": RESULTS_VERSION}
    if reply is not None:
        line["judge_reply"] = reply
    judged = not rec.answer_error and line["judge_reply"] is not None
    line["question_id"] = qid
    line["judge_prompt_sha256"] = judge_prompt_digest(question, rec.answer, book) if judged else None
    line["chrono_prompt_sha256"] = (chrono_prompt_digest(question.correct_answer, rec.identified_items)
                                    if _chrono_was_asked(rec) else None)
    line["sha256"] = sha256(line)
    return line


def record_digest(line: Mapping[str, JSONValue]) -> str:
    return sha256({k: v for k, v in line.items() if k != "sha256"})


def _read_json(path: Path, what: str) -> Json | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{path}: not a readable {what} ({exc})") from None
    if not isinstance(data, dict):
        raise BundleError(f"{path}: not a {what} (not a JSON object)")
    return data


def make_bundle(records: Sequence[ResultRecord], run: Json, claimed: Json, book: Book, questions: Sequence[Question],
                *, judgments: str = JUDGE_REPLY, replies: Mapping[tuple[str, str, int], str] | None = None) -> Json:
    """The bundle of a run's records (see the module docstring). `replies`:
    (model, mode, q_idx) -> what judge_reply holds for it instead."""
    digest = book_sha256(book)
    by_idx = {q.q_idx: q for q in questions}
    missing = sorted({r.q_idx for r in records} - set(by_idx))
    if missing:
        raise BundleError(f"questions {missing[:5]} of the run are not in the question set: pass the run's "
                          "--questions file")
    judges = sorted({r.judge for r in records if r.judge}) or [str(run.get("judge") or "")]
    lines: list[JSONValue] = [bundle_record(r, by_idx[r.q_idx], question_id(by_idx[r.q_idx], digest), book,
                           (replies or {}).get((r.model, r.mode, r.q_idx))) for r in records]
    body: Json = stamp("bundle", {
        "created": utc_now(), "judgments": judgments,
        "book": {"name": str(run.get("book") or book.name), "sha256": digest},
        "questions": {"count": len(questions), "sha256": questions_sha256(questions)},
        "judge": {"model": ", ".join(judges), "prompt_version": judge_prompt_version()},
        "scorer": {"version": scorer_version(), "tulving_version": TULVING_VERSION,
                   "results_version": RESULTS_VERSION},
        "run": dict(run), "claimed": dict(claimed), "records": lines})
    body["sha256"] = sha256(body)
    return body


def read_run(folder: Path) -> tuple[list[ResultRecord], Json, Json]:
    """(records, run.json, scores.json) of a run folder; scores.json is what the run claims."""
    records = load_results(folder)
    run = _read_json(folder / "run.json", "run record")
    claimed = _read_json(folder / "scores.json", "scores file")
    if run is None or claimed is None:
        raise BundleError(f"{folder}: no {'run.json' if run is None else 'scores.json'}: a bundle holds the run's "
                          f"record and its claimed scores (run `tulving report {folder}` to write scores.json)")
    check_version("run", run.get("run_version"), str(folder / "run.json"))
    check_version("scores", claimed.get("scores_version"), str(folder / "scores.json"))
    return records, run, claimed


def write_bundle(bundle: Json, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(bundle, ensure_ascii=False, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def load_bundle(path: str | Path) -> Json:
    """A bundle file, its version checked (one line for another major)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleError(f"no bundle at {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{path}: not a readable bundle ({exc})") from None
    if not isinstance(data, dict) or "bundle_version" not in data or not isinstance(data.get("records"), list):
        raise BundleError(f"{path}: not a Tulving bundle (no bundle_version or records)")
    check_version("bundle", data["bundle_version"], str(path))
    return data


def bundle_results(bundle: Mapping[str, object]) -> list[ResultRecord]:
    """The bundle's records as results.jsonl records (its own keys dropped)."""
    lines = bundle.get("records")
    assert isinstance(lines, list)
    return [ResultRecord.from_json({k: v for k, v in line.items() if k not in _BUNDLE_KEYS}) for line in lines]

