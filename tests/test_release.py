"""The published release by name: `tulving data fetch / import`, `tulving books`, and the paper's runs.

No network: the archives are built here in the release's layout from the packaged books
(tests/release_archive.py) and served by a loopback HTTP server for `fetch`.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from engine.benchmark.datadir import published_book_dir
from engine.benchmark.evaluation.results import load_results
from engine.benchmark.generation.published import load_book
from engine.benchmark.release import books, importer, runs
from engine.benchmark.release.importer import import_release
from engine.benchmark.release.layout import ReleaseError, answer_mode, size_class
from engine.errors import StorageError
from tests import cli
from tests.release_archive import EXPERIMENT, MODEL_A, MODEL_B, build_release, zip_folder
from tests.test_run_cli import env

SHORT_DIR = "model_claude-3-5-sonnet-20240620_itermax_10_Idefault_nbchapters_19_nbtokens_10397"
GPT_DIR = "model_gpt-4o-2024-05-13_itermax_10_Idefault_nbchapters_19_nbtokens_10397"


def _built(root: Path, long: bool) -> tuple[Path, Path]:
    folder = build_release(root / "src", long=long)
    return folder, zip_folder(folder, root / "release.zip")


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[Path, Path]:
    """(release folder, its zip): the default short book, and the short one by gpt-4o."""
    return _built(tmp_path_factory.mktemp("release"), long=False)


@pytest.fixture(scope="module")
def release_long(tmp_path_factory) -> tuple[Path, Path]:
    """The same with the default long book."""
    return _built(tmp_path_factory.mktemp("release-long"), long=True)


def tulving(data: Path, *args: str) -> cli.Done:
    """The command in this process (tests/cli.py), with its data folder at `data`."""
    e = env()
    e["TULVING_DATA"] = str(data)
    return cli.tulving(data.parent, *args, env=e)


def copy_release(release: tuple[Path, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(release[0], tmp_path / "data-copy"))


def nothing_installed(data: Path) -> bool:
    left = {p.name for p in data.iterdir()} if data.exists() else set()
    return not left & {"books", "runs", "release", importer.STAGING}


# -- import ----------------------------------------------------------------------------------------
def test_import_zip_installs_checked_books_and_published_runs(release_long, tmp_path, monkeypatch):
    data = tmp_path / "data"
    done = tulving(data, "data", "import", str(release_long[1]))
    assert done.returncode == 0, done.stderr
    assert "imported 3 books and 3 published runs" in done.stdout
    assert "synaptic-echoes-short: 19 chapters checked, 456 questions equal to the release's df_qa, equal to the " \
           "packaged book byte for byte, 3 published runs" in done.stderr
    assert "synaptic-echoes: 196 chapters checked, 686 questions" in done.stderr
    # the packaged books were compared, not copied; the gpt-4o one is installed and loads by name
    assert sorted(p.name for p in (data / "books").iterdir()) == ["synaptic-echoes-gpt4o-short"]
    monkeypatch.setenv("TULVING_DATA", str(data))
    book = load_book("synaptic-echoes-gpt4o-short")
    assert book.name == "synaptic-echoes-gpt4o-short" and book.n_chapters == 19
    assert book.metadata["model"] == "gpt-4o-2024-05-13" and book.metadata["source"] == "published release"
    assert book.metadata["failed_events"] == [16]
    for name in ("book.txt", "chapters.json", "events.json", "meta_events.json"):
        assert (data / "books" / book.name / name).read_bytes() == \
            (published_book_dir("synaptic-echoes-short") / name).read_bytes()
    record = json.loads((data / "release" / "imported.json").read_text())
    assert record["books"]["synaptic-echoes"] == {"chapters": 196, "questions": 686, "runs": [], "packaged": True}
    assert not (data / importer.STAGING).exists()

    listed = tulving(data, "books")
    assert listed.returncode == 0
    installed, fetchable = listed.stdout.split("fetchable")
    assert "synaptic-echoes-gpt4o-short" in installed and "synaptic-echoes-1m" not in installed
    assert "synaptic-echoes-1m" in fetchable and "synaptic-echoes-gpt4o-short" not in fetchable


def test_published_runs_rescored_and_read_by_report_and_compare(release, tmp_path):
    data = tmp_path / "data"
    assert tulving(data, "data", "import", str(release[0])).returncode == 0  # an unpacked folder
    base = data / "runs" / "published" / "synaptic-echoes-short"
    assert sorted(p.name for p in base.iterdir()) == [f"{MODEL_B}--in-context", f"{MODEL_A}--in-context",
                                                      f"{MODEL_A}--rag-paragraph"]
    run_a = base / f"{MODEL_A}--in-context"
    run = json.loads((run_a / "run.json").read_text())
    assert (run["source"], run["doi"], run["judge"]) == ("published release", "10.6084/m9.figshare.28244480",
                                                        "claude-3-5-sonnet-20240620")
    # Tulving's scorer on the released judgments gives the reference's F1 of every question ...
    released = release[0] / EXPERIMENT / "answers" / SHORT_DIR / f"answered_by_kind_prompting_model_{MODEL_A}"
    qa = pq.read_table(release[0] / EXPERIMENT / "books" / SHORT_DIR / "df_qa.parquet").to_pylist()
    by_text = {r.question: r for r in load_results(run_a)}
    per_bin = defaultdict(list)
    for q, row in enumerate(qa):
        published = json.loads((released / "evaluated_answers" / f"{q}.json").read_text())["f1_score"]
        record = by_text[row["question"]]
        assert record.f1 == pytest.approx(published, abs=1e-12), q
        if row["get"] == "all":
            per_bin[record.bin].append(published)
    # ... and the leaderboard's Simple Recall (README: mean of the per-bin means) from them
    expected = round(sum(float("%.2f" % (sum(v) / len(v))) for v in per_bin.values()) / len(per_bin), 3)
    scores = json.loads((run_a / "scores.json").read_text())["runs"][0]
    assert scores["simple_recall"] == pytest.approx(expected, abs=1e-9) and 0 < expected < 1
    chrono = [r for r in by_text.values() if r.get == "chronological" and len(set(r.correct_answer)) >= 2]
    assert all(r.exact_match == bool(r.identified_items) for r in chrono)
    assert {r.tau for r in chrono if r.exact_match} == {1.0} and not all(r.exact_match for r in chrono)
    # a run the release holds 3 answers of: the others are marked missing, not scored
    partial = load_results(base / f"{MODEL_A}--rag-paragraph")
    assert sum(r.scored for r in partial) == 3 and sum(r.answer_error == "no released answer" for r in partial) == 453

    report = tulving(data, "report", str(run_a), str(base / f"{MODEL_B}--in-context"), "--out", str(tmp_path / "rep"),
                     "--no-figures")
    assert report.returncode == 0, report.stderr
    assert MODEL_A in (tmp_path / "rep" / "report.md").read_text()
    compare = tulving(data, "compare", str(run_a), str(base / f"{MODEL_B}--in-context"))
    assert compare.returncode == 0, compare.stderr
    assert "paired" in compare.stdout and MODEL_B in compare.stdout


# -- checks ----------------------------------------------------------------------------------------
def _fails(data: Path, source: Path) -> str:
    done = tulving(data, "--quiet", "data", "import", str(source))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tulving: error: ")
    assert nothing_installed(data), sorted(p.name for p in data.iterdir())
    return lines[0]


def test_a_changed_chapter_is_refused_naming_book_and_byte(release, tmp_path):
    folder = copy_release(release, tmp_path)
    book_json = folder / EXPERIMENT / "books" / SHORT_DIR / "book.json"
    text = json.loads(book_json.read_text())
    changed = text.replace("The harsh glare of the floodlights", "The hard glare of the floodlights", 1)
    assert changed != text
    book_json.write_text(json.dumps(changed, ensure_ascii=False, indent=2))
    line = _fails(tmp_path / "data", folder)
    assert "book synaptic-echoes-short: the release's book.txt differs from the packaged one at byte 18" in line


def test_a_question_table_that_differs_names_the_row(release, tmp_path):
    folder = copy_release(release, tmp_path)
    path = folder / EXPERIMENT / "books" / GPT_DIR / "df_qa.parquet"
    table = pq.read_table(path)
    rows = table.to_pylist()
    k = next(i for i, r in enumerate(rows) if r["get"] == "latest" and r["correct_answer"])
    rows[k]["correct_answer"] = ["Nowhere Island"]
    pq.write_table(table.from_pylist(rows, schema=table.schema), path)
    line = _fails(tmp_path / "data", folder)
    assert f"book synaptic-echoes-gpt4o-short: df_qa row {k} (" in line
    assert "correct_answer: release ['Nowhere Island'], Tulving [" in line


def test_a_chapter_failing_the_exact_checks_is_refused(release, tmp_path):
    folder = copy_release(release, tmp_path)
    book_json = folder / EXPERIMENT / "books" / GPT_DIR / "book.json"
    text = json.loads(book_json.read_text())
    book_json.write_text(json.dumps(text.replace("The harsh glare", "At Bethpage Black Course, the harsh glare", 1)))
    line = _fails(tmp_path / "data", folder)
    assert "book synaptic-echoes-gpt4o-short: book " in line and "chapter 1 fails the exact checks: location" in line


def test_unknown_layout_and_damaged_zips(release, tmp_path):
    junk = tmp_path / "junk"
    (junk / "something").mkdir(parents=True)
    assert "unknown layout" in _fails(tmp_path / "d1", junk)
    whole = release[1].read_bytes()
    truncated = tmp_path / "truncated.zip"
    truncated.write_bytes(whole[: len(whole) // 2])
    assert "corrupt or truncated zip" in _fails(tmp_path / "d2", truncated)
    flipped = bytearray(whole)
    flipped[len(whole) // 3] ^= 0xFF  # inside a member's compressed data
    corrupt = tmp_path / "corrupt.zip"
    corrupt.write_bytes(bytes(flipped))
    assert "corrupt or truncated zip" in _fails(tmp_path / "d3", corrupt)
    assert "no such file or folder" in _fails(tmp_path / "d4", tmp_path / "absent.zip")


def test_disk_full_or_ctrl_c_leave_nothing_and_a_rerun_starts_clean(release, tmp_path, monkeypatch):
    data = tmp_path / "data"
    real_write = books.write_converted
    calls = []

    def full_disk(folder, converted):
        calls.append(folder)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(folder / "book.txt"))
        return real_write(folder, converted)

    monkeypatch.setattr(books, "write_converted", full_disk)
    with pytest.raises(StorageError, match="No space left on device: nothing was imported"):
        import_release(release[1], data)
    assert nothing_installed(data)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(books, "write_converted", real_write)
    monkeypatch.setattr(runs, "write_run", interrupted)
    with pytest.raises(KeyboardInterrupt):
        import_release(release[1], data)
    assert nothing_installed(data)
    (data / importer.STAGING / "stale").mkdir(parents=True)  # a killed run's leftovers
    monkeypatch.undo()
    summary = import_release(release[1], data)
    assert [b.name for b in summary.books] == ["synaptic-echoes-short", "synaptic-echoes-gpt4o-short"]
    assert not (data / importer.STAGING).exists()


# -- fetch -----------------------------------------------------------------------------------------
class _Served:
    """What the loopback server serves: `body`, optionally cut after `cut` bytes."""

    def __init__(self) -> None:
        self.body = b""
        self.cut: int | None = None
        self.ranges: list[str | None] = []


def _server(served: _Served) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            wanted = self.headers.get("Range")
            served.ranges.append(wanted)
            start = int(wanted.split("=")[1].split("-")[0]) if wanted else 0
            body = served.body[start:]
            self.send_response(206 if wanted else 200)
            if wanted:
                self.send_header("Content-Range", f"bytes {start}-{len(served.body) - 1}/{len(served.body)}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body if served.cut is None else body[: served.cut])
            self.close_connection = True

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_fetch_resumes_verifies_and_records_the_checksum(release, tmp_path):
    served = _Served()
    server = _server(served)
    url = f"http://127.0.0.1:{server.server_address[1]}/release.zip"
    data = tmp_path / "data"
    try:
        served.body, served.cut = release[1].read_bytes(), len(release[1].read_bytes()) // 2
        cut = tulving(data, "data", "fetch", "--url", url)
        assert cut.returncode == 2 and "rerun to resume" in cut.stderr.splitlines()[-1]
        part = data / "release" / "release.zip.part"
        assert part.stat().st_size == served.cut and nothing_installed(data / "release")
        assert not (data / "books").exists()

        served.cut = None
        done = tulving(data, "data", "fetch", "--url", url)
        assert done.returncode == 0, done.stderr
        assert served.ranges[-1] == f"bytes={len(served.body) // 2}-"  # resumed, not started over
        assert "fetch: " in done.stderr and "imported 2 books" in done.stdout
        recorded = json.loads((data / "release" / "release.sha256.json").read_text())
        assert recorded["sha256"] == hashlib.sha256(served.body).hexdigest()
        assert recorded["size"] == len(served.body)

        # the verified zip is not downloaded again
        asked = len(served.ranges)
        again = tulving(data, "--quiet", "data", "fetch", "--url", url)
        assert again.returncode == 0, again.stderr
        assert len(served.ranges) == asked

        # later fetches must give the recorded bytes
        other = bytearray(served.body)
        other[-30] ^= 0x01
        served.body = bytes(other)
        (data / "release" / "release.zip").unlink()
        wrong = tulving(data, "data", "fetch", "--url", url)
        assert wrong.returncode == 2 and "checksum mismatch" in wrong.stderr
        assert not part.exists()

        served.body = b"this is not a zip file at all" * 100
        fresh = tmp_path / "fresh"
        junk = tulving(fresh, "data", "fetch", "--url", url)
        assert junk.returncode == 2 and "not a zip" in junk.stderr
        assert not (fresh / "release" / "release.sha256.json").exists()
    finally:
        server.shutdown()


def test_fetch_when_the_server_is_unreachable(tmp_path):
    done = tulving(tmp_path / "data", "data", "fetch", "--url", "http://127.0.0.1:9/release.zip")
    assert done.returncode == 2
    assert "cannot download" in done.stderr and len(done.stderr.strip().splitlines()) == 1


# -- names ---------------------------------------------------------------------------------------
def test_answer_folder_names_and_size_classes():
    assert answer_mode("answered_by_kind_prompting_model_gpt-4o-2024-05-13") == ("gpt-4o-2024-05-13", "in-context",
                                                                                 "prompting")
    assert answer_mode("answered_by_kind_rag_model_gpt-4o-mini-2024-07-18_chunk_chapter_top10") == \
        ("gpt-4o-mini-2024-07-18", "rag-chapter", "rag")
    assert answer_mode("answered_by_kind_ftuning_model_gpt-4o-mini-2024-07-18_fpolicy_single") == \
        ("gpt-4o-mini-2024-07-18", "finetuned", "ftuning")
    assert answer_mode("answered_by_kind_ftuning_model_m_fpolicy_all") == ("m-fpolicy-all", "finetuned", "ftuning")
    assert answer_mode("embedding.csv") is None
    assert [size_class(n) for n in (19, 20, 21, 196, 1999)] == [20, 20, 200, 200, 2000]
    with pytest.raises(ReleaseError):
        size_class(2001)


def test_missing_pyarrow_is_one_clear_line(release, tmp_path):
    """Without the `release` extra the import says what to install."""
    blocker = tmp_path / "block"
    (blocker / "pyarrow").mkdir(parents=True)
    (blocker / "pyarrow" / "__init__.py").write_text("raise ImportError('blocked for the test')\n")
    folder = release[0]
    e = env()
    e["PYTHONPATH"] = str(blocker) + os.pathsep + e["PYTHONPATH"]
    e["TULVING_DATA"] = str(tmp_path / "data")
    done = subprocess.run([sys.executable, "-m", "engine.cli", "data", "import", str(folder)], env=e,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "pip install 'tulving-bench[release]'" in done.stderr


def test_released_judgments_with_reworded_or_missing_items(tmp_path, short_questions):
    """The judge's scores are matched by item; a reworded item keeps its score when the count fits
    (the reference checked only the count); a missing one, or a missing file, fails the question."""
    from engine.benchmark.release.layout import AnswerDir
    from tests.release_archive import export_list

    latest = next(q for q in short_questions if q.get == "latest" and q.correct_answer)
    chrono = next(q for q in short_questions if q.get == "chronological" and len(set(q.correct_answer)) >= 2)
    folder = tmp_path / "answered_by_kind_prompting_model_m"
    questions = [latest, latest, chrono, latest]
    for q in range(len(questions)):
        export_list("an answer", folder / "raw_answers" / f"{q}.json")
    export_list({"predicted_items": ["x"], "matching_groundtruth_items_score": [{"reworded": 1}]},
                folder / "evaluated_answers" / "0.json")
    export_list({"predicted_items": ["x"], "matching_groundtruth_items_score": [{"a": 1}, {"b": 0}]},
                folder / "evaluated_answers" / "1.json")
    distinct = list(dict.fromkeys(chrono.correct_answer))
    export_list({"predicted_items": distinct, "matching_groundtruth_items_score": [{i: 1} for i in chrono.correct_answer]},
                folder / "evaluated_answers" / "2.json")  # no chronological judgment released for it
    recs = runs.records(AnswerDir(folder, "m", "in-context", "prompting"), questions, judge="j")
    assert recs[0].f1 == 1.0 and recs[0].matching_scores == [1.0] and not recs[0].judge_failed
    assert recs[1].judge_failed and "scores no" in recs[1].judge_error and "(2 scores for 1 items)" in recs[1].judge_error
    assert recs[2].judge_failed and recs[2].judge_error == "no released chronological judgment" and recs[2].f1 is None
    assert recs[3].judge_failed and recs[3].judge_error == "no released evaluation"
