"""Batch mode on the long book: wall time of `tulving run --batch` where the
server finishes each batch after 3 polls, against a direct run measured in the
same script; then a run killed (SIGKILL) while it waits on its batches and
rerun with the same command: the batches it submits again (must be 0).

    python benchmarks/batch_bench.py                  # synaptic-echoes, 686 questions, in context
    python benchmarks/batch_bench.py --book synaptic-echoes-short --polls 3

Everything runs on this machine: the loopback server (`python -m
engine.loopback`, another process) answers an OpenAI-format endpoint `lb`
(alias `lb-reader`) directly or by batch; the judge is `builtin:judge`
(direct: it is not an openai/anthropic endpoint). The endpoint polls its
batches every `--poll` s (the real default is 10 s growing to 300 s: on the
real APIs the wait is the provider's, hours, not ours).

Measured (2026-11-24, 2 shared cores; the loopback server does a batch's work
inside its status polls and parses the 200 MB upload itself, so the batch run's
time is mostly the server's):
  load ~1.2: direct 13.1 s, batch 13.1 s (1.00x; 2 batches, 414 + 272 lines:
             the 686 in-context prompts are 274 MB, over OpenAI's 200 MB per file),
             direct rerun on the batch run's cache 3.2 s with answers and F1 identical;
             killed and rerun: 0 batches submitted again, 0 duplicate lines (resumed run 13.6 s)
  load ~4.5: batch/direct 0.91x, 1.08x and 3.40x in three runs (12.9-32.3 s direct)
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("TULVING_CONFIG", None)
    e.pop("TULVING_CACHE", None)
    return e


class Server:
    def __init__(self, polls: int):
        self.proc = subprocess.Popen([sys.executable, "-m", "engine.loopback", "--batch-polls", str(polls),
                                      "--models", "reader-model"],
                                     env=env(), stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.openai = self.proc.stdout.readline().strip().split("=", 1)[1]
        self.anthropic = self.proc.stdout.readline().strip().split("=", 1)[1]

    def get(self, url: str) -> dict:
        with urllib.request.urlopen(url, timeout=60) as reply:
            return json.loads(reply.read())

    def stats(self) -> dict:
        return self.get(self.anthropic + "/loopback/stats")

    def batches(self) -> list[dict]:
        return self.get(self.openai + "/batches?limit=100")["data"]

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=30)


def config(folder: Path, server: Server, poll: float) -> None:
    (folder / "tulving.toml").write_text(
        f'[endpoints.lb]\nkind = "openai"\nbase_url = "{server.openai}"\nmax_concurrency = 32\n'
        f'options = {{ batch_poll = {poll}, batch_poll_max = {poll} }}\n\n'
        '[models.lb-reader]\nendpoints = ["lb"]\nmodel = "reader-model"\n'
        'params = { temperature = 0.0, max_tokens = 32 }\n')


def command(args: argparse.Namespace, cache: str, out: str, batch: bool) -> list[str]:
    return [sys.executable, "-m", "engine.cli", "--quiet", "--config", "tulving.toml", "--cache", cache, "run",
            "--book", args.book, "--models", "lb-reader", "--modes", "in-context", "--judge", "builtin:judge",
            "--out", out] + (["--batch"] if batch else [])


def timed(cmd: list[str], folder: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=folder, env=env(), capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[3:])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return time.perf_counter() - start


def answers(out: Path) -> list[tuple]:
    from engine.benchmark.evaluation.results import load_results
    return [(r.q_idx, r.answer, r.f1) for r in load_results(out / "results.jsonl")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--book", default="synaptic-echoes")
    parser.add_argument("--polls", type=int, default=3, help="status polls until the server ends a batch")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between the engine's polls")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        server = Server(args.polls)
        try:
            config(folder, server, args.poll)
            direct = timed(command(args, "direct.sqlite", "direct", False), folder)
            batch = timed(command(args, "batch.sqlite", "batch", True), folder)
            stats = server.stats()
            sizes = [b["request_counts"]["total"] for b in server.batches()]
            rerun = timed(command(args, "batch.sqlite", "rerun", False), folder)
            same = answers(folder / "direct") == answers(folder / "batch") == answers(folder / "rerun")
        finally:
            server.close()
        questions = sum(1 for _ in (folder / "batch" / "results.jsonl").open())
        print(f"book {args.book}, {questions} questions in context; loopback server ends a batch at "
              f"poll {args.polls}; engine polls every {args.poll:g} s")
        print(f"direct run:  {direct:6.1f} s  ({stats['by_path'].get('/v1/chat/completions', 0)} direct calls "
              f"in the direct run)")
        print(f"batch run:   {batch:6.1f} s  ({batch / direct:.2f}x the direct run; {len(sizes)} batches of "
              f"{sizes} lines, {stats['batch_requests']} lines answered)")
        print(f"direct rerun on the batch run's cache: {rerun:.1f} s; answers and F1 identical to the direct run's: {same}")

        # Killed (SIGKILL) once its batches are recorded and being polled, rerun with the same command
        # against the same server (the provider's account): batches end on their 200th poll.
        server = Server(200)
        try:
            config(folder, server, 0.01)
            cmd = command(args, "killed2.sqlite", "killed2", True)
            proc = subprocess.Popen(cmd, cwd=folder, env=env(), stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline:
                try:
                    with sqlite3.connect(folder / "killed2.sqlite", timeout=5) as conn:
                        recorded = conn.execute("SELECT count(*) FROM batch_keys").fetchone()[0]
                except sqlite3.Error:
                    recorded = 0
                if recorded >= questions:
                    break
                time.sleep(0.2)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            submitted_before = len(server.batches())
            resumed = timed(cmd, folder)
            submitted_after = len(server.batches())
            lines = server.stats()["batch_requests"]
        finally:
            server.close()
        print(f"killed while waiting on {submitted_before} batch(es) ({recorded} keys recorded in the ledger), rerun: "
              f"{submitted_after - submitted_before} batches submitted again, lines answered {lines} for "
              f"{questions} questions (duplicates: {sum(lines.values()) - questions}); the resumed run took "
              f"{resumed:.1f} s")


if __name__ == "__main__":
    main()
