"""What reproducing the whole published leaderboard would cost today, before
any call: every row of engine/benchmark/data/published/leaderboard.json that
is an alias a user can still call (retired ones are listed apart), on the long
book (synaptic-echoes, 686 questions) in context, judged by the default judge.

It runs `tulving run --dry-run` as a user would (a subprocess, on an empty
cache in a temporary folder: nothing is sent, no key is needed) and prints
its cost table: direct, batch, prompt cache, and batch + prompt cache.

    python benchmarks/leaderboard_cost.py [--judge ALIAS] [--book synaptic-echoes]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEADERBOARD = ROOT / "engine" / "benchmark" / "data" / "published" / "leaderboard.json"


def rows() -> list[str]:
    return [row["model"] for row in json.loads(LEADERBOARD.read_text())["rows"]]


def split_retired(names: list[str]) -> tuple[list[str], list[str]]:
    from engine.config import Config

    config = Config.load()
    callable_, retired = [], []
    for name in names:
        alias = config.models.get(name)
        if alias is None:
            raise SystemExit(f"leaderboard row {name!r} is not a built-in alias")
        (retired if alias.retired else callable_).append(name)
    return callable_, retired


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--judge", help="judge alias (default: tulving run's default judge for API models)")
    parser.add_argument("--book", default="synaptic-echoes")
    args = parser.parse_args()
    callable_, retired = split_retired(rows())
    print(f"leaderboard rows: {len(callable_) + len(retired)}; callable today: {len(callable_)}; "
          f"retired: {', '.join(retired) or 'none'}")
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "engine.cli", "--cache", str(Path(tmp) / "cache.sqlite"), "run",
                   "--models", ",".join(callable_), "--book", args.book, "--modes", "in-context",
                   "--out", str(Path(tmp) / "run"), "--dry-run"]
        if args.judge:
            command += ["--judge", args.judge]
        print("$", " ".join(command[2:]), flush=True)
        done = subprocess.run(command, cwd=ROOT, text=True, capture_output=True)
    print(done.stdout, end="")
    print("\n".join(line for line in done.stderr.splitlines() if not line.startswith("note:")), file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
