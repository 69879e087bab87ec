"""`tulving run --shard i/n`: shards partition the work; the report over the
shard folders equals the unsplit run's; the shards' caches, merged with
`tulving cache export` / `cache import`, replay the unsplit run with 0 calls."""
from __future__ import annotations

import csv
import filecmp
import json

import pytest

from engine.benchmark.evaluation.pipeline import plan_jobs
from engine.benchmark.evaluation.shard import parse_shard, shard_jobs
from engine.errors import TulvingError
from tests.report_runs import copied_run, offline_run, tulving

# Figures of one execution, not of the answers: they differ between any two runs.
EXECUTION = ("wall_seconds", "cache_hits")



def test_parse_shard():
    assert parse_shard("2/3") == (2, 3) and parse_shard(" 1 / 1 ") == (1, 1)
    for bad in ("0/3", "4/3", "1/0", "a/b", "3", ""):
        with pytest.raises(TulvingError):
            parse_shard(bad)


def test_shards_partition_the_jobs_whatever_the_order_of_models(short_questions):
    jobs = plan_jobs(short_questions, ["m1", "m2"], ["in-context", "rag-paragraph"], {("m2", "in-context"): 50})
    everything = sorted((j.model, j.mode, q.q_idx) for j in jobs for q in j.questions)
    shares = [sorted((j.model, j.mode, q.q_idx) for j in shard_jobs(jobs, i, 3) for q in j.questions)
              for i in (1, 2, 3)]
    assert sorted(t for s in shares for t in s) == everything  # every triple once
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    reordered = plan_jobs(short_questions, ["m2", "m1"], ["rag-paragraph", "in-context"], {("m2", "in-context"): 50})
    assert sorted((j.model, j.mode, q.q_idx) for j in shard_jobs(reordered, 2, 3) for q in j.questions) == shares[1]
    sampled = {(j.model, j.mode): j.sample for j in shard_jobs(jobs, 1, 3)}
    assert sampled[("m2", "in-context")] == 50 and sampled[("m1", "in-context")] is None


def _scores(path):
    data = json.loads(path.read_text())
    data.pop("spending", None)  # calls, tokens and dollars of one execution (by model and role)
    data.pop("provenance", None)  # who ran it, when, with which versions: each execution's own
    data.pop("memory", None)  # each memory system's time, calls and latency: each execution prepared it
    for row in data["runs"]:
        for key in EXECUTION:
            row.pop(key, None)
    return data


def test_three_shards_report_as_the_unsplit_run_and_their_caches_replay_it(tmp_path, offline_short_run):
    whole = copied_run(offline_short_run, tmp_path, "whole")  # the unsplit run, made in a cache of its own (conftest.py)
    for i in (1, 2, 3):
        offline_run(tmp_path, f"shard{i}", "--shard", f"{i}/3", cache=f"shard{i}.sqlite")
        assert json.loads((tmp_path / f"shard{i}" / "run.json").read_text())["shard"] == f"{i}/3"
    sizes = [len((tmp_path / f"shard{i}" / "results.jsonl").read_text().splitlines()) for i in (1, 2, 3)]
    assert sizes == [152, 152, 152]

    for args in (("whole",), ("shard1", "shard2", "shard3")):
        result = tulving(tmp_path, "report", *args, "--out", f"report-{len(args)}", "--no-figures")
        assert result.returncode == 0, result.stderr
    one, three = tmp_path / "report-1", tmp_path / "report-3"
    assert _scores(one / "scores.json") == _scores(three / "scores.json")
    assert json.loads((one / "scores.json").read_text())["runs"][0]["calls"] == \
        json.loads((three / "scores.json").read_text())["runs"][0]["calls"]
    tables = sorted(p.name for p in (one / "tables").iterdir() if p.stem not in ("execution", "cost", "memory_systems"))
    match, mismatch, errors = filecmp.cmpfiles(one / "tables", three / "tables", tables, shallow=False)
    assert not mismatch and not errors and len(match) > 10
    with open(three / "tables" / "execution.csv", newline="") as f:
        [execution] = list(csv.DictReader(f))
    assert execution["shards"] == "1/3, 2/3, 3/3" and execution["questions"] == "456"
    # A folder that repeats another's questions is not a shard: the first folder's results are kept, and said.
    overlap = tulving(tmp_path, "report", "whole", "shard2", "--out", "report-overlap", "--no-figures")
    assert overlap.returncode == 0, overlap.stderr
    assert "152 (model, mode, question) results found in more than one folder" in overlap.stderr
    assert _scores(tmp_path / "report-overlap" / "scores.json")["runs"][0]["questions"] == 456

    for i in (1, 2, 3):
        assert tulving(tmp_path, "--cache", f"shard{i}.sqlite", "cache", "export", f"shard{i}.jsonl").returncode == 0
        merged = tulving(tmp_path, "--cache", "merged.sqlite", "cache", "import", f"shard{i}.jsonl")
        assert merged.returncode == 0, merged.stderr
    rerun = offline_run(tmp_path, "rerun", cache="merged.sqlite")
    engine = json.loads((rerun / "run.json").read_text())["engine"]
    assert engine["calls"] == 0 and engine["cache_hits"] > 0
    assert _scores(rerun / "scores.json") == _scores(whole / "scores.json")
    # Which answers came from the cache is recorded per question, and shown in the drill-down.
    assert json.loads((whole / "run.json").read_text())["jobs"][0]["cached_answers"] == []
    assert len(json.loads((rerun / "run.json").read_text())["jobs"][0]["cached_answers"]) == 456
    for name, expected in (("whole", "no"), ("rerun", "yes")):
        assert tulving(tmp_path, "report", name, "--out", f"drill-{name}", "--no-figures").returncode == 0
        html = (tmp_path / f"drill-{name}" / "index.html").read_text()
        assert html.count(f"<td>{expected}</td><td>ok</td>") == 456, name


def test_a_bad_shard_is_refused(tmp_path):
    result = tulving(tmp_path, "run", "--models", "builtin:reader", "--shard", "4/3")
    assert result.returncode != 0 and "--shard" in result.stderr
