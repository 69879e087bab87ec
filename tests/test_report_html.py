"""`tulving report RUN_DIR... --out DIR` as a subprocess over real run folders:
the files it writes, the tables' rows, and everything from a model shown as text."""
from __future__ import annotations

import csv
import json
import re

import pytest

from engine.benchmark.evaluation.html_report import esc
from engine.benchmark.evaluation.tables import md_cell
from tests.report_runs import (
    EVIL_JUDGE_FAILURES,
    EVIL_MODEL,
    SAMPLE,
    SAMPLED_MODEL,
    hostile_run,
    offline_run,
    renamed_run,
    tulving,
)

TABLES = ["leaderboard", "f1_by_bin_all", "f1_by_bin_latest", "f1_by_bin_chronological", "published_f1_by_bin",
          "f1_by_cue_bin", "f1_by_trace_bin", "f1_by_cue_items_bin", "f1_by_cue_trace", "latest", "chronological",
          "execution", "cost", "pairwise_wilcoxon", "bootstrap_vs_best", "memory_systems"]
FIGURES = ["f1_by_bin", "f1_heatmap_cue", "cd_diagram", "bootstrap_vs_best", "accuracy_cost", "item_positions",
           "entity_track"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    good = offline_run(root, "good")
    hostile_run(good, root / "evil")
    renamed_run(good, root / "sampled", SAMPLED_MODEL, SAMPLE)
    result = tulving(root, "report", "good", "evil", "sampled", "--out", "rep")
    assert result.returncode == 0, result.stderr
    assert "index.html" in result.stdout
    return root / "rep"


def _csv(report, key):
    with open(report / "tables" / f"{key}.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_every_table_and_figure_is_written(report):
    for key in TABLES:
        assert (report / "tables" / f"{key}.md").stat().st_size > 0
        assert (report / "tables" / f"{key}.csv").stat().st_size > 0
    for name in FIGURES:
        assert (report / "figures" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in (report / "figures" / f"{name}.svg").read_bytes()[:2000]
    html = (report / "index.html").read_text()
    assert html.count('src="data:image/png;base64,') == len(FIGURES)
    # Self-contained: nothing fetched from anywhere.
    assert not re.search(r'(src|href)="(https?:)?//', html) and "<link" not in html


def test_tables_have_one_row_per_configuration_and_keep_failures_and_samples_visible(report):
    rows = {r["Model"]: r for r in _csv(report, "f1_by_bin_all")}
    assert list(rows) == ["builtin:reader", "builtin:reader-sampled", EVIL_MODEL]
    evil = rows[EVIL_MODEL]
    assert int(evil["judge failures"]) == EVIL_JUDGE_FAILURES + 1 and "1 answer error(s)" in evil["notes"]
    assert rows[SAMPLED_MODEL]["notes"].endswith(f"sample of {SAMPLE}/456 questions")
    assert rows["builtin:reader"]["0 (150) n"] == "150" and rows["builtin:reader"]["judge failures"] == "0"
    board = _csv(report, "leaderboard")
    # Samples are listed last; the judge failures are in the leaderboard too.
    assert [r["Model"] for r in board] == ["builtin:reader", EVIL_MODEL, SAMPLED_MODEL]
    assert board[1]["judge failures"] == str(EVIL_JUDGE_FAILURES + 1)
    # The short book is not the leaderboard's book: no published leaderboard rows,
    # but the paper's short-book F1 table is there.
    assert all(r["source"] == "this report" for r in board)
    published = _csv(report, "published_f1_by_bin")
    assert len(published) == 11 and {r["Book"] for r in published} == {"short book"}
    cue_items = _csv(report, "f1_by_cue_items_bin")
    assert {r["Cue items"] for r in cue_items if r["Model"] == "builtin:reader"} == {"1", "2", "3", "4"}
    scores = json.loads((report / "scores.json").read_text())
    assert {r["model"] for r in scores["runs"]} == {"builtin:reader", EVIL_MODEL, SAMPLED_MODEL}
    boot = _csv(report, "bootstrap_vs_best")
    assert len(boot) == 1 and (boot[0]["resamples"], boot[0]["seed"]) == ("10000", "0")
    # Ranked: the two full runs, not the sample.
    assert set(scores["ranking"]["average_ranks"]) == {"builtin:reader / in-context", f"{EVIL_MODEL} / in-context"}


def test_markdown_tables_escape_pipes(report):
    md = (report / "tables" / "f1_by_bin_all.md").read_text()
    row = next(line for line in md.splitlines() if "evil" in line)

    header = next(line for line in md.splitlines() if line.startswith("| Model"))
    assert "evil\\|<b>$\\\\frac$model</b>" in row
    def unescaped(line):
        return len(re.findall(r"(?<!\\)\|", line))
    assert unescaped(row) == unescaped(header)


def test_html_shows_model_output_as_text(report):
    html = (report / "index.html").read_text()
    assert html.count("<script") == 1  # ours only
    assert "window.PWNED" in html and "<script>window.PWNED" not in html
    assert "&lt;script&gt;window.PWNED=1&lt;/script&gt;&lt;/table&gt;&lt;/td&gt;| a pipe" in html
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "\x00" not in html and "\x1b" not in html
    assert "\\x1b[31mred\\x1b[0m nul\\x00end" in html
    assert "evil|&lt;b&gt;$\\frac$model&lt;/b&gt;" in html and "<b>" not in html
    # Every table opened is closed: no answer closed one early.
    assert html.count("<table") == html.count("</table>") == len(TABLES) + 1  # + the drill-down


def test_drill_down_has_one_row_per_configuration_and_question(report):
    html = (report / "index.html").read_text()
    drill = html[html.index('id="drill"'):]
    assert drill.count("<tr ") + drill.count("<tr>") - 1 == 2 * 456 + SAMPLE  # minus the header row
    assert drill.count('data-status="judge failure"') == EVIL_JUDGE_FAILURES
    assert drill.count('data-status="answer error"') == 1
    assert 'data-model="evil|&lt;b&gt;$\\frac$model&lt;/b&gt;"' in drill


@pytest.mark.parametrize("text, html_text, md_text", [
    ("<script>x</script>", "&lt;script&gt;x&lt;/script&gt;", "<script>x</script>"),
    ("a|b", "a|b", "a\\|b"),
    ("\x1b[1mbold", "\\x1b[1mbold", "\\x1b[1mbold"),
    ("nul\x00", "nul\\x00", "nul\\x00"),
    ('"quoted" & \'single\'', "&quot;quoted&quot; &amp; &#x27;single&#x27;", '"quoted" & \'single\''),
    ("two\nlines", "two\nlines", "two lines"),
])
def test_escaping_of_each_kind(text, html_text, md_text):
    assert esc(text) == html_text
    assert md_cell(text) == md_text


def test_several_folders_need_out(tmp_path):
    result = tulving(tmp_path, "report", "a", "b")
    assert result.returncode != 0 and "--out" in result.stderr


def test_tables_agree_with_scores_json(report):
    runs = {r["model"]: r for r in json.loads((report / "scores.json").read_text())["runs"]}
    for row in _csv(report, "f1_by_bin_all"):
        for b, cell in runs[row["Model"]]["bins"].items():
            column = next(k[:-5] for k in row if k.startswith(f"{b} (") and k.endswith(" mean"))
            assert float(row[column + " mean"]) == pytest.approx(cell["mean"], abs=0.0051)
            assert int(row[column + " n"]) == cell["count"]
    for row in _csv(report, "chronological"):
        order = runs[row["Model"]]["order"]
        assert (int(row["considered"]), int(row["exact matches"])) == (order["considered"], order["exact_matches"])
    for row in _csv(report, "leaderboard"):
        run = runs[row["Model"]]
        assert row["Simple Recall"] == f"{run['simple_recall']:.3f}"
        ca = run["chronological_awareness"]
        expected = ("undefined" if run["chronological_asked"] else "-") if ca is None else f"{ca:.3f}"
        assert row["Chronological Awareness"] == expected
