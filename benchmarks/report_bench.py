"""Time to render `tulving report` over many runs, and the size of index.html.

One real offline run (builtin:reader in-context, judged by builtin:judge) of
a book's full question set (686 questions on the long book) is made with the
CLI; N-1 more run folders are copies of it under other model names, with
each copy's F1 lowered on a different share of the questions (so that the
ranking and the figures have something to show). Then `tulving report` over
the N folders is timed as a subprocess (cold interpreter, figures included),
REPEAT times; the figures printed are the median wall time, the sizes of
index.html and of the whole report folder.

    python benchmarks/report_bench.py [--runs 10] [--book synaptic-echoes] [--repeat 3]

builtin:reader answers are short; a real model's answers are longer and the
drill-down (one row per run and question, answers in full) grows with them.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from engine.benchmark.evaluation.results import load_results, write_results  # noqa: E402


def tulving(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, env=env, capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise SystemExit(result.stderr)
    return result


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--book", default="synaptic-echoes")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tulving(root, "--quiet", "--cache", "c.sqlite", "run", "--book", args.book, "--models", "builtin:reader",
                "--modes", "in-context", "--judge", "builtin:judge", "--out", "run01")
        base = load_results(root / "run01")
        run_json = (root / "run01" / "run.json").read_text()
        for i in range(2, args.runs + 1):
            records = load_results(root / "run01")
            for r in records:
                r.model = f"model-{i:02d}"
                if r.f1 is not None and (r.q_idx * 7 + i) % (args.runs + 2) < i:
                    r.f1 = round(r.f1 * 0.5, 6)
            folder = root / f"run{i:02d}"
            folder.mkdir()
            write_results(folder / "results.jsonl", records)
            (folder / "run.json").write_text(run_json.replace('"builtin:reader"', f'"model-{i:02d}"'))
        folders = [f"run{i:02d}" for i in range(1, args.runs + 1)]
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            out = tulving(root, "report", *folders, "--out", "report")
            times.append(time.perf_counter() - start)
        html = root / "report" / "index.html"
        print(f"{args.runs} runs x {len(base)} questions of {args.book} ({args.runs * len(base)} drill-down rows)")
        print(f"tulving report wall time: median {statistics.median(times):.2f} s "
              f"(runs: {', '.join(f'{t:.2f}' for t in times)})")
        print(f"index.html: {html.stat().st_size / 1e6:.2f} MB; report folder: "
              f"{folder_size(root / 'report') / 1e6:.2f} MB "
              f"({len(list((root / 'report' / 'figures').glob('*.png')))} figures, "
              f"{len(list((root / 'report' / 'tables').glob('*.csv')))} tables)")
        print(out.stdout.strip())


if __name__ == "__main__":
    main()
