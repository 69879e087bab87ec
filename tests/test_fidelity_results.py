"""Run outputs after the fidelity fixes: results.jsonl carries its version
(results made with the older prompts and scoring are refused, never mixed
with new ones), and scores.json says undefined rather than 0."""
from __future__ import annotations

import json

import pytest

from engine.benchmark.evaluation.results import RESULTS_VERSION, ResultRecord, load_results, write_results
from engine.errors import TulvingError


def test_results_of_another_version_are_refused(tmp_path):
    path = write_results(tmp_path / "results.jsonl", [ResultRecord(q_idx=0, question="q?", f1=0.5)])
    assert json.loads(path.read_text())["results_version"] == RESULTS_VERSION == "2.1"
    assert load_results(path)[0].f1 == 0.5
    old = json.loads(path.read_text())
    old["results_version"] = 2  # version 2 written as an integer (before MAJOR.MINOR): read as 2.0
    path.write_text(json.dumps(old) + "\n")
    assert load_results(path)[0].f1 == 0.5
    del old["results_version"]  # written before the fidelity fixes
    path.write_text(json.dumps(old) + "\n")
    with pytest.raises(TulvingError, match=r"results format version 1.0, this Tulving reads 2.x \(written with other"):
        load_results(path)


def test_report_says_undefined_not_zero():
    """No considered chronological question: Order and the score are null
    in scores.json (shown as "-"), not 0; bin means are the scores' own."""
    from engine.benchmark.evaluation.report import summarize_run

    records = [ResultRecord(q_idx=i, question="q?", get="latest", bin="2", f1=f) for i, f in enumerate([0.9, 0.8])]
    records += [ResultRecord(q_idx=9, question="q?", get="all", bin="1", f1=f) for f in (0.9, 0.8, 0.7, 0.1)]
    row = summarize_run("m", "in-context", records)
    assert row["chronological_awareness"] is None
    assert row["order"] == {"considered": 0, "exact_matches": 0, "all": None, "tau": None, "score": None}
    assert row["latest"]["score"] == 0.85
    assert row["bins"]["1"]["mean"] == 0.62  # the compensated mean of 0.625, not np.mean's 0.63


async def test_pipeline_keeps_full_precision_and_distinct_chronology(tmp_path, long_book, long_questions):
    """Through the real pipeline (built-in reader and judge): F1 and tau are
    stored unrounded, and the chronological questions whose ground truth
    repeats an item are judged on the distinct items."""
    from engine.benchmark.evaluation import answers as A
    from engine.benchmark.evaluation import pipeline
    from engine.benchmark.evaluation.scores import chrono_match, distinct, kendall_tau, lenient_f1
    from engine.config import Config
    from engine.scheduler import Engine

    questions = [q for q in long_questions if q.get == "chronological"
                 and len(distinct(q.correct_answer)) < len(q.correct_answer)]
    questions += [q for q in long_questions if q.get == "all"][::40]
    config = Config.load()
    jobs = pipeline.plan_jobs(questions, ["builtin:reader"], [A.IN_CONTEXT])
    async with Engine(config, cache_path=str(tmp_path / "cache.sqlite")) as engine:
        ev = await pipeline.evaluate(engine, config, long_book, questions, jobs, judge="builtin:judge")
    chrono = 0
    for r in ev.records:
        assert r.f1 == lenient_f1(r.identified_items, r.correct_answer, r.matching_scores)
        if r.get == "chronological" and r.chrono_indices is not None:
            chrono += 1
            n = len(distinct(r.correct_answer))
            assert len(r.chrono_indices) == len(distinct(r.identified_items))
            assert r.exact_match == chrono_match(r.chrono_indices, n).exact_match
            assert r.tau == kendall_tau(chrono_match(r.chrono_indices, n).kept)
    assert chrono >= 10
