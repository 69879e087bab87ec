"""The table of the speed goals, regenerated: runs each goal's benchmark
script in turn (one at a time, so none disturbs another), keeps what each
printed in full, and prints a Markdown table of the lines that carry the
figures and their same-run baselines, headed by the commit and the time.

    python benchmarks/goals_table.py                      # every goal, 12-20 minutes
    python benchmarks/goals_table.py --only zero,rerun --out /tmp/goals

The figures are the scripts' own lines, word for word: read each against the
baseline printed beside it (the host's speed moves; ratios carry over).
docs/measured.md pastes this table with the command and commit it names.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _stripped_startswith(*prefixes: str) -> Callable[[str], bool]:
    return lambda line: line.strip().startswith(prefixes)


# name, goal, script and arguments, which of its lines carry the figures
GOALS: list[tuple[str, str, list[str], Callable[[str], bool]]] = [
    ("limits", "3,000 RPM over sliding 1 s windows: >= 0.97 of the limit, <= 15 429s, 0 lost, whatever the "
     "headers say (per-minute headers, none, a token bucket); 30% random 429s within 1.3x the bound",
     ["limits_bench.py", "--rounds", "1"], lambda line: " engine: " in line),
    ("models", "10 models over 4 endpoints: within 1.1x the limit-bound minimum, <= 1% 429s, 0 lost",
     ["many_models_bench.py", "--rounds", "1"], _stripped_startswith("engine:", "paced:", "bound:")),
    ("zero", "zero latency, 3,000 calls at concurrency 64, cache writes on: >= 1.0x the bare loop's calls/s "
     "at <= 1.0x its CPU a call", ["engine_bench.py", "--parts", "1", "--rounds", "5"],
     _stripped_startswith("engine", "bare")),
    ("rerun", "cached rerun of 10,000 requests: >= 50,000 requests/s", ["engine_bench.py", "--parts", "3",
                                                                         "--rounds", "5"],
     _stripped_startswith("engine", "bare")),
    ("startup", "`tulving --help`, `--version`, a config error: <= 0.25 s", ["startup_bench.py", "--rounds", "10"],
     lambda line: line.startswith(("tulving", "python", "slowest"))),
    ("first-call", "the first call of a 10-model `tulving run` within 2 s of its start",
     ["first_call_bench.py", "--book", "synaptic-echoes-short", "--questions", "5", "--rounds", "3", "--cli"],
     _stripped_startswith("in-context", "RAG")),
    ("memory", "a 1M-token book x 686 questions in context in <= 600 MB peak, flat in questions",
     ["memory_bench.py"], lambda line: line.strip()[:1].isdigit() or line.strip().startswith("events")),
]


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" (uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def cell(lines: list[str]) -> str:
    return "<br>".join(f"`{line.strip().replace('|', '/')}`" for line in lines) or "(no figure line: see the output)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated goal names: " + ",".join(g[0] for g in GOALS))
    parser.add_argument("--out", type=Path, help="folder for each script's full output")
    args = parser.parse_args()
    wanted = set(filter(None, args.only.split(",")))
    unknown = wanted - {g[0] for g in GOALS}
    if unknown:
        parser.error(f"unknown goal(s): {', '.join(sorted(unknown))}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    rows, failed = [], 0
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for name, goal, command, keep in GOALS:
        if wanted and name not in wanted:
            continue
        shown = "python benchmarks/" + " ".join(command)
        print(f"running {shown} ...", file=sys.stderr, flush=True)
        began = time.monotonic()
        done = subprocess.run([sys.executable, str(HERE / command[0]), *command[1:]], capture_output=True,
                              text=True, cwd=HERE.parent, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        seconds = time.monotonic() - began
        if args.out:
            (args.out / f"{name}.txt").write_text(f"$ {shown}\n{done.stdout}{done.stderr}")
        lines = [line for line in done.stdout.splitlines() if keep(line)]
        if done.returncode != 0:
            failed += 1
            lines.append(f"exit {done.returncode}: " + (done.stderr.strip().splitlines() or ["?"])[-1])
        rows.append(f"| {goal} | `{shown}` ({seconds:.0f} s) | {cell(lines)} |")
    load = open("/proc/loadavg").read().split()[0] if os.path.exists("/proc/loadavg") else "?"
    print(f"The speed goals on {commit()}, {started}, {os.cpu_count()} CPUs, load average {load} at the end\n")
    print("| goal | command | what it printed (figures and their same-run baselines) |")
    print("|---|---|---|")
    print("\n".join(rows))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
