"""`tulving verify BUNDLE`: a bundle checked offline, without a single call.

Checks, each ok, FAILED or skipped (with why):
- digests: the bundle's and every record's `sha256` recomputed;
- book and question set: when the book is here (published, installed, or
  `--book`), its SHA-256 and the question set built from it equal the
  bundle's, and every record's question and ground truth are the set's;
  question ids recomputed from each record's question and the bundle's book digest;
- judge prompts: each record's judge prompt rebuilt from its question and
  answer (and the chronological prompt from the items the reply identified)
  has the recorded digest, so an answer edited after judging is caught
  (skipped when this Tulving's judge prompts differ from the bundle's);
- judgments: every judge reply parsed again (judge_parse.py; a released
  evaluation as the release importer reads it) gives the record's items,
  scores, F1, chronological indices, tau, exact match and failure;
- scores: the run's scores recomputed from those judgments (report.summarize,
  as `tulving run` computes them) against the claimed scores.json, figure by
  figure, the ranking block too (average ranks, Friedman and pairwise tests).

What it cannot prove: that the judge replies came from the judge named. A
forger who edits an answer or a reply and recomputes every digest and score
makes a bundle that verifies; `--rejudge JUDGE` judges the answers again and
measures how far the new judgments agree with the bundle's (docs/formats.md).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from engine.benchmark.evaluation import judge_parse, scores
from engine.benchmark.evaluation.bundle import (
    RELEASED,
    Json,
    bundle_results,
    chrono_prompt_digest,
    judge_prompt_digest,
    judge_prompt_version,
    record_digest,
    sha256,
)
from engine.benchmark.evaluation.question_ids import (
    QUESTION_KEYS,
    book_sha256,
    question_id,
    question_of,
    questions_sha256,
)
from engine.benchmark.evaluation.questions import build_questions
from engine.benchmark.evaluation.report import summarize
from engine.benchmark.evaluation.results import ResultRecord
from engine.benchmark.generation.bookdir import Book
from providers.base import JSONValue

OK, FAILED, SKIPPED = "ok", "FAILED", "skipped"
SHOWN = 5  # problems named per check
V = TypeVar("V")
DERIVED = ("identified_items", "matching_scores", "f1", "chrono_indices", "tau", "exact_match", "judge_failed")


@dataclass(slots=True)
class Check:
    name: str
    status: str
    detail: str = ""


@dataclass(slots=True)
class Figure:
    configuration: str
    name: str
    claimed: JSONValue   # the bundle's figure
    recomputed: object   # the scorer's (report.summarize)

    @property
    def follows(self) -> bool:
        return _same(self.claimed, self.recomputed)


@dataclass(slots=True)
class Verification:
    checks: list[Check] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    seconds: float = 0.0
    calls: int = 0  # model calls made: none, ever

    @property
    def verified(self) -> bool:
        return all(c.status != FAILED for c in self.checks) and all(f.follows for f in self.figures)

    def add(self, name: str, problems: Sequence[str], done: int, skipped: str = "") -> None:
        """A check from its problems: FAILED naming the first few, else ok (or skipped: why)."""
        if problems:
            more = f" (and {len(problems) - SHOWN} more)" if len(problems) > SHOWN else ""
            self.checks.append(Check(name, FAILED, "; ".join(problems[:SHOWN]) + more))
        elif skipped and not done:
            self.checks.append(Check(name, SKIPPED, skipped))
        else:
            self.checks.append(Check(name, OK, f"{done} checked" + (f"; {skipped}" if skipped else "")))


def _same(a: JSONValue, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _lines(bundle: Mapping[str, JSONValue]) -> list[Json]:
    records = bundle.get("records")
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []


def _name(line: Mapping[str, JSONValue]) -> str:
    return f"{line.get('question_id') or line.get('q_idx')} ({line.get('model')} / {line.get('mode')})"



# -- digests, book, questions -------------------------------------------------------
def check_digests(bundle: Json, out: Verification) -> None:
    lines = _lines(bundle)
    problems = [] if sha256({k: v for k, v in bundle.items() if k != "sha256"}) == bundle.get("sha256") else [
        "the bundle's sha256 does not match its content (edited after it was written)"]
    problems += [f"record {_name(line)}: sha256 does not match its content" for line in lines
                 if record_digest(line) != line.get("sha256")]
    out.add("digests", problems, len(lines) + 1)


def check_book(bundle: Json, book: Book | None, out: Verification) -> None:
    claimed_book = _field(bundle, "book", "sha256")
    lines = _lines(bundle)
    ids = [f"record {_name(line)}: question id does not follow from its question"
           for line in lines if question_id(question_of(line), str(claimed_book)) != line.get("question_id")]
    out.add("question ids", ids, len(lines))
    if book is None:
        out.add("book and question set", [], 0, "the book is not here (pass --book): ground truth taken from the bundle")
        return
    if book_sha256(book) != claimed_book:
        out.add("book and question set", [f"the book here has SHA-256 {book_sha256(book)[:16]}..., the bundle's "
                                          f"{str(claimed_book)[:16]}...: another book or another version"], 1)
        return
    questions = build_questions(book)
    problems = [] if questions_sha256(questions) == _field(bundle, "questions", "sha256") else [
        "the question set built from the book differs from the bundle's"]
    by_idx: dict[object, dict[str, object]] = {q.q_idx: q.to_json() for q in questions}
    for line in lines:
        mine = by_idx.get(line.get("q_idx"))
        if mine is None or any(mine[k] != line.get(k) for k in QUESTION_KEYS):
            problems.append(f"record {_name(line)}: question or ground truth differs from the book's set")
    out.add("book and question set", problems, len(lines))


def _field(bundle: Mapping[str, JSONValue], part: str, key: str) -> JSONValue:
    section = bundle.get(part)
    return section.get(key) if isinstance(section, dict) else None


# -- judge prompts and judgments ----------------------------------------------------
def check_prompts(bundle: Json, book: Book | None, out: Verification) -> None:
    if _field(bundle, "judge", "prompt_version") != judge_prompt_version():
        out.add("judge prompts", [], 0, "the bundle's judge prompts are not this Tulving's: digests not rebuilt")
        return
    problems, done, unchecked = [], 0, 0
    for line in _lines(bundle):
        recorded = line.get("judge_prompt_sha256")
        if recorded is None:
            if not line.get("answer_error") and line.get("judge_reply") is not None:
                problems.append(f"record {_name(line)}: judged, but no judge prompt digest")
            continue
        rebuilt = judge_prompt_digest(question_of(line), str(line.get("answer")), book)
        if rebuilt is None:
            unchecked += 1
            continue
        done += 1
        if rebuilt != recorded:
            problems.append(f"record {_name(line)}: the answer is not the one judged (judge prompt digest differs)")
        chrono = line.get("chrono_prompt_sha256")
        if chrono is not None and chrono != chrono_prompt_digest(_strings(line.get("correct_answer")),
                                                                 _strings(line.get("identified_items"))):
            problems.append(f"record {_name(line)}: the chronological judgment is not of the items identified")
    out.add("judge prompts", problems, done, f"{unchecked} full-detail prompts need the book" if unchecked else "")


def _strings(value: JSONValue) -> list[str]:
    return [str(x) for x in value] if isinstance(value, list) else []


def _load_json(text: JSONValue) -> JSONValue:
    try:
        data: JSONValue = json.loads(str(text))
        return data
    except json.JSONDecodeError:
        return None


def _verdict(line: Mapping[str, JSONValue], released: bool) -> tuple[list[str], list[float]] | None:
    """(items, scores) of the record's reply, None when it cannot be read."""
    reply, truth = line.get("judge_reply"), _strings(line.get("correct_answer"))
    if reply is None:
        return None
    if released:
        from engine.benchmark.release.runs import released_verdict

        found = released_verdict(_load_json(reply), truth)
        return None if isinstance(found, str) else found
    try:
        verdict = judge_parse.parse_judge_reply(str(reply), truth)
    except judge_parse.JudgeReplyError:
        return None
    return list(verdict.identified_items), list(verdict.scores)


def _indices(line: Mapping[str, JSONValue], items: list[str], released: bool) -> list[int] | None:
    """The chronological indices of the record's reply, [] when nothing was to be ordered, None: unreadable."""
    truth = _strings(line.get("correct_answer"))
    reply = line.get("chrono_reply")
    if reply is None:
        return None if truth and items else []
    if released:
        from engine.benchmark.release.runs import released_indices

        return released_indices(_load_json(reply))
    try:
        return judge_parse.parse_chrono_reply(str(reply), len(scores.distinct(items)),
                                              len(scores.distinct(truth)))
    except judge_parse.JudgeReplyError:
        return None


def rederive(line: Mapping[str, JSONValue], released: bool = False) -> dict[str, object]:
    """The judgment fields (DERIVED) as the record's replies give them."""
    out: dict[str, object] = {"identified_items": [], "matching_scores": [], "f1": None, "chrono_indices": None,
                              "tau": None, "exact_match": None, "judge_failed": True}
    verdict = None if line.get("answer_error") else _verdict(line, released)
    if verdict is None:
        return out
    items, found = verdict
    truth = _strings(line.get("correct_answer"))
    out.update(identified_items=items, matching_scores=found, judge_failed=False,
               f1=float(scores.lenient_f1(items, truth, found)))
    if line.get("get") == "chronological":
        indices = _indices(line, items, released)
        if indices is None:
            out.update(f1=None, judge_failed=True)
            return out
        match = scores.chrono_match(indices, len(scores.distinct(truth)))
        out.update(chrono_indices=list(indices), exact_match=bool(match.exact_match),
                   tau=None if match.tau is None else float(match.tau))
    return out


def _differences(line: Mapping[str, JSONValue], derived: Mapping[str, object]) -> list[str]:
    if line.get("answer_error"):  # not judged: only the absence of a score is checked
        return [] if line.get("f1") is None else ["f1"]
    if derived["judge_failed"]:  # a failed judgment keeps what it had: its items may stay, its score may not
        return [k for k in ("f1", "judge_failed") if not _same(line.get(k), derived[k])]
    return [k for k in DERIVED if not _same(line.get(k), derived[k])]


def check_judgments(bundle: Json, out: Verification) -> list[ResultRecord]:
    """The records with their judgments re-derived from the replies (the scores are recomputed from them)."""
    released = bundle.get("judgments") == RELEASED
    lines = _lines(bundle)
    problems, records = [], []
    for line, rec in zip(lines, bundle_results(bundle)):
        derived = rederive(line, released)
        wrong = _differences(line, derived)
        if wrong:
            problems.append(f"record {_name(line)}: {', '.join(wrong)} do not follow from the judge reply")
        if not line.get("answer_error"):
            for key, value in derived.items():
                setattr(rec, key, value)
        records.append(rec)
    out.add("judgments", problems, len(lines))
    return records


# -- scores ---------------------------------------------------------------------------
def _row_figures(row: Mapping[str, V]) -> Iterator[tuple[str, V | None]]:
    """The figures of a scores row: the bundle's (JSON) or the scorer's."""
    for key in ("questions", "sample", "scored", "answer_errors", "judge_failures", "simple_recall",
                "simple_recall_ci", "chronological_awareness", "chronological_awareness_ci"):
        yield key, row.get(key)
    for part, keys in (("latest", ("score",)), ("order", ("considered", "exact_matches", "all", "tau", "score"))):
        section = row.get(part)
        for key in keys:
            yield f"{part}.{key}", section.get(key) if isinstance(section, dict) else None
    bins = row.get("bins")
    for b, cell in (bins.items() if isinstance(bins, dict) else []):
        yield f"bins.{b}.mean", cell.get("mean") if isinstance(cell, dict) else None
        yield f"bins.{b}.count", cell.get("count") if isinstance(cell, dict) else None


def _ranking_figures(ranking: Mapping[str, V] | None) -> Iterator[tuple[str, str, V | None]]:
    """The ranking block's figures as (configuration, name, value): average
    ranks, the Friedman p, each pair's Holm-adjusted p and verdict, the cliques."""
    if ranking is None:
        return
    yield "ranking", "n_questions", ranking.get("n_questions")
    yield "ranking", "friedman_p", ranking.get("friedman_p")
    yield "ranking", "cliques", ranking.get("cliques")
    ranks = ranking.get("average_ranks")
    for name, value in sorted(ranks.items()) if isinstance(ranks, dict) else []:
        yield str(name), "average rank", value
    pairs = ranking.get("pairs")
    for pair in pairs if isinstance(pairs, list) else []:
        if isinstance(pair, dict):
            label = f"{pair.get('a')} vs {pair.get('b')}"
            yield label, "p_holm", pair.get("p_holm")
            yield label, "significant", pair.get("significant")


def check_ranking(claimed: Mapping[str, JSONValue] | None, recomputed: Mapping[str, object] | None,
                  out: Verification) -> None:
    """The claimed ranking (average ranks, tests between configurations)
    against the one recomputed from the judgments; a ranking claimed where
    none follows, or left out where one does, is a figure that does not follow."""
    theirs = {(c, n): v for c, n, v in _ranking_figures(claimed)}
    ours = {(c, n): v for c, n, v in _ranking_figures(recomputed)}
    for key in list(ours) + [k for k in theirs if k not in ours]:
        out.figures.append(Figure(key[0], key[1], theirs.get(key), ours.get(key)))


def check_scores(bundle: Json, records: list[ResultRecord], out: Verification) -> None:
    found = bundle.get("run")
    run: Json = found if isinstance(found, dict) else {}
    summary = summarize(records, run)
    claimed_ranking = _field(bundle, "claimed", "ranking")
    check_ranking(claimed_ranking if isinstance(claimed_ranking, dict) else None, summary.get("ranking"), out)
    recomputed = {(r["model"], r["mode"]): r for r in summary["runs"]}
    claimed_rows = _field(bundle, "claimed", "runs")
    claimed = {(r.get("model"), r.get("mode")): r for r in claimed_rows if isinstance(r, dict)} \
        if isinstance(claimed_rows, list) else {}
    problems = [f"{m} / {mode}: claimed, but no record of it" for m, mode in claimed if (m, mode) not in recomputed]
    problems += [f"{m} / {mode}: recorded, but no claimed score" for m, mode in recomputed if (m, mode) not in claimed]
    out.add("configurations", problems, len(recomputed))
    for key, row in recomputed.items():
        if key in claimed:
            theirs = dict(_row_figures(claimed[key]))
            for name, value in _row_figures(row):
                out.figures.append(Figure(f"{key[0]} / {key[1]}", name, theirs.get(name), value))


def verify_bundle(bundle: Json, book: Book | None = None) -> Verification:
    """Every check of the module docstring, offline."""
    started = time.perf_counter()
    out = Verification()
    check_digests(bundle, out)
    check_book(bundle, book, out)
    check_prompts(bundle, book, out)
    records = check_judgments(bundle, out)
    check_scores(bundle, records, out)
    out.seconds = time.perf_counter() - started
    return out
