"""The published formats: every writer's output follows its shipped JSON
Schema (results.jsonl lines, scores.json, run.json of `tulving run`, of
`tulving report --out` and of the release importer), the schemas shipped in
the package are the ones in the docs, and a reader refuses a file of another
major version with one line (today's version-2 results are still read)."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from engine.benchmark.evaluation.formats import (
    SCHEMA_FILES,
    VERSIONS,
    FormatVersionError,
    check_version,
    parse_version,
    schema,
    schema_problems,
)
from engine.benchmark.evaluation.results import load_results
from engine.cli.main import main
from tests.report_runs import offline_run, tulving

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The built-in reader in context, on RAG (evidence, retrieval recall) and without memory."""
    return offline_run(tmp_path_factory.mktemp("formats"), "run", "--modes", "in-context,rag-paragraph,no-memory",
                       "--embed-model", "local:minilm")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_schemas_are_valid_json_schemas_and_the_docs_hold_the_same_files():
    for kind, name in SCHEMA_FILES.items():
        jsonschema.Draft202012Validator.check_schema(schema(kind))
        assert schema(kind)["$id"].endswith(":" + VERSIONS[kind][0]), kind
        shipped = (REPO / "engine/benchmark/evaluation/schemas" / name).read_text()
        assert (REPO / "docs/schemas" / name).read_text() == shipped, f"docs/schemas/{name} differs from the package's"


def test_a_run_folder_follows_the_schemas(run):
    lines = _lines(run / "results.jsonl")
    assert len(lines) == 3 * 456 and all(line["results_version"] == "2.1" for line in lines)
    assert any(line.get("retrieval_recall") is not None and line.get("evidence_chapters") for line in lines)
    for line in lines:
        assert schema_problems("results", line) == []
    scores = json.loads((run / "scores.json").read_text())
    assert scores["scores_version"] == "1.0" and schema_problems("scores", scores) == []
    record = json.loads((run / "run.json").read_text())
    assert record["run_version"] == "1.0" and schema_problems("run", record) == []


def test_the_schemas_catch_what_is_wrong(run):
    """A check that can fail: a mistyped or missing key is found, with its path."""
    line = _lines(run / "results.jsonl")[0]
    assert any(p.startswith("f1:") for p in schema_problems("results", {**line, "f1": "high"}))
    assert any("'answer' is a required property" in p for p in
               schema_problems("results", {k: v for k, v in line.items() if k != "answer"}))
    assert schema_problems("results", {**line, "results_version": "3.0"})
    scores = json.loads((run / "scores.json").read_text())
    scores["runs"][0]["simple_recall"] = 1.5
    assert schema_problems("scores", scores)
    assert schema_problems("run", {"book": "b", "judge": "j", "jobs": [{"model": "m"}]})


def test_the_report_folder_and_the_release_runs_follow_the_schemas(run, tmp_path):
    result = tulving(run.parent, "report", str(run), "--out", str(tmp_path / "rep"), "--no-figures")
    assert result.returncode == 0, result.stderr
    assert schema_problems("scores", json.loads((tmp_path / "rep" / "scores.json").read_text())) == []
    from engine.benchmark.release.importer import import_release
    from tests.release_archive import build_release

    summary = import_release(build_release(tmp_path / "release"), tmp_path / "data")
    folders = sorted((tmp_path / "data" / "runs" / "published").glob("*/*"))
    assert len(folders) == sum(len(b.runs) for b in summary.books) >= 3
    for folder in folders:
        assert all(schema_problems("results", line) == [] for line in _lines(folder / "results.jsonl"))
        assert schema_problems("scores", json.loads((folder / "scores.json").read_text())) == []
        assert schema_problems("run", json.loads((folder / "run.json").read_text())) == []


def test_versions_are_read_by_major():
    assert parse_version(2) == (2, 0) and parse_version("2.1") == (2, 1) and parse_version("2") == (2, 0)
    assert parse_version("2.x") is None and parse_version(True) is None
    assert check_version("results", "2.7", "f") == (2, 7)   # a later minor: optional keys only, read
    assert check_version("run", None, "f") == (1, 0)        # run.json written before the key
    with pytest.raises(FormatVersionError, match=r"f: results format version 3.0, this Tulving reads 2.x "
                                                 r"\(written by a newer Tulving"):
        check_version("results", "3.0", "f")


def test_a_results_file_of_another_major_is_refused_with_one_line(run, tmp_path, capsys):
    lines = _lines(run / "results.jsonl")
    lines[5] = {"results_version": "3.0", "q_idx": "anything"}
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(FormatVersionError, match="results.jsonl:6: results format version 3.0"):
        load_results(tmp_path)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "results.jsonl:6: results format version 3.0, this Tulving reads 2.x" in err[0]


def test_a_run_json_of_another_major_is_refused_with_one_line(run, tmp_path, capsys):
    (tmp_path / "results.jsonl").write_text((run / "results.jsonl").read_text())
    record = json.loads((run / "run.json").read_text())
    (tmp_path / "run.json").write_text(json.dumps({**record, "run_version": "2.0"}))
    for argv in (["report", str(tmp_path)], ["report", str(tmp_path), "--out", str(tmp_path / "rep")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "run.json: run format version 2.0, this Tulving reads 1.x" in err[0], err


def test_a_scores_json_of_another_major_is_refused_by_the_bundle_writer(run, tmp_path, capsys):
    for name in ("results.jsonl", "run.json"):
        (tmp_path / name).write_text((run / name).read_text())
    scores = json.loads((run / "scores.json").read_text())
    (tmp_path / "scores.json").write_text(json.dumps({**scores, "scores_version": "2.0"}))
    assert main(["bundle", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "scores.json: scores format version 2.0, this Tulving reads 1.x" in err[0], err
