"""`tulving export RUN --format inspect`: a run as Inspect logs, written through inspect_ai's own log API.

One `.eval` log per (model, memory system) of the run, in one folder
(`inspect view --log-dir FOLDER` lists them): the task is the benchmark on
the run's book, the model the answering model (an answers file's system),
one sample per question:

- id: the question id (question_ids.py), input: the question, target: the
  ground-truth items, messages: the question and the answer, output: the answer;
- scores: `f1` (the lenient F1 the judge's verdict gives; none when the
  judgment failed), its answer the answer and its explanation the judge's
  reply, with the identified items, matching scores, tau and exact match as
  metadata;
- metadata: get, bin, cue, retrieval type, matching chapters, evidence chapters.

The log's results hold the run's scores (Simple Recall, Chronological
Awareness and their 95% intervals, as scores.json), its stats the tokens
used, its spec the judge, the memory system and the provenance. Needs
inspect_ai (`pip install 'tulving-bench[export]'`).
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType

from engine.benchmark.evaluation.question_ids import book_sha256, question_id, question_of
from engine.benchmark.evaluation.report import RunRow, summarize
from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.generation.bookdir import Book
from providers.base import TulvingError

TASK = "episodic_memory_benchmark"


def _inspect() -> tuple[ModuleType, ModuleType, ModuleType]:
    """inspect_ai's log, model and scorer modules (the `export` extra)."""
    try:
        import inspect_ai.log as log
        import inspect_ai.model as model
        import inspect_ai.scorer as scorer
    except ImportError:
        raise TulvingError("--format inspect needs inspect_ai: pip install 'tulving-bench[export]'") from None
    return log, model, scorer



def sample(r: ResultRecord, book_digest: str) -> object:
    """One Inspect sample of a results record."""
    log, model, scorer = _inspect()
    scores = {}
    if r.f1 is not None:
        scores["f1"] = scorer.Score(value=r.f1, answer=r.answer, explanation=r.judge_reply,
                                    metadata={"identified_items": list(r.identified_items),
                                              "matching_scores": list(r.matching_scores), "tau": r.tau,
                                              "exact_match": r.exact_match, "judge": r.judge})
    usage = model.ModelUsage(input_tokens=r.input_tokens, output_tokens=r.output_tokens,
                             total_tokens=r.input_tokens + r.output_tokens,
                             input_tokens_cache_read=r.cache_read_tokens or None,
                             input_tokens_cache_write=r.cache_write_tokens or None)
    return log.EvalSample(
        id=question_id(question_of(r), book_digest), epoch=1, input=r.question, target=list(r.correct_answer) or "",
        messages=[model.ChatMessageUser(content=r.question), model.ChatMessageAssistant(content=r.answer)],
        output=model.ModelOutput.from_content(r.model, r.answer, error=r.answer_error),
        scores=scores, model_usage={r.model: usage},
        metadata={"q_idx": r.q_idx, "get": r.get, "bin": r.bin, "cue": r.cue, "retrieval_type": r.retrieval_type,
                  "chapters": list(r.chapters), "evidence_chapters": r.evidence_chapters,
                  "judge_failed": r.judge_failed, "judge_error": r.judge_error, "answer_error": r.answer_error})


def _metrics(row: RunRow) -> dict[str, object]:
    log, _, _ = _inspect()
    values = {"simple_recall": row["simple_recall"], "chronological_awareness": row["chronological_awareness"]}
    for name in ("simple_recall", "chronological_awareness"):
        ci = row.get(f"{name}_ci")
        if isinstance(ci, list):
            values[f"{name}_ci_low"], values[f"{name}_ci_high"] = ci
    return {k: log.EvalMetric(name=k, value=v) for k, v in values.items() if isinstance(v, (int, float))}


def eval_log(records: Sequence[ResultRecord], run: Mapping[str, object], book: Book) -> object:
    """The Inspect log of one configuration's records."""
    log, model, _ = _inspect()
    first = records[0]
    row = summarize(records, run)["runs"][0]
    found = run.get("provenance")
    prov: Mapping[str, object] = found if isinstance(found, dict) else {}
    started = str(prov.get("started") or "")
    digest = book_sha256(book)
    spec = log.EvalSpec(
        created=started or "1970-01-01T00:00:00+00:00", task=TASK, task_args={"book": book.name, "memory": first.mode},
        dataset=log.EvalDataset(name=str(book.name), samples=len(records), sample_ids=None),
        model=first.model, config=log.EvalConfig(), packages={"tulving-bench": str(prov.get("tulving_version"))},
        metadata={"memory": first.mode, "judge": first.judge, "book_sha256": digest, "source": run.get("source"),
                  "sample": row["sample"], "provenance": prov})
    usage = model.ModelUsage(input_tokens=sum(r.input_tokens for r in records),
                             output_tokens=sum(r.output_tokens for r in records),
                             total_tokens=sum(r.input_tokens + r.output_tokens for r in records))
    results = log.EvalResults(total_samples=len(records), completed_samples=row["scored"], scores=[
        log.EvalScore(name="tulving", scorer=f"judge {first.judge}", metrics=_metrics(row),
                      scored_samples=row["scored"], unscored_samples=len(records) - row["scored"])])
    return log.EvalLog(status="success", eval=spec, results=results,
                       stats=log.EvalStats(started_at=started, completed_at=str(prov.get("ended") or ""),
                                           model_usage={first.model: usage}),
                       samples=[sample(r, digest) for r in records])


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


def export_inspect(records: Sequence[ResultRecord], run: Mapping[str, object], book: Book, out: Path) -> list[Path]:
    """One .eval per (model, mode) in `out`; the paths written."""
    log, _, _ = _inspect()
    groups: dict[tuple[str, str], list[ResultRecord]] = {}
    for r in records:
        groups.setdefault((r.model, r.mode), []).append(r)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for (model_name, mode), recs in groups.items():
        path = out / f"{_slug(str(book.name))}_{_slug(model_name)}_{_slug(mode)}.eval"
        log.write_eval_log(eval_log(recs, run, book), path, format="eval")
        paths.append(path)
    return paths
