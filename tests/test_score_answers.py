"""`tulving score`: answers made anywhere, judged through the same judge path
as `tulving run` and scored the same way; question ids that are stable and
refuse another book's answers; one clear line per bad line of the file; a
partial file scored as partial, never as complete."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.benchmark.evaluation.answers_file import ANSWERS_MODE, AnswersFileError, read_answers
from engine.benchmark.evaluation.formats import schema_problems
from engine.benchmark.evaluation.question_ids import question_id, question_ids
from engine.benchmark.evaluation.results import load_results
from engine.cli.main import main
from tests.report_runs import copied_run, tulving


@pytest.fixture(scope="module")
def run(tmp_path_factory, offline_short_run):
    return copied_run(offline_short_run, tmp_path_factory.mktemp("score"))


@pytest.fixture(scope="module")
def ids(short_book, short_questions):
    return question_ids(short_questions, short_book)


def test_question_ids_are_stable_and_name_their_book(short_book, short_questions, long_book, long_questions, ids):
    # The documented id of the short book's first question (docs/formats.md): a change of the id scheme
    # breaks every answers file written before it.
    assert next(iter(ids)) == "q0000-0ce7b0ce43"
    assert len(ids) == len(short_questions) == 456
    assert [q.q_idx for q in ids.values()] == list(range(456))
    long_ids = question_ids(long_questions, long_book)
    assert not set(ids) & set(long_ids)  # another book: no id in common, even for the same question text
    # The same question on a book of another text (a rewrite of the same events): another id.
    assert question_id(short_questions[0], "0" * 64) != question_id(short_questions[0], "1" * 64)


def test_tulving_questions_prints_the_ids(tmp_path, capsys, ids):
    assert main(["questions", "--book", "synaptic-echoes-short", "--ids"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == list(ids)
    assert main(["questions", "--book", "synaptic-echoes-short", "--ids", "--out", str(tmp_path / "q.jsonl")]) == 0
    written = [json.loads(line) for line in (tmp_path / "q.jsonl").read_text().splitlines()]
    assert [w["id"] for w in written] == list(ids) and written[3]["question"] == ids[written[3]["id"]].question


def _answers_file(path: Path, run: Path, ids: dict, *, skip: set[int] = frozenset(), system: str | None = None,
                  evidence: bool = False) -> Path:
    """The run's own answers as an answers file, by question id."""
    by_idx = {q.q_idx: qid for qid, q in ids.items()}
    with path.open("w") as f:
        for r in load_results(run):
            if r.q_idx in skip:
                continue
            line = {"id": by_idx[r.q_idx], "answer": r.answer}
            if system:
                line["system"] = system
            if evidence:
                line["evidence_chapters"] = r.chapters[:1] + [None]
            f.write(json.dumps(line) + "\n")
    return path


def test_an_answers_file_is_scored_exactly_as_the_run_that_made_its_answers(run, tmp_path, ids):
    answers = _answers_file(tmp_path / "reader.jsonl", run, ids, evidence=True)
    result = tulving(run.parent, "--quiet", "--cache", "c.sqlite", "score", str(answers), "--book",
                     "synaptic-echoes-short", "--judge", "builtin:judge", "--out", str(tmp_path / "scored"))
    assert result.returncode == 0, result.stderr
    mine = json.loads((tmp_path / "scored" / "scores.json").read_text())
    theirs = json.loads((run / "scores.json").read_text())
    [row], [ref] = mine["runs"], theirs["runs"]
    assert (row["model"], row["mode"], row["sample"]) == ("reader", ANSWERS_MODE, None)
    for key in ("simple_recall", "simple_recall_ci", "chronological_awareness", "chronological_awareness_ci",
                "bins", "latest", "order", "scored", "judge_failures"):
        assert row[key] == ref[key], key
    assert "partial" not in mine
    records = load_results(tmp_path / "scored")
    assert [r.f1 for r in records] == [r.f1 for r in load_results(run)]
    with_truth = next(r for r in records if r.chapters)
    assert with_truth.evidence_chapters == [with_truth.chapters[0], None]
    assert with_truth.retrieval_recall == 1 / len(with_truth.chapters) and with_truth.retrieval_precision == 1.0
    assert all(schema_problems("results", json.loads(line)) == []
               for line in (tmp_path / "scored" / "results.jsonl").read_text().splitlines())
    run_json = json.loads((tmp_path / "scored" / "run.json").read_text())
    assert run_json["source"] == "answers file" and schema_problems("run", run_json) == []
    assert "reader" in result.stdout and "answers-file" in result.stdout  # the leaderboard


def test_a_partial_file_is_scored_as_partial(run, tmp_path, ids):
    answers = _answers_file(tmp_path / "some.jsonl", run, ids, skip={3, 4, 5}, system="mine")
    result = tulving(run.parent, "--quiet", "--cache", "c.sqlite", "score", str(answers), "--book",
                     "synaptic-echoes-short", "--judge", "builtin:judge", "--out", str(tmp_path / "partial"))
    assert result.returncode == 0, result.stderr
    note = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert len(note) == 1 and "answers 453 of 456 questions" in note[0] and "q0003-" in note[0], result.stderr
    scores = json.loads((tmp_path / "partial" / "scores.json").read_text())
    assert scores["partial"].startswith("PARTIAL") and scores["runs"][0]["sample"] == 453
    assert "PARTIAL" in (tmp_path / "partial" / "report.md").read_text()
    assert "PARTIAL" in result.stdout and "sample of 453/456" in result.stdout
    assert "ranking" not in scores


BAD = [
    ('{"id": "ID0", "answer": "x"}\n{"id": "ID0", "answer": "y"}\n', 2, "duplicate answer to ID0 for system 'bad' (first on line 1)"),
    ('{"id": "ID0", "answer": "x"}\nnot json\n', 2, "not JSON"),
    ('["ID0", "x"]\n', 1, "a JSON list, not an object"),
    ('{"id": "ID0"}\n', 1, "no answer"),
    ('{"id": "ID0", "answer": 5}\n', 1, "answer must be a string, not int"),
    ('{"id": "ID0", "answer": "x", "evidence": []}\n', 1, "unknown key(s) evidence"),
    ('{"id": "ID0", "answer": "x", "evidence_chapters": ["3"]}\n', 1, "evidence_chapters must be a list"),
    ('{"id": "q0000-0000000000", "answer": "x"}\n', 1, "unknown question id 'q0000-0000000000'"),
    ('{"id": "ID0", "answer": "x", "system": ""}\n', 1, "system must be a non-empty string"),
]


@pytest.mark.parametrize("text,line,needle", BAD)
def test_each_bad_line_gets_one_clear_line(text, line, needle, tmp_path, capsys, ids):
    path = tmp_path / "bad.jsonl"
    path.write_text(text.replace("ID0", next(iter(ids))))
    with pytest.raises(AnswersFileError) as caught:
        read_answers(path, ids)
    assert len(caught.value.problems) == 1
    code = main(["score", str(path), "--book", "synaptic-echoes-short", "--judge", "builtin:judge",
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.splitlines()
    assert code == 2
    assert err[0].startswith(f"{path}:{line}: ") and needle.replace("ID0", next(iter(ids))) in err[0], err
    assert err[-1] == f"tulving: error: {path}: 1 line(s) cannot be scored: fix them and run again (nothing was judged)"
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_answers_meant_for_another_book_are_refused(tmp_path, capsys, long_book, long_questions):
    other = question_ids(long_questions, long_book)
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps({"id": qid, "answer": "x"}) + "\n" for qid in list(other)[:30]))
    assert main(["score", str(path), "--book", "synaptic-echoes-short", "--judge", "builtin:judge"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 20 + 1 + 1 and err[-2] == "... and 10 more"
    assert all("unknown question id" in line for line in err[:20])
    assert "30 line(s) cannot be scored" in err[-1]
