"""What prompt-length and dated price bands change in the dry-run cost of
reproducing the published leaderboard: `tulving run --dry-run` twice, in this
process, on an empty cache, once as shipped (every call priced by the band in
force today for its prompt: engine/prices.py) and once with every alias at its
base prices only (bands off), and the two totals side by side.

    python benchmarks/leaderboard_tiers.py [--judge claude-sonnet-5-5] [--book synaptic-echoes] [--all]
    python benchmarks/leaderboard_tiers.py --models claude-haiku-5-5,gpt-6.1-sol   # other aliases

`--all` prices every leaderboard row (retired ones too: a dry run prices
them); without it only the rows callable today, as benchmarks/leaderboard_cost.py.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.leaderboard_cost import rows, split_retired  # noqa: E402


def dry_run(models: list[str], book: str, judge: str | None, *, bands: bool) -> str:
    """The dry run's stdout, bands on or off."""
    from engine import estimate
    from engine.cli.main import main

    original = estimate.Estimator.__init__

    def without_bands(self: estimate.Estimator, *args: object, **kwargs: object) -> None:
        original(self, *args, **{**kwargs, "bands": False})  # type: ignore[arg-type]

    with tempfile.TemporaryDirectory() as tmp:
        argv = ["--cache", str(Path(tmp) / "cache.sqlite"), "run", "--models", ",".join(models), "--book", book,
                "--modes", "in-context", "--out", str(Path(tmp) / "run"), "--dry-run"]
        if judge:
            argv += ["--judge", judge]
        out = io.StringIO()
        if not bands:
            estimate.Estimator.__init__ = without_bands  # type: ignore[method-assign]
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                code = main(argv)
        finally:
            estimate.Estimator.__init__ = original  # type: ignore[method-assign]
    if code != 0:
        raise SystemExit(f"the dry run failed ({code})")
    return out.getvalue()


def table(stdout: str) -> list[str]:
    lines = stdout[stdout.index("cost estimate"):].splitlines()
    return [line for line in lines[1:] if line.strip()][:40]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--judge", default="claude-sonnet-5-5")
    parser.add_argument("--book", default="synaptic-echoes")
    parser.add_argument("--all", action="store_true", help="every row, retired ones included")
    parser.add_argument("--models", help="price these aliases instead of the leaderboard's rows (comma-separated)")
    args = parser.parse_args()
    callable_, retired = split_retired(rows())
    models = args.models.split(",") if args.models else callable_ + (retired if args.all else [])
    print(f"rows priced: {len(models)} ({args.models or ('all' if args.all else 'callable today')}); "
          f"book {args.book}; judge {args.judge}")
    for bands in (True, False):
        print(f"\n== price bands {'applied' if bands else 'off (base prices only)'} ==")
        print("\n".join(table(dry_run(models, args.book, args.judge, bands=bands))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
