"""Time to bundle a run and to verify the bundle offline, beside `tulving report` on the same run.

A run folder (default: the README's main job, `tulving run`, made here with
its own cache) is bundled, then `tulving verify` (no call: digests, book and
question set, judge prompts, every judge reply parsed again, the scores
recomputed) and, as the baseline measured in the same run, `tulving report
RUN` (the scores computed once from results.jsonl) are each timed REPEAT
times as subprocesses (cold interpreters). Printed: median wall times, the
bundle's size and records, and the calls verify made (always 0: it opens no
engine).

    python benchmarks/verify_bench.py [--run DIR] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tulving(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-m", "engine.cli", *args], cwd=cwd, env=env, capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise SystemExit(result.stderr + result.stdout)
    return result


def timed(cwd: Path, repeat: int, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = tulving(cwd, *args)
        times.append(time.perf_counter() - start)
    assert result is not None
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="run folder (default: make the README's main job here)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        run = args.run
        if run is None:
            tulving(work, "--quiet", "--cache", "c.sqlite", "run", "--out", "main")
            run = work / "main"
        start = time.perf_counter()
        tulving(work, "bundle", str(run), "--out", str(work / "bundle.json"))
        bundled = time.perf_counter() - start
        bundle = json.loads((work / "bundle.json").read_text())
        verify, result = timed(work, args.repeat, "verify", str(work / "bundle.json"))
        report, _ = timed(work, args.repeat, "report", str(run))
    verdict = result.stdout.strip().splitlines()[-1]
    print(f"bundle: {len(bundle['records'])} records, {(len(json.dumps(bundle)) / 1e6):.1f} MB, {bundled:.2f} s")
    print(f"tulving verify (median of {args.repeat}): {verify:.2f} s -- {verdict}")
    print(f"baseline, tulving report on the run (median of {args.repeat}): {report:.2f} s")
    print(f"machine load: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
