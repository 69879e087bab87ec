"""Every count of `tulving run` says what it counts, the same way everywhere
(docs/reports.md, "What the counts mean"), through the CLI as a subprocess:
the progress line's final total, the summary's lines, run.json and the
report agree on calls and cached calls; a run that makes fewer calls than it
planned says why, and the reason checks out against results.jsonl."""
from __future__ import annotations

import json
import re

from engine.benchmark.evaluation.results import load_results
from tests.report_runs import tulving


def _n(text: str) -> int:
    return int(text.replace(",", ""))


def test_a_run_short_of_its_plan_says_why_and_every_count_agrees(tmp_path):
    # The built-in reader over retrieved paragraphs: some chronological answers name no event,
    # so their chronological judgment is never asked; many judgments repeat within the run (cached).
    done = tulving(tmp_path, "--cache", "c.sqlite", "run", "--book", "synaptic-echoes-short", "--models",
                   "builtin:reader", "--modes", "rag-paragraph", "--embed-model", "local:minilm", "--out", "run")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    total = next(m for m in map(re.compile(r"^total: ([\d,]+) calls, ([\d,]+) cached \|").match, lines) if m)
    calls, cached = _n(total[1]), _n(total[2])
    planned = next(m for m in map(re.compile(
        r"^of the ([\d,]+) calls planned, ([\d,]+) were not needed: ([\d,]+) chronological judgments of answers "
        r"that named no event to order$").match, lines) if m)
    assert _n(planned[1]) - _n(planned[2]) == calls and _n(planned[2]) == _n(planned[3]) > 0
    # The reason checks out: chronological questions with a ground truth whose answer named nothing.
    records = load_results(tmp_path / "run")
    unordered = [r for r in records if r.get == "chronological" and r.correct_answer and not r.identified_items]
    assert len(unordered) == _n(planned[3])
    # "cached" is said once, and is the same figure in the summary, run.json and scores.json.
    assert any(line.startswith(f"cached: {cached:,} calls answered by Tulving's cache, or by an identical call")
               for line in lines) and cached > 0  # a brand-new cache: judgments asked twice in this run
    per_role = {m[1]: (_n(m[2]), _n(m[3])) for m in map(re.compile(
        r"^  \S+ (answer|judge|memory [^:]+: \w+): ([\d,]+) calls? \(([\d,]+) cached\)").match, lines) if m}
    assert sum(c for c, _ in per_role.values()) == calls and sum(h for _, h in per_role.values()) == cached
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert sum(r["calls"] for r in run["spending"]) == calls and sum(r["cached"] for r in run["spending"]) == cached
    [job] = run["jobs"]
    assert job["calls"] + run["retrieval"]["calls"] == calls
    assert job["cache_hits"] + run["retrieval"]["cache_hits"] == cached
    [row] = json.loads((tmp_path / "run" / "scores.json").read_text())["runs"]
    assert (row["calls"], row["cache_hits"]) == (job["calls"], job["cache_hits"])
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| calls | cached |" in report and "cache hits" not in report
