"""CLI: results anyone can verify, load and publish.

    tulving bundle RUN [--out FILE] [--questions FILE]   the run in one file (bundle.py)
    tulving verify BUNDLE [--book B] [--rejudge JUDGE]    re-scored offline, figure by figure (verify.py)
    tulving export RUN --format inspect|every-eval-ever [--out PATH]
    tulving leaderboard BUNDLE... --out SITE             one static page ranking them all

The work is in engine/cli/publish_handlers.py, imported once the options are read.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable

from engine.cli.commands import command_help


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "bundle", help=command_help("bundle"),
        description="Write one file holding the run's answers, every judge reply, the provenance, the SHA-256 "
                    "of the book and of the question set, the judge prompts' and the scorer's versions and the "
                    "claimed scores, tied together by digests: `tulving verify` checks it offline.")
    p.add_argument("run_dir", metavar="RUN", help="run folder (results.jsonl, run.json, scores.json)")
    p.add_argument("--out", metavar="FILE", help="bundle file to write (default RUN/bundle.json)")
    p.add_argument("--book", help="the run's book, when run.json's cannot be found here (name or folder)")
    p.add_argument("--questions", metavar="FILE", help="the run's questions file, when it was run with --questions")
    p.set_defaults(func=_handler("cmd_bundle"))

    p = subparsers.add_parser(
        "verify", help=command_help("verify"),
        description="Re-score a bundle offline from its judge replies (no call) and say, figure by figure, "
                    "whether the claimed scores follow; check its digests, its book and question set (when the "
                    "book is here) and that each reply judged the answer it sits beside. Exit 0: verified; 1: not.")
    p.add_argument("bundle", metavar="BUNDLE", help="bundle file (tulving bundle)")
    p.add_argument("--book", help="the book to check the bundle against (default: its name, when installed)")
    p.add_argument("--rejudge", metavar="JUDGE",
                   help="also judge the bundle's answers again with JUDGE (calls it) and report how far the two "
                        "judges agree (tulving agreement's figures)")
    p.add_argument("--sample", type=int, metavar="N", help="--rejudge N questions spread over the set")
    p.add_argument("--out", metavar="DIR", help="with --rejudge: write the re-judged run folder here")
    p.add_argument("--all", action="store_true", help="print every figure, not only those that do not follow")
    p.set_defaults(func=_handler("cmd_verify"))

    p = subparsers.add_parser(
        "export", help=command_help("export"),
        description="Write a run in a format other tools read: an Inspect log (.eval, opened by `inspect view`; "
                    "needs tulving-bench[export]) or Every Eval Ever's aggregate and instance-level records.")
    p.add_argument("run_dir", metavar="RUN", help="run folder")
    p.add_argument("--format", required=True, choices=["inspect", "every-eval-ever"], dest="export_format")
    p.add_argument("--out", metavar="PATH", help="file (inspect: RUN/<book>.eval) or folder (every-eval-ever: "
                                                 "RUN/every-eval-ever) to write")
    p.set_defaults(func=_handler("cmd_export"))

    p = subparsers.add_parser(
        "leaderboard", help=command_help("leaderboard"),
        description="Build a static, self-contained page ranking models and memory systems from their bundles "
                    "(scores with intervals, cost, judge, book), each row linking to its bundle's provenance "
                    "and verify result; a bundle that does not verify is shown as such.")
    p.add_argument("bundles", nargs="+", metavar="BUNDLE", help="bundle files (tulving bundle)")
    p.add_argument("--out", required=True, metavar="SITE", help="folder to write index.html and the bundles' pages to")
    p.add_argument("--title", default="Episodic Memory Benchmark leaderboard", help="the page's title")
    p.set_defaults(func=_handler("cmd_leaderboard"))


def _handler(name: str) -> Callable[[argparse.Namespace], int]:
    """The handler `name` of publish_handlers, imported when the command runs."""
    def run(args: argparse.Namespace) -> int:
        from engine.cli import publish_handlers

        handler = getattr(publish_handlers, name)
        return int(handler(args))
    run.__name__ = name
    return run

