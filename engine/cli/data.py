"""The published release by name: `tulving data fetch`, `tulving data import`, `tulving books`.

    tulving data fetch [--url URL]   download the release into the data folder (resumable,
                                     size and SHA-256 checked), then import it
    tulving data import PATH         import a release zip or unpacked folder
    tulving books                    the books installed (packaged and imported) and the
                                     ones `tulving data fetch` would add

The data folder is TULVING_DATA, else $XDG_DATA_HOME/tulving (engine/benchmark/datadir.py);
what an import writes there: engine/benchmark/release/importer.py. Errors are one line
and a non-zero exit (engine/cli/main.py), and leave no half-imported book.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from engine.benchmark.datadir import data_home, published_names, user_data_dir
from engine.benchmark.release import fetch as release_fetch
from engine.benchmark.release.layout import CATALOGUE, DOI_URL
from engine.cli.commands import command_help

if TYPE_CHECKING:  # the importer loads numpy and the questions: imported by the commands that import
    from engine.benchmark.release.importer import ImportSummary


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("data", help=command_help("data"))
    data_sub = p.add_subparsers(dest="data_command", metavar="ACTION")
    f = data_sub.add_parser("fetch", help=f"download the release ({DOI_URL}) into the data folder and import it")
    f.add_argument("--url", help="download from this URL instead (a mirror, or a local server)")
    f.set_defaults(func=_cmd_fetch)
    i = data_sub.add_parser("import", help="import a release zip or unpacked folder downloaded by hand")
    i.add_argument("path", type=Path, metavar="PATH", help="the release zip, or the folder it unpacks to")
    i.set_defaults(func=_cmd_import)
    p.set_defaults(func=lambda args: _usage(p))

    b = sub.add_parser("books", help=command_help("books"))
    b.set_defaults(func=_cmd_books)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _say(args: argparse.Namespace, line: str) -> None:
    if not args.quiet:
        print(line, file=sys.stderr, flush=True)


def _bar(args: argparse.Namespace) -> release_fetch.Progress:
    def show(done: int, total: int | None) -> None:
        if args.quiet:
            return
        of = f" / {total / 1e6:,.1f} MB ({100 * done / total:.0f}%)" if total else " MB"
        print(f"\rfetch: {done / 1e6:,.1f}{of}", end="", file=sys.stderr, flush=True)
    return show


def _report(args: argparse.Namespace, summary: ImportSummary) -> int:
    n_runs = sum(len(b.runs) for b in summary.books)
    print(f"imported {len(summary.books)} books and {n_runs} published runs into {summary.data} "
          f"in {summary.seconds:.1f} s")
    for b in summary.books:
        print(f"  {b.name:32} {b.chapters:5} chapters {b.questions:5} questions {len(b.runs):3} runs"
              + ("  (packaged: checked equal)" if b.packaged else ""))
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    from engine.benchmark.release.importer import import_release

    folder = data_home() / "release"
    zip_path = release_fetch.fetch(args.url, folder, _bar(args))
    _say(args, f"\nfetch: {zip_path} verified (SHA-256 {release_fetch.sha256_of(zip_path)})")
    return _report(args, import_release(zip_path, data_home(), lambda line: _say(args, line)))


def _cmd_import(args: argparse.Namespace) -> int:
    from engine.benchmark.release.importer import import_release

    return _report(args, import_release(args.path, data_home(), lambda line: _say(args, line)))


def _cmd_books(args: argparse.Namespace) -> int:
    user = user_data_dir()
    installed = {name: "packaged" for name in published_names("books")}
    if user is not None and (user / "books").is_dir():
        for folder in sorted((user / "books").iterdir()):
            if folder.is_dir() and not folder.name.startswith("."):
                installed.setdefault(folder.name, str(folder))
    print("installed:")
    for name, where in installed.items():
        print(f"  {name:32} {where}")
    missing = [p for p in CATALOGUE if p.name not in installed]
    if missing:
        print(f"fetchable (tulving data fetch, {DOI_URL}):")
        for p in missing:
            print(f"  {p.name:32} {p.n_events} events, written by {p.writer}")
    return 0
