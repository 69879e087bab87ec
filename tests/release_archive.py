"""Release archives for the tests, in the published release's layout (engine/benchmark/release/layout.py),
written with the file formats the reference uses: JSON as its export_list writes it (indent 2,
ensure_ascii False), parquet tables with the columns its pandas frames have (written here with pyarrow:
pandas is not a dependency), answers / evaluations / chronological judgments as its scorer writes them.

Built from the packaged books: the default short book (and optionally the long one) under the
claude writer, and the short book again under the gpt-4o writer (so one book is really installed).
"""
from __future__ import annotations

import copy
import json
import zipfile
from functools import cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from engine.benchmark.datadir import published_book_dir
from engine.benchmark.evaluation.questions import Question, build_questions
from engine.benchmark.generation.bookdir import read_book_dir
from engine.benchmark.release.layout import WRITER_CLAUDE, WRITER_GPT4O

EXPERIMENT = "Udefault_Sdefault_seed0"
MODEL_A = "gpt-4o-mini-2024-07-18"   # answers every even question exactly, the odd ones with nothing
MODEL_B = "claude-3-haiku-20240307"  # answers nothing


def export_list(data: object, path: Path) -> None:
    """As epbench/src/io/io.py writes every JSON file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=2)


def book_dir_name(writer: str, n_chapters: int, n_tokens: int) -> str:
    return f"model_{writer}_itermax_10_Idefault_nbchapters_{n_chapters}_nbtokens_{n_tokens}"


def groundtruth_table(chapters: list[dict]) -> pa.Table:
    """df_book_groundtruth's columns (generate_4_books.py, build_chapter)."""
    def counts(field: str) -> list[int]:
        values = [c[field] for c in chapters]
        return [values.count(v) for v in values]
    return pa.table({
        "chapter": [c["chapter"] for c in chapters],
        "date": [c["date"] for c in chapters], "location": [c["location"] for c in chapters],
        "entity": [c["entity"] for c in chapters], "content": [c["content"] for c in chapters],
        "post_entities": [c["secondary_entities"] for c in chapters],
        "n_date": counts("date"), "n_location": counts("location"), "n_entity": counts("entity"),
        "n_content": counts("content"),
        "raw_generated_paragraph_idx": [c["event_index"] for c in chapters],
    })


def qa_table(questions: list[Question]) -> pa.Table:
    """df_qa's columns (qa_generation.py, build_qa_func). An "all" question's answer was a set:
    stored here in reverse order, so the importer must not rely on it."""
    def unordered(q: Question, items: list) -> list:
        return list(reversed(items)) if q.get == "all" else list(items)
    bins = {"3-5": "{3,4,5}"}
    return pa.table({
        "q_idx": [q.template for q in questions],
        "bins_items_correct_answer": pa.array([bins.get(q.bin, q.bin) for q in questions]).dictionary_encode(),
        "debug_level_2": list(range(len(questions))),
        "question": [q.question for q in questions], "cue": [q.cue for q in questions],
        "cue_completed": [q.cue_completed for q in questions], "retrieval_type": [q.retrieval_type for q in questions],
        "get": [q.get for q in questions],
        "correct_answer": [unordered(q, q.correct_answer) for q in questions],
        "correct_answer_chapters": [unordered(q, q.chapters) for q in questions],
        "correct_answer_detailed": [str(dict(zip(q.chapters, q.correct_answer))) for q in questions],
        "n_items_correct_answer": [len(q.correct_answer) for q in questions],
        "n_chapters_correct_answer": [q.n_chapters for q in questions],
        "debug_changed": [[] for _ in questions], "debug_existing_change": [False for _ in questions],
    })


def reference_f1(n_pred: int, n_gt: int, total: float) -> float:
    """scoring_answers.py, generate_metric_original + f1_score_func, written out again."""
    if n_pred > n_gt > 0:
        n_pred = n_gt
    precision = total / n_pred if n_pred > 0 else None
    recall = total / n_gt if n_gt > 0 else None
    if precision == 0 and recall == 0:
        return 0.0
    if precision is not None and recall is not None:
        return 2 * precision * recall / (precision + recall)
    return 1.0 if precision is None and recall is None else 0.0


def write_answers(folder: Path, questions: list[Question], exact: bool) -> list[float]:
    """An answering model's three folders; the reference F1 of each question."""
    f1s = []
    for q_row, q in enumerate(questions):
        good = exact and q_row % 2 == 0
        items = list(dict.fromkeys(q.correct_answer)) if good else []
        export_list("; ".join(items) if items else "I cannot find this in the book.", folder / "raw_answers" / f"{q_row}.json")
        gt = list(reversed(q.correct_answer)) if q.get == "all" else list(q.correct_answer)
        scores = [{item: 1 if good else 0} for item in gt]
        total = float(sum(next(iter(s.values())) for s in scores))
        f1 = reference_f1(len(items), len(gt), total)
        f1s.append(f1)
        export_list({"predicted_items": items, "groundtruth_items": gt, "matching_groundtruth_items_score": scores,
                     "explanation": "test", "nb_preds": len(items), "nb_gt": len(gt), "sum_scores": total,
                     "precision": None, "recall": None, "f1_score": f1}, folder / "evaluated_answers" / f"{q_row}.json")
        if q.get == "chronological":
            distinct = list(dict.fromkeys(q.correct_answer))
            export_list({"groundtruth_indexes": list(range(len(distinct))),
                         "predicted_indexes": list(range(len(items))), "explanation": "test"},
                        folder / "chronological_answers" / f"{q_row}.json")
    return f1s


@cache
def _questions(name: str) -> list[Question]:
    return build_questions(name)


def write_book(experiment: Path, name: str, writer: str, *, answers: bool = False) -> tuple[Path, list[Question]]:
    raw = read_book_dir(published_book_dir(name))
    questions = copy.deepcopy(_questions(name))
    n_tokens = 10_397 if name.endswith("short") else 102_870
    folder = experiment / "books" / book_dir_name(writer, len(raw["chapters"]), n_tokens)
    export_list(raw["text"], folder / "book.json")
    pq.write_table(groundtruth_table(raw["chapters"]), folder / "df_book_groundtruth.parquet")
    pq.write_table(qa_table(questions), folder / "df_qa.parquet")
    if answers:
        base = experiment / "answers" / folder.name
        write_answers(base / f"answered_by_kind_prompting_model_{MODEL_A}", questions, exact=True)
        write_answers(base / f"answered_by_kind_prompting_model_{MODEL_B}", questions, exact=False)
        rag = base / f"answered_by_kind_rag_model_{MODEL_A}_chunk_paragraph_top5"
        write_answers(rag, questions[:3], exact=True)  # a run with answers for 3 questions only
    return folder, questions


def build_release(root: Path, *, long: bool = False) -> Path:
    """The release folder (root/data/<experiment>/...): the folder the zip holds."""
    data = root / "data"
    experiment = data / EXPERIMENT
    long_raw = read_book_dir(published_book_dir("synaptic-echoes"))
    export_list([[e["date"], e["location"], e["entity"], e["content"], e["detail"]] for e in long_raw["events"]],
                experiment / "events.json")
    export_list(long_raw["meta_events"], experiment / "meta_events.json")
    write_book(experiment, "synaptic-echoes-short", WRITER_CLAUDE, answers=True)
    write_book(experiment, "synaptic-echoes-short", WRITER_GPT4O)
    if long:
        write_book(experiment, "synaptic-echoes", WRITER_CLAUDE)
    return data


def zip_folder(folder: Path, zip_path: Path) -> Path:
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.rglob("*")):
            archive.write(path, path.relative_to(folder.parent))
    return zip_path
