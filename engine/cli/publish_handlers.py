"""The work of `tulving bundle`, `verify`, `export` and `leaderboard` (options: engine/cli/publish.py)."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from engine.benchmark.evaluation.bundle import Json, load_bundle, make_bundle, read_run, write_bundle
from engine.benchmark.evaluation.question_ids import book_sha256
from engine.benchmark.evaluation.questions import Question, build_questions, read_questions
from engine.benchmark.evaluation.verify import FAILED, Verification, verify_bundle
from engine.benchmark.generation.bookdir import Book
from engine.errors import EXIT_FAILED, printable
from providers.base import JSONValue, TulvingError


def _note(message: str) -> None:
    print(f"note: {printable(message)}", file=sys.stderr)


def load_run_book(run: Json, name: str | None) -> Book:
    """The book a run was made on: `name` when given, else run.json's book folder or name."""
    from engine.benchmark.generation.published import load_book

    where = name or run.get("book_path") or run.get("book")
    if not where:
        raise TulvingError("the run does not name its book: pass --book")
    path = str(where)
    if not name and run.get("book_path") and not Path(path).is_dir():
        path = str(run.get("book"))  # the folder is not on this machine: the book by name
    return load_book(path, verify=False)


def _questions(args: argparse.Namespace, run: Json, book: Book) -> list[Question]:
    if args.questions:
        return read_questions(args.questions)
    conf = run.get("configuration")
    if isinstance(conf, dict) and conf.get("questions"):
        raise TulvingError("the run was made with --questions FILE: pass the same file to tulving bundle --questions")
    return build_questions(book)


def cmd_bundle(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    folder = Path(args.run_dir)
    records, run, claimed = read_run(folder)
    book = load_run_book(run, args.book)
    bundle = make_bundle(records, run, claimed, book, _questions(args, run, book))
    path = write_bundle(bundle, Path(args.out) if args.out else folder / "bundle.json")
    configurations = len({(r.model, r.mode) for r in records})
    print(f"bundle: {path} ({len(records)} records, {configurations} configuration(s), book {book.name} "
          f"sha256 {book_sha256(book)[:12]}..., {path.stat().st_size / 1e6:.1f} MB, "
          f"{time.perf_counter() - started:.1f} s)")
    return 0


def claimed_rows(bundle: Json) -> list[JSONValue]:
    """The rows of the scores a bundle claims."""
    claimed = bundle.get("claimed")
    rows = claimed.get("runs") if isinstance(claimed, dict) else None
    return rows if isinstance(rows, list) else []


def bundle_book(bundle: Json, name: str | None) -> Book | None:
    """The book to check a bundle against: `name` (an error when it cannot be
    loaded), else the bundle's book by name when installed here (None when not)."""
    from engine.benchmark.generation.published import load_book

    if name:
        return load_book(name, verify=False)
    book = bundle.get("book")
    try:
        return load_book(str(book.get("name")), verify=False) if isinstance(book, dict) else None
    except TulvingError:
        return None


def verification_lines(result: Verification, every_figure: bool = False) -> list[str]:
    """What `tulving verify` prints: each check, the figures (those that do not follow, or all), the verdict."""
    lines = [f"{c.status:8} {c.name}" + (f": {c.detail}" if c.detail else "") for c in result.checks]
    wrong = [f for f in result.figures if not f.follows]
    for f in result.figures if every_figure else wrong:
        lines.append(f"{'ok' if f.follows else FAILED:8} {f.configuration}  {f.name}: claimed {f.claimed}, "
                     f"recomputed {f.recomputed}")
    lines.append(f"{'ok' if not wrong else FAILED:8} scores: {len(result.figures) - len(wrong)} of "
                 f"{len(result.figures)} claimed figures follow from the judge replies")
    verdict = "VERIFIED" if result.verified else "NOT VERIFIED"
    lines.append(f"{verdict} ({result.calls} calls, {result.seconds:.2f} s)")
    return lines


def cmd_verify(args: argparse.Namespace) -> int:
    bundle = load_bundle(args.bundle)
    book = bundle_book(bundle, args.book)
    result = verify_bundle(bundle, book)
    for line in verification_lines(result, args.all):
        print(printable(line))
    code = 0 if result.verified else EXIT_FAILED
    if args.rejudge:
        from engine.cli.rejudge import rejudge

        rejudge(args, bundle, book)
    return code


def cmd_leaderboard(args: argparse.Namespace) -> int:
    from engine.benchmark.evaluation.leaderboard_site import Entry, write_site

    started = time.perf_counter()
    entries, lines = [], []
    for name in args.bundles:
        bundle = load_bundle(name)
        result = verify_bundle(bundle, bundle_book(bundle, None))
        entries.append(Entry(Path(name), bundle, result))
        lines.append(verification_lines(result, every_figure=True))
        if not result.verified:
            _note(f"{name} does not verify: its rows are shown as NOT VERIFIED")
    page = write_site(Path(args.out), args.title, entries, lines)
    rows = sum(len(claimed_rows(e.bundle)) for e in entries)
    print(f"leaderboard: {page} ({len(entries)} bundles, {rows} rows, "
          f"{sum(e.result.verified for e in entries)} verified, {time.perf_counter() - started:.1f} s)")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    folder = Path(args.run_dir)
    records, run, _ = read_run(folder)
    if not records:
        raise TulvingError(f"{folder}: no results to export")
    book = load_run_book(run, None)
    if args.export_format == "inspect":
        from engine.benchmark.evaluation.export_inspect import export_inspect

        paths = export_inspect(records, run, book, Path(args.out) if args.out else folder / "inspect")
        print(f"inspect: {len(paths)} logs in {paths[0].parent} (inspect view --log-dir {paths[0].parent})")
        return 0
    from engine.benchmark.evaluation.export_eee import export_eee

    written = export_eee(records, run, book, Path(args.out) if args.out else folder / "every-eval-ever")
    print(f"every-eval-ever: {', '.join(str(p) for p in written)}")
    return 0
