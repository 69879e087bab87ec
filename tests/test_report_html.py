"""`tulving report RUN_DIR... --out DIR` as a subprocess over real run folders:
the files it writes, the tables' rows, and everything from a model shown as text."""
from __future__ import annotations

import csv
import json
import re
import sys

import pytest

from engine.benchmark.evaluation.html_report import esc
from engine.benchmark.evaluation.tables import md_cell
from tests.report_runs import (
    EVIL_JUDGE_FAILURES,
    EVIL_MODEL,
    SAMPLE,
    SAMPLED_MODEL,
    copied_run,
    renamed_run,
    report_of_three_runs,
    tulving,
)

TABLES = ["leaderboard", "f1_by_bin_all", "f1_by_bin_latest", "f1_by_bin_chronological", "published_f1_by_bin",
          "f1_by_cue_bin", "f1_by_trace_bin", "f1_by_cue_items_bin", "f1_by_cue_trace", "latest", "chronological",
          "execution", "cost", "pairwise_wilcoxon", "bootstrap_vs_best", "memory_systems"]
FIGURES = ["f1_by_bin", "f1_heatmap_cue", "cd_diagram", "bootstrap_vs_best", "accuracy_cost", "item_positions",
           "entity_track"]


@pytest.fixture(scope="module")
def report(three_run_report):
    """The report over a good, a hostile and a sampled run (conftest.py; the same one
    tests/test_browser_report.py reads)."""
    return three_run_report


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


def test_no_figures_writes_every_table_the_same_and_no_image_without_matplotlib(report, offline_short_run,
                                                                                 tmp_path, monkeypatch):
    """`--no-figures`: the same tables, byte for byte, as the report with figures
    over the same three runs; no figures folder, no image, and the report says
    the figures were left out. matplotlib is made unimportable: had the report
    reached for it, it would have said "not installed" instead."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    bare = report_of_three_runs(offline_short_run, tmp_path, "--no-figures")
    assert not (bare / "figures").exists() and not list(bare.rglob("*.png")) and not list(bare.rglob("*.svg"))
    names = sorted(p.name for p in (report / "tables").iterdir())
    assert sorted(p.name for p in (bare / "tables").iterdir()) == names
    assert all((bare / "tables" / n).read_bytes() == (report / "tables" / n).read_bytes() for n in names)
    html, md = (bare / "index.html").read_text(), (bare / "report.md").read_text()
    assert "data:image" not in html and "<img" not in html and "figures/" not in md
    assert all(f'id="t-{key}"' in html for key in TABLES)
    for text in (html, md):
        assert "figures left out: --no-figures" in text and "not installed" not in text
    assert json.loads((bare / "scores.json").read_text()) == json.loads((report / "scores.json").read_text())


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


def test_the_leaderboard_gives_each_score_its_95_percent_interval(report):
    runs = {r["model"]: r for r in json.loads((report / "scores.json").read_text())["runs"]}
    html = (report / "index.html").read_text()
    for row in _csv(report, "leaderboard"):
        run = runs[row["Model"]]
        low, high = run["simple_recall_ci"]
        assert (row["Simple Recall 95% CI low"], row["Simple Recall 95% CI high"]) == (f"{low:.3f}", f"{high:.3f}")
        # As the CLI and report.md show it, in the HTML leaderboard too.
        assert f"{run['simple_recall']:.3f} [{low:.3f}, {high:.3f}]</td>" in html


def test_the_page_counts_questions_and_results_and_explains_the_cue_notation(report):
    html = (report / "index.html").read_text()
    # 3 configurations over the 456 questions: 456 + 456 + SAMPLE results (it said "952 questions").
    assert f"3 configurations over 456 questions: {2 * 456 + SAMPLE} results" in html
    assert "answered questions" not in html
    breakdowns = html[html.index('<section id="breakdowns">'):]
    assert breakdowns.index("time (t), space (s), entity (ent) or content (c)") < breakdowns.index("<table")
    # Scores with 2 decimals in every table but the leaderboard's 3 (the Latest column had 4).
    assert all(re.fullmatch(r"\d\.\d\d", row["Latest"]) for row in _csv(report, "latest"))


def test_names_and_figures_never_wrap_and_text_wraps_between_words(report):
    html = (report / "index.html").read_text()
    assert "word-break" not in html  # it broke "builtin:reader" into "builtin:r" / "eader"
    drill = html[html.index('id="drill"'):]
    first = drill[drill.index("<tbody>"):].split("</tr>")[0]
    classes = re.findall(r'<td class="(\w+)">', first)
    assert classes[:9] == ["label"] * 9 and classes[9:14] == ["text"] * 5 and classes[14:19] == ["num"] * 5
    board = html[html.index('id="t-leaderboard"'):].split("</table>")[0]
    assert '<td class="label">builtin:reader</td>' in board and '<td class="num">456/456</td>' in board


def test_a_smoke_check_is_listed_apart_and_never_ranked(tmp_path, offline_short_run):
    good = copied_run(offline_short_run, tmp_path, "good")
    smoke = renamed_run(good, tmp_path / "smoke", "local:tiny", 2)
    run = json.loads((smoke / "run.json").read_text())
    run["jobs"][0]["smoke"] = True
    (smoke / "run.json").write_text(json.dumps(run))
    alone = tulving(tmp_path, "report", "smoke")
    assert alone.returncode == 0, alone.stderr
    assert "local:tiny" not in alone.stdout.split("Smoke check")[0].split("\n", 2)[2]  # not a row of the table
    assert "Smoke check, not ranked: local:tiny / in-context answered 2 of the 456 questions" in alone.stdout
    assert "## Smoke check (not ranked)" in (smoke / "report.md").read_text()
    both = tulving(tmp_path, "report", "good", "smoke", "--out", "rep", "--no-figures")
    assert both.returncode == 0, both.stderr
    board = {r["Model"]: r for r in _csv(tmp_path / "rep", "leaderboard")}
    assert board["builtin:reader"]["#"] == "1"
    assert board["local:tiny"]["#"] == "-" and board["local:tiny"]["notes"].startswith("smoke check, not ranked")


def test_the_f1_figure_names_every_published_run_legibly_and_its_legend_hides_no_point():
    """The short book's 11 published rows end close together: their names
    used to overlap in a heap, and the legend sat on the lowest points."""
    from engine.benchmark.evaluation import figures as F
    from engine.benchmark.evaluation.tables import _load_published

    rows = _load_published("paper_f1_by_bin.json")["short_book"]
    published = {f"{r['model']} / {r['memory']}": {b: c["mean"] for b, c in r["bins"].items()} for r in rows}
    bins = ["0", "1", "2", "3-5"]
    series = {"builtin:reader / in-context": {"0": (1.0, 0.0), "1": (0.61, 0.49), "2": (0.55, 0.43), "3-5": (0.71, 0.36)},
              "local:smollm2 / rag-paragraph": {"0": (0.0, 0.0), "1": (0.02, 0.1)}}
    fig = F.f1_by_bin_figure(series, bins, "F1", published)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    [ax] = fig.axes
    names = [t for t in ax.texts]
    assert sorted(t.get_text() for t in names) == sorted(published)
    boxes = [t.get_window_extent(renderer) for t in names]
    assert all(b.height >= 8 for b in boxes)  # 6.5 pt at 100 dpi: about 9 px, legible
    assert not [(names[i].get_text(), names[j].get_text()) for i in range(len(boxes)) for j in range(i)
                if boxes[i].overlaps(boxes[j])]
    legend = ax.get_legend().get_window_extent(renderer)
    points = [(float(x), m) for per in series.values() for x, (b, (m, _)) in enumerate(per.items())]
    shown = ax.transData.transform(points)
    assert not [p for p in shown if legend.contains(*p)]
    assert legend.y1 < ax.get_window_extent(renderer).y0  # under the axes
    import matplotlib.pyplot as plt

    plt.close(fig)
