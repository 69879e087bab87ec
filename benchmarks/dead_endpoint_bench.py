"""A healthy model beside a dead one: how soon the run ends, and whether it
writes the healthy model's results.

    python benchmarks/dead_endpoint_bench.py [--limit 420] [--book synaptic-echoes-short]

Two loopback servers (own processes): one answers every call, the other
answers 500 to every call. `tulving run` in context with a model on each
(judged by builtin:judge), beside the baseline from the same run: the healthy
model alone. Prints, for each: the exit code, the wall time, when the "is
down" line came, and whether results.jsonl was written (a run still going
after --limit seconds is stopped: it wrote nothing). Goal: the run ends
within a small multiple of the healthy model's time, exit 3, results written.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine_bench import ServerProcess  # noqa: E402


def run(tmp: Path, good_url: str, bad_url: str, models: str, limit: float) -> dict[str, object]:
    config = tmp / "tulving.toml"
    config.write_text(f'[endpoints.okay]\nkind = "openai"\nbase_url = "{good_url}"\n\n'
                      f'[endpoints.dead]\nkind = "openai"\nbase_url = "{bad_url}"\n\n'
                      '[models.good]\nendpoint = "okay"\nmodel = "good"\n\n'
                      '[models.bad]\nendpoint = "dead"\nmodel = "bad"\n')
    out = tmp / f"out-{models.replace(',', '-')}"
    args = [sys.executable, "-m", "engine.cli", "--config", str(config), "--cache", str(tmp / f"{out.name}.sqlite"),
            "run", "--book", ARGS.book, "--models", models, "--modes", "in-context", "--judge", "builtin:judge",
            "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    down: list[float] = []

    def read() -> None:  # the stderr's lines as they come (progress lines end in \r)
        assert proc.stderr is not None  # stderr=PIPE
        while chunk := proc.stderr.read1(65536):
            if not down and b" is down:" in chunk:
                down.append(time.perf_counter() - start)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code: object = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.wait()
        code = "stopped"
    wall = time.perf_counter() - start
    reader.join(timeout=5)
    down_at = down[0] if down else None
    return {"code": code, "wall": wall, "down_at": down_at,
            "written": (out / "results.jsonl").is_file()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=float, default=420.0, help="stop a run still going after this many seconds")
    parser.add_argument("--book", default="synaptic-echoes-short")
    global ARGS
    ARGS = parser.parse_args()
    with ServerProcess("--models", "good") as good, ServerProcess("--models", "bad", "--fault", "500=1.0") as bad, \
            tempfile.TemporaryDirectory() as tmp:
        for label, models in (("healthy model alone (baseline)", "good"), ("healthy + dead", "good,bad")):
            r = run(Path(tmp), good.base_url, bad.base_url, models, ARGS.limit)
            down = f"{r['down_at']:.1f} s" if r["down_at"] is not None else "-"
            print(f"{label:32s} exit {r['code']!s:8s} wall {r['wall']:6.1f} s  'is down' line at {down:>7s}  "
                  f"results written: {'yes' if r['written'] else 'no'}", flush=True)


ARGS: argparse.Namespace

if __name__ == "__main__":
    main()
