"""The paper's answers and judgments turned into Tulving run folders.

One run folder per (model, mode, book): results.jsonl (results.py), run.json
with the provenance ("source": "published release", the DOI, the release
folder), scores.json and report.md (report.py), so `tulving report` and
`tulving compare` read them like any run.

Per question (the df_qa row q, files {q}.json, layout.py):
- answer          raw_answers/{q}.json (the answer text, a JSON string)
- identified_items, matching_scores   evaluated_answers/{q}.json: `predicted_items`
                  and `matching_groundtruth_items_score`, a list of {item: score}
                  (scoring_answers.py, generate_metric_original). The scores are
                  put in the order of Tulving's ground truth by item (an "all"
                  question's items were a set: any order).
- f1              re-scored by Tulving's scorer (scores.lenient_f1, the reference's
                  default remove_duplicates policy), not copied.
- chrono_indices  chronological_answers/{q}.json `predicted_indexes`; tau and
                  exact match by scores.chrono_match.
The judge is the book's writer model (the reference judged with the model that
wrote the book: generator_answers_1_prompting.py). The judge's raw reply text
was not released: judge_reply stays null; chrono_reply holds the released
chronological judgment as JSON.

`write_bundle` writes the run's bundle.json (engine/benchmark/evaluation/bundle.py)
with the released evaluation JSON of each question where a Tulving run has the
judge's reply text: `tulving verify` re-scores it from the released judgments
(`released_verdict`, `released_indices`), and `tulving leaderboard` shows the
paper's rows beside anyone's.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from engine.benchmark.evaluation import scores
from engine.benchmark.evaluation.formats import current as current_version
from engine.benchmark.evaluation.questions import Question
from engine.benchmark.evaluation.report import render_markdown, summarize
from engine.benchmark.evaluation.results import RESULTS_FILE, ResultRecord, write_results
from engine.benchmark.generation.bookdir import Book
from engine.benchmark.release.layout import DOI, AnswerDir, ReleaseBook, ReleaseError
from providers.base import JSONObject, JSONValue

SOURCE = "published release"


def _load(path: Path) -> JSONValue:
    """A released JSON file, or None when absent."""
    if not path.is_file():
        return None
    try:
        data: JSONValue = json.loads(path.read_text(encoding="utf-8"))
        return data
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReleaseError(f"{path}: not JSON ({exc})") from None


def _scores_by_item(evaluation: JSONObject, ground_truth: Sequence[str]) -> list[float] | str:
    """The judge's score per ground-truth item in Tulving's order, or why not.

    By item name; when the judge reworded an item but scored as many items as
    there are (the reference only checked the count), in the released order:
    F1 depends on the sum of the scores only, so it is kept."""
    given: dict[str, float] = {}
    in_order: list[float] = []
    entries = evaluation.get("matching_groundtruth_items_score") or []
    if not isinstance(entries, list):
        return f"matching scores {entries!r} are not a list"
    for entry in entries:
        if not isinstance(entry, dict) or len(entry) != 1:
            return f"matching score entry {entry!r} is not one {{item: score}}"
        (item, value), = entry.items()
        number = _number(value)
        if number is None:
            return f"score {value!r} of {item!r} is not a number"
        in_order.append(number)
        given.setdefault(item, number)
    if all(item in given for item in ground_truth):
        return [given[item] for item in ground_truth]
    if len(in_order) == len(ground_truth):
        return in_order
    missing = next(item for item in ground_truth if item not in given)
    return f"the released evaluation scores no {missing!r} ({len(in_order)} scores for {len(ground_truth)} items)"


def _number(value: JSONValue) -> float | None:
    """`float(value)` of a number or a numeric string, else None."""
    try:
        return float(value) if isinstance(value, (int, float, str)) else None
    except ValueError:
        return None


def released_verdict(evaluation: JSONValue, ground_truth: Sequence[str]) -> tuple[list[str], list[float]] | str:
    """(identified items, score per ground-truth item) of a released evaluation
    (evaluated_answers/{q}.json, parsed), or why it gives none. The bundle's
    verifier reads the released judgments back with it."""
    items = evaluation.get("predicted_items") if isinstance(evaluation, dict) else None
    if not isinstance(evaluation, dict) or not isinstance(items, list):
        return "no released evaluation"
    found = _scores_by_item(evaluation, ground_truth)
    if isinstance(found, str):
        return found
    return [str(x) for x in items], found


def released_indices(judgment: JSONValue) -> list[int] | None:
    """The index per identified item of a released chronological judgment, or None."""
    found = judgment.get("predicted_indexes") if isinstance(judgment, dict) else None
    if not isinstance(found, list):
        return None
    indices = [i for i in found if isinstance(i, int) and not isinstance(i, bool)]
    return indices if len(indices) == len(found) else None


def _judge(rec: ResultRecord, evaluation: JSONValue) -> None:
    verdict = released_verdict(evaluation, rec.correct_answer)
    if isinstance(verdict, str):
        rec.judge_failed, rec.judge_error = True, verdict
        return
    rec.identified_items, rec.matching_scores = verdict
    rec.f1 = float(scores.lenient_f1(rec.identified_items, rec.correct_answer, rec.matching_scores))


def _chrono(rec: ResultRecord, judgment: JSONValue) -> None:
    n_gt = len(scores.distinct(rec.correct_answer))
    if judgment is None:
        # Nothing was judged when nothing could be ordered (as Tulving's pipeline does).
        if rec.correct_answer and rec.identified_items:
            rec.judge_failed, rec.judge_error, rec.f1 = True, "no released chronological judgment", None
            return
        indices: list[int] = []
    else:
        found = released_indices(judgment)
        if found is None:
            rec.judge_failed, rec.judge_error, rec.f1 = True, "released chronological judgment has no indexes", None
            return
        indices = found
        rec.chrono_reply = json.dumps(judgment, ensure_ascii=False)
    match = scores.chrono_match(indices, n_gt)
    rec.chrono_indices, rec.exact_match = indices, bool(match.exact_match)
    rec.tau = None if match.tau is None else float(match.tau)


def records(answers: AnswerDir, questions: Sequence[Question], judge: str) -> list[ResultRecord]:
    """One record per df_qa row (questions[q] is Tulving's question of row q)."""
    out = []
    for q, question in enumerate(questions):
        rec = ResultRecord.from_json(question.to_json())
        rec.model, rec.mode, rec.judge = answers.model, answers.mode, judge
        answer = _load(answers.folder / "raw_answers" / f"{q}.json")
        if not isinstance(answer, str):
            rec.answer_error = "no released answer"
            rec.judge_failed, rec.judge_error = True, "no released answer"
            out.append(rec)
            continue
        rec.answer, rec.judge_draws = answer, 1
        _judge(rec, _load(answers.folder / "evaluated_answers" / f"{q}.json"))
        if question.get == "chronological" and not rec.judge_failed:
            _chrono(rec, _load(answers.folder / "chronological_answers" / f"{q}.json"))
        out.append(rec)
    return out


def run_record(book: ReleaseBook, answers: AnswerDir, recs: Sequence[ResultRecord], judge: str) -> JSONObject:
    """run.json of an imported run: the provenance, and a job as Tulving's runs list them."""
    return {"run_version": current_version("run"), "book": book.published.name, "questions": len(recs), "judge": judge, "source": SOURCE, "doi": DOI,
            "release_folder": f"{book.published.experiment}/answers/{book.folder.name}/{answers.folder.name}",
            "reference_kind": answers.kind,
            "jobs": [{"model": answers.model, "mode": answers.mode, "questions": len(recs), "calls": 0,
                      "cache_hits": 0, "spent_usd": 0.0, "wall_seconds": 0.0}],
            "wall_seconds": 0.0}


def run_folder_name(answers: AnswerDir) -> str:
    return f"{answers.model}--{answers.mode}".replace("/", "_")


def write_run(folder: Path, recs: Sequence[ResultRecord], run: JSONObject) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_results(folder / RESULTS_FILE, recs)
    summary = summarize(recs, run)
    (folder / "scores.json").write_text(json.dumps(summary, indent=1) + "\n")
    (folder / "report.md").write_text(render_markdown(summary))
    (folder / "run.json").write_text(json.dumps(run, indent=1) + "\n")
    return folder


def write_bundle(folder: Path, answers: AnswerDir, questions: Sequence[Question], book: Book,
                 question_set: Sequence[Question]) -> Path:
    """The run folder's bundle.json: its records with the released evaluation
    text of question row q (questions[q]) standing for the judge's reply."""
    from engine.benchmark.evaluation.bundle import RELEASED, make_bundle, read_run
    from engine.benchmark.evaluation.bundle import write_bundle as write

    recs, run, claimed = read_run(folder)
    replies = {}
    for q, question in enumerate(questions):
        path = answers.folder / "evaluated_answers" / f"{q}.json"
        if path.is_file():
            replies[(answers.model, answers.mode, question.q_idx)] = path.read_text(encoding="utf-8")
    bundle = make_bundle(recs, run, claimed, book, question_set, judgments=RELEASED, replies=replies)
    return write(bundle, folder / "bundle.json")
