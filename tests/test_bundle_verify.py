"""`tulving bundle` and `tulving verify`: a real run's bundle verifies offline
(no call), follows its schema, and every tampering -- an answer, a judge
reply, a score, a ground truth -- is caught and named; the paper's imported
runs become bundles that verify too; `--rejudge` judges the answers again
through the shared judge path and reports the agreement."""
from __future__ import annotations

import copy
import json

import pytest

from engine.benchmark.evaluation.bundle import load_bundle, record_digest, sha256
from engine.benchmark.evaluation.formats import FormatVersionError, schema_problems
from engine.benchmark.evaluation.verify import FAILED, verify_bundle
from engine.benchmark.generation.published import load_book
from engine.cli.main import main
from tests.report_runs import copied_run, offline_run, tulving


@pytest.fixture(scope="module")
def bundle_file(tmp_path_factory, offline_short_run):
    run = copied_run(offline_short_run, tmp_path_factory.mktemp("bundle"))
    result = tulving(run.parent, "bundle", str(run))
    assert result.returncode == 0, result.stderr
    return run / "bundle.json"


@pytest.fixture(scope="module")
def book():
    return load_book("synaptic-echoes-short")


def _resealed(bundle: dict) -> dict:
    """The bundle with every record digest and its own digest recomputed: a forger's bundle."""
    for line in bundle["records"]:
        line["sha256"] = record_digest(line)
    bundle["sha256"] = sha256({k: v for k, v in bundle.items() if k != "sha256"})
    return bundle


def _failed(result) -> dict[str, str]:
    return {c.name: c.detail for c in result.checks if c.status == FAILED}


def test_a_bundle_verifies_offline_and_follows_its_schema(bundle_file, book, capsys):
    bundle = load_bundle(bundle_file)
    assert schema_problems("bundle", bundle) == []
    assert bundle["book"]["sha256"] and bundle["questions"]["count"] == 456 and len(bundle["records"]) == 456
    assert bundle["records"][0]["question_id"] == "q0000-0ce7b0ce43"
    result = verify_bundle(bundle, book)
    assert result.verified and result.calls == 0 and _failed(result) == {}
    assert len(result.figures) > 15 and all(f.follows for f in result.figures)
    assert main(["verify", str(bundle_file)]) == 0  # the book by name: installed here
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("VERIFIED (0 calls") and any("book and question set: 456 checked" in x for x in out)


def test_an_edited_answer_is_caught_even_with_every_digest_recomputed(bundle_file, book):
    bundle = load_bundle(bundle_file)
    edited = copy.deepcopy(bundle)
    line = next(x for x in edited["records"] if x["f1"] == 0)
    line["answer"] = "; ".join(line["correct_answer"]) or "nothing"
    failed = _failed(verify_bundle(edited, book))
    assert "digests" in failed and line["question_id"] in failed["digests"]
    failed = _failed(verify_bundle(_resealed(edited), book))
    assert list(failed) == ["judge prompts"] and "the answer is not the one judged" in failed["judge prompts"]


def test_an_edited_judge_reply_or_score_is_caught(bundle_file, book):
    bundle = load_bundle(bundle_file)
    reply = copy.deepcopy(bundle)
    line = next(x for x in reply["records"] if x["f1"] == 1.0 and len(x["correct_answer"]) == 1
                and x["get"] == "all")
    line["judge_reply"] = line["judge_reply"].replace(": 1", ": 0")
    failed = _failed(verify_bundle(_resealed(reply), book))
    assert "judgments" in failed and "f1" in failed["judgments"] and line["question_id"] in failed["judgments"]

    score = copy.deepcopy(bundle)
    score["claimed"]["runs"][0]["simple_recall"] = 0.99
    result = verify_bundle(_resealed(score), book)
    [wrong] = [f for f in result.figures if not f.follows]
    assert (wrong.name, wrong.claimed) == ("simple_recall", 0.99) and not result.verified

    truth = copy.deepcopy(bundle)
    truth["records"][7]["correct_answer"] = ["Somewhere else"]
    failed = _failed(verify_bundle(_resealed(truth), book))
    assert "question ids" in failed and "book and question set" in failed


def test_verify_prints_each_figure_that_does_not_follow(bundle_file, tmp_path, capsys):
    bundle = json.loads(bundle_file.read_text())
    bundle["claimed"]["runs"][0]["chronological_awareness"] = 0.5
    path = tmp_path / "b.json"
    path.write_text(json.dumps(_resealed(bundle)))
    assert main(["verify", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(x.startswith("FAILED") and "chronological_awareness: claimed 0.5, recomputed" in x for x in out)
    assert out[-1].startswith("NOT VERIFIED")


def test_a_bundle_of_another_major_or_not_a_bundle_is_one_line(bundle_file, tmp_path, capsys):
    bundle = json.loads(bundle_file.read_text())
    (tmp_path / "b.json").write_text(json.dumps({**bundle, "bundle_version": "2.0"}))
    with pytest.raises(FormatVersionError):
        load_bundle(tmp_path / "b.json")
    (tmp_path / "c.json").write_text("[]")
    for name, needle in (("b.json", "bundle format version 2.0, this Tulving reads 1.x"),
                         ("c.json", "not a Tulving bundle"), ("missing.json", "no bundle at")):
        assert main(["verify", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


def test_rejudge_goes_through_the_judge_path_and_reports_agreement(bundle_file, tmp_path, capsys):
    code = main(["--cache", str(tmp_path / "c.sqlite"), "verify", str(bundle_file), "--rejudge", "builtin:judge",
                 "--sample", "30", "--out", str(tmp_path / "again")])
    out = capsys.readouterr().out
    assert code == 0
    assert "re-judged by builtin:judge: 30 answers" in out
    row = next(x for x in out.splitlines() if x.startswith("| synaptic-echoes-short"))
    # The same judge, deterministic: it agrees with itself on every one of the 30 questions.
    assert "| builtin:judge (bundle) | 30 | 1.000 | 1.000 | 0.000 | 1.000 |" in row, row
    assert (tmp_path / "again" / "results.jsonl").is_file()


def test_the_papers_imported_runs_are_bundles_that_verify(tmp_path):
    from engine.benchmark.release.importer import import_release
    from tests.release_archive import build_release

    import_release(build_release(tmp_path / "release"), tmp_path / "data")
    bundles = sorted((tmp_path / "data" / "runs" / "published").glob("*/*/bundle.json"))
    assert len(bundles) == 3
    book = load_book("synaptic-echoes-short")
    for path in bundles:
        bundle = load_bundle(path)
        assert bundle["judgments"] == "released-evaluation" and schema_problems("bundle", bundle) == []
        result = verify_bundle(bundle, book)
        assert result.verified, (path, _failed(result))
    # A released judgment edited: caught.
    bundle = load_bundle(bundles[1])
    line = next(x for x in bundle["records"] if x["f1"] == 1.0 and x["correct_answer"])
    evaluation = json.loads(line["judge_reply"])
    evaluation["matching_groundtruth_items_score"] = [{k: 0} for e in evaluation["matching_groundtruth_items_score"]
                                                      for k in e]
    line["judge_reply"] = json.dumps(evaluation)
    assert "judgments" in _failed(verify_bundle(_resealed(bundle), book))


def test_a_tampered_ranking_is_caught(tmp_path, book):
    run = offline_run(tmp_path, "two", "--memory", "no-memory")
    assert tulving(tmp_path, "bundle", str(run)).returncode == 0
    bundle = load_bundle(run / "bundle.json")
    ranking = bundle["claimed"]["ranking"]
    assert set(ranking["average_ranks"]) == {"builtin:reader / in-context", "builtin:reader / no-memory"}
    honest = verify_bundle(bundle, book)
    assert honest.verified and any(f.name == "average rank" for f in honest.figures)
    # The worse configuration claimed first: every other figure still follows.
    swapped = copy.deepcopy(bundle)
    ranks = swapped["claimed"]["ranking"]["average_ranks"]
    ranks["builtin:reader / in-context"], ranks["builtin:reader / no-memory"] = (
        ranks["builtin:reader / no-memory"], ranks["builtin:reader / in-context"])
    result = verify_bundle(_resealed(swapped), book)
    assert not result.verified
    assert sorted(f.configuration for f in result.figures if not f.follows) == [
        "builtin:reader / in-context", "builtin:reader / no-memory"]
    # A ranking dropped from the claim is caught as well.
    dropped = copy.deepcopy(bundle)
    del dropped["claimed"]["ranking"]
    assert not verify_bundle(_resealed(dropped), book).verified
