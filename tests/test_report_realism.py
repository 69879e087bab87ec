"""The realism ablation in the report of several runs (`tulving report RUN...
--out DIR`), through the CLI as a subprocess: per configuration, the same
split as the single-run report (questions by the realism rating of their
chapters, F1 of each class, the Mann-Whitney U test of the difference), in
scores.json, report.md, index.html and tables/."""
from __future__ import annotations

import csv
import json

from engine.benchmark.evaluation.statistics import format_p
from tests.test_trust import env, run_cli

IN_CONTEXT, RAG = "builtin:reader / in-context", "builtin:reader / rag-paragraph"


async def test_the_report_of_several_runs_splits_each_configuration_by_realism(tmp_path, realism_runs):
    runs, e = realism_runs, env(tmp_path)  # REALISM_STEPS' book and runs (tests/conftest.py), read in place
    alone = {name: json.loads((runs / name / "scores.json").read_text())["realism"] for name in ("run", "rag")}

    code, out, err = await run_cli(runs, "report", "run", "rag", "--out", str(tmp_path / "both"), "--no-figures",
                                   environ=e)
    assert code == 0, err
    scores = json.loads((tmp_path / "both" / "scores.json").read_text())
    # The same split as each run's own report: reused, not computed anew another way.
    assert scores["realism"] == {IN_CONTEXT: alone["run"][IN_CONTEXT], RAG: alone["rag"][RAG]}
    split = scores["realism"][IN_CONTEXT]
    assert split["n"]["realistic"] > 0 and split["n"]["non-realistic"] > 0 and 0 < split["p_two_sided"] <= 1
    md = (tmp_path / "both" / "report.md").read_text()
    assert "# Realistic vs non-realistic events (the paper's realism ablation)" in md
    assert f"| Bin | Realism | Count | {IN_CONTEXT} | {RAG} |" in md
    count = split["bins"]["1"]["realistic"]["count"]
    assert f"| 1 | realistic | {count} |" in md
    # The test of the difference, per configuration.
    test_row = (f"| {IN_CONTEXT} | {split['n']['non-realistic']} | {split['mean']['non-realistic']:.3f} | "
                f"{split['n']['realistic']} | {split['mean']['realistic']:.3f} | {format_p(split['p_two_sided'])} | "
                f"{format_p(split['p_non_realistic_higher'])} |")
    assert test_row in md
    html = (tmp_path / "both" / "index.html").read_text()
    assert 'id="t-realism"' in html and 'id="t-realism_tests"' in html
    tests = list(csv.reader((tmp_path / "both" / "tables" / "realism_tests.csv").open()))
    assert [r[0] for r in tests[1:]] == [IN_CONTEXT, RAG]
    rows = list(csv.reader((tmp_path / "both" / "tables" / "realism.csv").open()))
    assert rows[0][:3] == ["Bin", "Realism", "Count"] and ["1", "realistic", str(count)] in [r[:3] for r in rows]

    # --realism FILE rates the chapters of runs whose book folder holds no ratings (here: the same file).
    code, out, err = await run_cli(runs, "report", "run", "--out", str(tmp_path / "given"), "--no-figures",
                                   "--realism", str(runs / "book" / "realism.json"), environ=e)
    assert code == 0, err
    assert json.loads((tmp_path / "given" / "scores.json").read_text())["realism"] == {IN_CONTEXT: split}
    # Runs on two books: no realism section for the unrated one, nothing broken for the rated one...
    code, out, err = await run_cli(runs, "report", "run", "unrated", "--out", str(tmp_path / "mixed"), "--no-figures",
                                   environ=e)
    assert code == 0, err
    groups = json.loads((tmp_path / "mixed" / "scores.json").read_text())["groups"]
    assert [bool(g.get("realism")) for g in groups].count(True) == 1
    # ...and one --realism FILE cannot rate two books: one line, nothing written.
    code, out, err = await run_cli(runs, "report", "run", "unrated", "--out", str(tmp_path / "refused"), "--realism",
                                   str(runs / "book" / "realism.json"), environ=e)
    assert code != 0 and err.count("\n") == 1 and "--realism" in err and "several" in err
    assert not (tmp_path / "refused").exists()
