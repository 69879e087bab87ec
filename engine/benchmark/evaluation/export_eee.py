"""`tulving export RUN --format every-eval-ever`: a run as Every Eval Ever records (schema 0.3.0).

Per (model, memory system) of the run, in the datastore layout the package's
own converters write (`data/<dataset>/<developer>/<model>/<uuid>.json` and
`<uuid>_samples.jsonl`, the uuid a version-4 UUID drawn from a digest of the
run, so an export of the same run has the same names):

- the aggregate record: source (a Tulving run, an answers file or the paper's
  published runs), the library (tulving, its version, the judge), the model,
  and two results, Simple Recall and Chronological Awareness, each with its
  95% bootstrap interval, its question count and the LLM judge with the
  paper's judge prompt (`llm_scoring`);
- the instance-level records, one per question: the question and its
  ground truth, the answer, the judge's F1 as the score (`is_correct`: F1 = 1;
  a failed judgment or answer has score 0 and says so in `error`, and is
  left out of the aggregate as in scores.json), the tokens and latency, and
  the question's kind, bin, cue and id as metadata. 'all' questions point at
  the Simple Recall result, 'latest' and 'chronological' ones at the
  Chronological Awareness result.

Validated in tests/test_exports.py with the every-eval-ever package's own
validator (Python >= 3.12, in a virtual environment of its own).
"""
from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from engine import __version__ as TULVING_VERSION
from engine.benchmark.evaluation import judge
from engine.benchmark.evaluation.intervals import NOTE as INTERVALS_NOTE
from engine.benchmark.evaluation.question_ids import book_sha256, question_id, question_of
from engine.benchmark.evaluation.report import RunRow, summarize
from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.generation.bookdir import Book

SCHEMA_VERSION = "0.3.0"
Json = dict[str, object]
_RESULTS = {"simple_recall": ("Simple Recall", "the mean over bins (matching events 0, 1, 2, 3-5, 6+) of the mean "
                              "lenient F1 of 'all' questions, judged by an LLM judge"),
            "chronological_awareness": ("Chronological Awareness", "the mean of Latest (F1 of 'latest' questions, "
                                        "bins 2+) and Order (exact-match share x Kendall tau)")}


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "unknown"


def _strings(data: Mapping[str, object]) -> dict[str, str]:
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in data.items() if v is not None}


def _model_info(model: str, mode: str, run: Mapping[str, object]) -> Json:
    prov = run.get("provenance") if isinstance(run.get("provenance"), dict) else {}
    models = prov.get("models") if isinstance(prov, dict) else None
    found = models.get(model) if isinstance(models, dict) else None
    kinds = [e.get("kind") for e in found.get("endpoints", [])] if isinstance(found, dict) else []
    developer = _slug(str(kinds[0])) if kinds and kinds[0] else "unknown"
    provider_id = str(found.get("model")) if isinstance(found, dict) and found.get("model") else model
    return {"name": model, "id": f"{developer}/{_slug(provider_id)}", "developer": developer,
            "additional_details": {"deployment_type": "unknown", "model_availability": "unknown",
                                   "memory": mode, "alias": model}}


def _source(run: Mapping[str, object]) -> Json:
    published = run.get("source") == "published release"
    return {"source_name": "Episodic Memory Benchmark (published release)" if published else "tulving",
            "source_type": "evaluation_run",
            "source_organization_name": "Huet, Ben Houidi, Rossi (ICLR 2025)" if published else "unknown",
            "evaluator_relationship": "third_party",
            "additional_details": _strings({"source": run.get("source") or "tulving run", "doi": run.get("doi")})}


def _result(name: str, row: RunRow, dataset: Json, judge_model: str) -> Json | None:
    value = row.get(name)
    if not isinstance(value, (int, float)):
        return None
    title, description = _RESULTS[name]
    ci = row.get(f"{name}_ci")
    uncertainty: Json = {"num_samples": row["scored"]}
    if isinstance(ci, list):
        uncertainty["confidence_interval"] = {"lower": ci[0], "upper": ci[1], "confidence_level": 0.95,
                                              "method": INTERVALS_NOTE}
    return {"evaluation_result_id": name, "evaluation_name": title, "source_data": dataset,
            "metric_config": {"evaluation_description": description, "metric_id": f"episodic_memory.{name}",
                              "metric_name": title, "metric_kind": "f1", "metric_unit": "proportion",
                              "lower_is_better": False, "score_type": "continuous", "min_score": 0, "max_score": 1,
                              "llm_scoring": {"judges": [{"model_info": {
                                  "name": judge_model, "id": f"judge/{_slug(judge_model)}", "additional_details": {
                                      "deployment_type": "unknown", "model_availability": "unknown"}}}],
                                  "input_prompt": judge._JUDGE_TEMPLATE}},
            "score_details": {"score": value, "uncertainty": uncertainty,
                              "details": _strings({"questions": row["questions"], "sample": row["sample"],
                                                   "judge_failures": row["judge_failures"],
                                                   "answer_errors": row["answer_errors"]})}}



def instance(r: ResultRecord, evaluation_id: str, model_id: str, book_digest: str) -> Json:
    """One instance-level record of a results record."""
    error = r.answer_error or (f"judge failure (left out of the scores): {r.judge_error}" if r.f1 is None else None)
    result_id = "simple_recall" if r.get == "all" else "chronological_awareness"
    reference = [str(x) for x in r.correct_answer]
    return {"schema_version": SCHEMA_VERSION, "evaluation_id": evaluation_id, "model_id": model_id,
            "evaluation_name": _RESULTS[result_id][0], "evaluation_result_id": result_id,
            "sample_id": question_id(question_of(r), book_digest),
            "sample_hash": hashlib.sha256(json.dumps([r.question, reference]).encode()).hexdigest(),
            "interaction_type": "single_turn", "input": {"raw": r.question, "reference": reference},
            "output": {"raw": [r.answer]}, "messages": None,
            "answer_attribution": [{"turn_idx": 0, "source": "output.raw", "extracted_value": r.answer,
                                    "extraction_method": "llm_judge", "is_terminal": True}],
            "evaluation": {"score": float(r.f1 or 0.0), "is_correct": r.f1 == 1.0},
            "token_usage": {"input_tokens": r.input_tokens, "output_tokens": r.output_tokens,
                            "total_tokens": r.input_tokens + r.output_tokens,
                            "input_tokens_cache_read": r.cache_read_tokens, "input_tokens_cache_write": r.cache_write_tokens},
            "performance": {"latency_ms": round(r.latency * 1000, 3)}, "error": error,
            "metadata": _strings({"q_idx": str(r.q_idx), "get": r.get, "bin": r.bin, "cue": r.cue,
                                  "retrieval_type": r.retrieval_type, "judge": r.judge, "memory": r.mode,
                                  "f1": r.f1, "tau": r.tau, "exact_match": r.exact_match})}


def _when(run: Mapping[str, object]) -> str:
    prov = run.get("provenance")
    started = prov.get("started") if isinstance(prov, dict) else None
    try:
        import datetime as dt

        return str(int(dt.datetime.fromisoformat(str(started)).timestamp())) if started else "0"
    except ValueError:
        return "0"


def export_configuration(records: Sequence[ResultRecord], run: Mapping[str, object], book: Book, out: Path
                         ) -> tuple[Path, Path]:
    """The aggregate and instance-level files of one (model, mode)."""
    first = records[0]
    row = summarize(records, run)["runs"][0]
    digest = book_sha256(book)
    dataset_name = f"episodic-memory-benchmark-{book.name}"
    dataset: Json = {"dataset_name": dataset_name, "source_type": "other",
                     "additional_details": {"book": str(book.name), "book_sha256": digest}}
    info = _model_info(first.model, first.mode, run)
    when = _when(run)
    evaluation_id = f"{dataset_name}/{str(info['id']).replace('/', '_')}__{_slug(first.mode)}/{when}"
    file_uuid = str(uuid.UUID(bytes=hashlib.sha256(evaluation_id.encode()).digest()[:16], version=4))
    folder = out / "data" / dataset_name / str(info["developer"]) / str(info["id"]).split("/", 1)[1]
    folder.mkdir(parents=True, exist_ok=True)
    samples = folder / f"{file_uuid}_samples.jsonl"
    samples.write_text("".join(json.dumps(instance(r, evaluation_id, str(info["id"]), digest), ensure_ascii=False)
                               + "\n" for r in records), encoding="utf-8")
    results = [res for name in _RESULTS if (res := _result(name, row, dataset, first.judge)) is not None]
    aggregate: Json = {
        "schema_version": SCHEMA_VERSION, "evaluation_id": evaluation_id, "evaluation_timestamp": when,
        "retrieved_timestamp": str(int(time.time())), "source_metadata": _source(run),
        "eval_library": {"name": "tulving", "version": TULVING_VERSION,
                         "additional_details": _strings({"judge": first.judge, "memory": first.mode})},
        "model_info": info, "evaluation_results": results,
        "detailed_evaluation_results": {"format": "jsonl", "file_path": samples.relative_to(out).as_posix(),
                                        "hash_algorithm": "sha256",
                                        "checksum": hashlib.sha256(samples.read_bytes()).hexdigest(),
                                        "total_rows": len(records)}}
    path = folder / f"{file_uuid}.json"
    path.write_text(json.dumps(aggregate, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path, samples


def export_eee(records: Sequence[ResultRecord], run: Mapping[str, object], book: Book, out: Path) -> list[Path]:
    """Every (model, mode) of the run; the files written."""
    groups: dict[tuple[str, str], list[ResultRecord]] = {}
    for r in records:
        groups.setdefault((r.model, r.mode), []).append(r)
    written: list[Path] = []
    for recs in groups.values():
        written += export_configuration(recs, run, book, out)
    return written
