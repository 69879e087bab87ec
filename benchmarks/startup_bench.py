"""Start-up of the `tulving` command: wall time from exec to exit
of the installed console script against bare interpreters.

    python benchmarks/startup_bench.py [--rounds 15] [--also TREE]

Cases, timed in interleaved rounds (each round runs every case once, in a
shuffled order, so machine load falls on all of them alike); prints the
median and range of each, and the median of the differences to `python -c
pass` in the same round:

- `python -c pass` and `python -c "import json"`: the floor and a light import;
- `tulving --version`, `tulving --help`;
- `tulving run --config BAD.toml`: a malformed config, its one-line error;
- for a command of every command module (models, bench, cache, generate,
  run, batches, data): `tulving COMMAND --help` and `tulving --config BAD.toml
  COMMAND`. (tests/test_startup.py checks that none of them loads the engine,
  aiohttp or numpy; this script times them.)

--also TREE adds the same three commands run as `python TREE/tulving_bench.py`
(another checkout, e.g. `git worktree add /tmp/before <commit>`), the
before/after comparison. The console script is the one beside the Python
running this script (the virtualenv's `bin/tulving`).
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL = 0.25  # seconds before the first line


def cases(bad: Path, also: Path | None) -> dict[str, list[str]]:
    python = sys.executable
    script = str(Path(python).with_name("tulving"))
    lines = [["--version"], ["--help"], ["run", "--config", str(bad)]]
    for command in (["models"], ["bench"], ["cache", "stats"], ["generate"], ["run"], ["batches"], ["data"]):
        lines += [[command[0], "--help"], ["--config", str(bad), *command]]
    found: dict[str, list[str]] = {
        "python -c pass": [python, "-c", "pass"],
        "python -c 'import json'": [python, "-c", "import json"],
    }
    for line in lines:
        shown = " ".join("bad.toml" if arg == str(bad) else arg for arg in line)
        found[f"tulving {shown}"] = [script, *line]
        if also is not None:  # the same, from another checkout
            found[f"{also.name}: {shown}"] = [python, str(also / "tulving_bench.py"), *line]
    return found


# As a user's shell runs them: bytecode cached (an environment that sets
# PYTHONDONTWRITEBYTECODE, as some sandboxes do, would compile every module of
# the package on every start).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


CPU: dict[str, list[float]] = {}  # CPU seconds (user + system) of each case's runs: less moved by load than wall


def timed(command: list[str], name: str = "") -> float:
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped by wait4
    CPU.setdefault(name, []).append(usage.ru_utime + usage.ru_stime)
    return time.perf_counter() - started


def measure(commands: dict[str, list[str]], rounds: int) -> dict[str, list[float]]:
    for command in commands.values():  # warm-up: .pyc files written, pages cached
        timed(command)
    times: dict[str, list[float]] = {name: [] for name in commands}
    order = list(commands)
    for _ in range(rounds):
        random.shuffle(order)
        for name in order:
            times[name].append(timed(commands[name], name))
    return times


def report(times: dict[str, list[float]]) -> None:
    floor = times["python -c pass"]
    print(f"{'case':44} {'median s':>9} {'range s':>15} {'- pass (median)':>16} {'CPU s (median)':>15}")
    for name, values in times.items():
        extra = statistics.median(v - f for v, f in zip(values, floor, strict=True))
        print(f"{name:44} {statistics.median(values):9.3f} {min(values):7.3f}-{max(values):<7.3f} {extra:16.3f}"
              f" {statistics.median(CPU[name]):15.3f}")
    slowest = max(statistics.median(v) for n, v in times.items() if n.startswith("tulving "))
    cpu = max(statistics.median(v) for n, v in CPU.items() if n.startswith("tulving "))
    verdict = "within" if slowest <= GOAL else "over"
    print(f"\nslowest tulving case: {slowest:.3f} s median wall, {verdict} the {GOAL} s goal "
          f"(its CPU {cpu:.3f} s: on a loaded host the wall time is mostly waiting for a core)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--also", type=Path, metavar="TREE", help="another checkout to time the same way")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        bad = Path(folder) / "bad.toml"
        bad.write_text("[endpoints.x\n")
        times = measure(cases(bad, args.also), args.rounds)
    print(f"{args.rounds} interleaved rounds, load average {open('/proc/loadavg').read().split()[0]} at the end\n")
    report(times)


if __name__ == "__main__":
    main()
