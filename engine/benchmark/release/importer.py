"""Import the published release (a zip or an unpacked folder) into the user's data folder.

    import_release(source, data) -> ImportSummary

Into `data` (datadir.data_home(): TULVING_DATA, else the XDG data folder):
    books/NAME/                       each released book (layout.CATALOGUE names) as a
                                      Tulving book folder; the two packaged ones
                                      (synaptic-echoes, -short) are compared with the
                                      package byte for byte instead of copied
    runs/published/NAME/MODEL--MODE/  the paper's runs of that book (runs.py), each with its
                                      bundle.json (the released judgments: `tulving verify`)
    release/imported.json             what was imported, from where

Everything is built in `data/.import-tmp/` first and checked (every chapter passes
the exact checks, the question set equals df_qa, the packaged books are equal);
only then is each folder renamed into place. A failure or Ctrl-C before that
leaves nothing installed; the staging folder is removed on the way out, and a
rerun starts from a clean one.
"""
from __future__ import annotations

import errno
import json
import shutil
import time
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.benchmark.datadir import published_names
from engine.benchmark.evaluation.questions import build_questions
from engine.benchmark.generation.bookdir import BookError
from engine.benchmark.generation.published import load_book
from engine.benchmark.release import books, check, runs
from engine.benchmark.release.layout import QA, ReleaseBook, ReleaseError, answer_dirs, find_books, find_root
from engine.benchmark.release.tables import read_qa
from engine.errors import StorageError

STAGING = ".import-tmp"
RUNS = Path("runs") / "published"
RECORD = Path("release") / "imported.json"
_STORAGE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}

Progress = Callable[[str], None]


@dataclass(slots=True)
class BookImport:
    name: str
    chapters: int
    questions: int
    runs: list[str] = field(default_factory=list)
    packaged: bool = False      # compared with the packaged copy, not installed again


@dataclass(slots=True)
class ImportSummary:
    books: list[BookImport]
    data: Path
    seconds: float


def _safe_extract(archive: zipfile.ZipFile, into: Path) -> None:
    for member in archive.infolist():
        target = (into / member.filename).resolve()
        if not target.is_relative_to(into.resolve()):
            raise ReleaseError(f"zip member {member.filename!r} points outside the archive's folder")
    archive.extractall(into)


def unpack(zip_path: Path, into: Path) -> Path:
    """Unpack a release zip (a zip holding one inner zip, as figshare serves a
    whole article, is opened too); the folder holding the experiment folders."""
    try:
        with zipfile.ZipFile(zip_path) as archive:
            _safe_extract(archive, into)
        inner = [p for p in into.iterdir() if p.suffix == ".zip" and p.is_file()]
        if len(inner) == 1 and not any(p.is_dir() for p in into.iterdir()):
            with zipfile.ZipFile(inner[0]) as archive:
                _safe_extract(archive, into)
            inner[0].unlink()
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise ReleaseError(f"{zip_path}: corrupt or truncated zip ({exc}): download it again") from None
    return find_root(into)


def _import_book(book: ReleaseBook, staging: Path, progress: Progress) -> BookImport:
    name = book.published.name
    folder = books.write_converted(staging / "books" / name, books.convert(book))
    try:
        loaded = load_book(folder)  # every chapter through the exact checks
    except BookError as exc:
        raise ReleaseError(f"book {name}: {exc}") from None
    packaged = name in published_names("books")
    if packaged:
        check.same_as_packaged(name, folder)
    built = build_questions(loaded)
    questions = check.match_questions(name, built, read_qa(book.folder / QA))
    done = BookImport(name, len(loaded.chapters), len(questions), packaged=packaged)
    for answers in answer_dirs(book):
        recs = runs.records(answers, questions, judge=book.published.writer)
        run_name = runs.run_folder_name(answers)
        folder = runs.write_run(staging / RUNS / name / run_name, recs,
                                runs.run_record(book, answers, recs, judge=book.published.writer))
        runs.write_bundle(folder, answers, questions, loaded, built)
        done.runs.append(run_name)
    progress(f"{name}: {done.chapters} chapters checked, {done.questions} questions equal to the release's df_qa"
             + (", equal to the packaged book byte for byte" if packaged else "") + f", {len(done.runs)} published runs")
    return done


def _replace(new: Path, dest: Path) -> None:
    """Put a finished folder in place of dest (the old one removed after the rename)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    old = dest.with_name(dest.name + ".old-import")
    if old.exists():
        shutil.rmtree(old)
    if dest.exists():
        dest.rename(old)
    new.rename(dest)
    if old.exists():
        shutil.rmtree(old)


def _install(done: list[BookImport], staging: Path, data: Path, source: Path) -> None:
    for b in done:
        if not b.packaged:
            _replace(staging / "books" / b.name, data / "books" / b.name)
        if (staging / RUNS / b.name).is_dir():
            _replace(staging / RUNS / b.name, data / RUNS / b.name)
    record = {"source": str(source), "imported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "books": {b.name: {"chapters": b.chapters, "questions": b.questions, "runs": b.runs,
                                 "packaged": b.packaged} for b in done}}
    (data / RECORD).parent.mkdir(parents=True, exist_ok=True)
    tmp = data / RECORD.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(data / RECORD)


def import_release(source: Path, data: Path, progress: Progress = lambda line: None) -> ImportSummary:
    """Import a release zip or folder into data (see the module docstring)."""
    start = time.perf_counter()
    if not source.exists():
        raise ReleaseError(f"{source}: no such file or folder")
    staging = data / STAGING
    try:
        data.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)  # a previous run's leftovers: start clean
        staging.mkdir()
        root = find_root(source) if source.is_dir() else unpack(source, staging / "unpacked")
        done = [_import_book(b, staging, progress) for b in find_books(root)]
        _install(done, staging, data, source)
    except OSError as exc:
        if exc.errno in _STORAGE:
            raise StorageError(f"{exc.filename or data}: {exc.strerror}: nothing was imported "
                               "(free some space and run the import again)") from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ImportSummary(done, data, time.perf_counter() - start)
