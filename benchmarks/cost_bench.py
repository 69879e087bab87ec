"""What provider prompt caching saves on the benchmark's main job: the long
book (synaptic-echoes, ~103k tokens) in context before each of its 686
questions, answered by a loopback alias priced like claude-3-5-sonnet and one
priced like gpt-4o, judged by the free built-in judge.

`tulving run` runs as a subprocess against the loopback server in another
process (`python -m engine.loopback`, which reports prompt-cache reads and
writes as each API does: Anthropic where a block is marked, OpenAI
automatically), each configuration on a fresh cache:

  prompt caching   the default: the book marked (Anthropic cache_control) and
                   warmed with one call per model before the other questions
  no marking       endpoint option prompt_cache = false: nothing marked, no
                   warm-first (OpenAI's automatic cache still reads what it can)

Figures, from run.json's spending (priced from each reply's usage):
`list` is the calls at list price without caching or batch, `spent` what the
replies cost. With `--batch`, `tulving run --batch` is used when the option
exists (the batch-API execution mode), giving the "batch" and "both" columns.

    python benchmarks/cost_bench.py [--questions 686] [--batch] [--skip-unmarked] [--latency-ms 300]

Measured (2026-11-24, 686 questions, 300 ms a call, 2 shared cores at load ~7; the
loopback server counts ceil(len/4) tokens, ~22% more than cl100k_base, so the
book is 125,474 of its tokens):
  sonnet-priced  list $258.68, prompt caching $26.71 (90% saved: 1 write, 685 reads), no marking $258.68
  gpt4o-priced   list $215.53, prompt caching $108.12 (50% saved), no marking or warming $112.98
  wall: 72.5 s with prompt caching, 71.9 s without (both models in one run)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# USD per million tokens, as the built-in aliases (engine/config.py, dated there).
SONNET = {"price_in": 3.0, "price_cached_in": 0.3, "price_cache_write": 3.75, "price_out": 15.0,
          "batch_discount": 0.5}
GPT4O = {"price_in": 2.5, "price_cached_in": 1.25, "price_out": 10.0, "batch_discount": 0.5}


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    for name in ("TULVING_CONFIG", "TULVING_CACHE"):
        e.pop(name, None)
    return e


def start_server(batch_polls: int, latency_ms: float) -> tuple[subprocess.Popen[str], str, str]:
    server = subprocess.Popen([sys.executable, "-m", "engine.loopback", "--batch-polls", str(batch_polls),
                               "--latency-ms", str(latency_ms),
                               # the retired sonnet id the reference ran: declared, as a proxy serving it would
                               "--models", "claude-3-5-sonnet-20240620"],
                              cwd=ROOT, env=env(), stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    urls = {}
    while len(urls) < 2:
        line = server.stdout.readline()
        if not line:
            raise SystemExit("the loopback server did not start")
        name, _, value = line.strip().partition("=")
        urls[name] = value
    return server, urls["openai_base_url"], urls["anthropic_base_url"]


def config_text(openai_url: str, anthropic_url: str, prompt_cache: bool) -> str:
    def prices(table: dict[str, float]) -> str:
        return "".join(f"{k} = {v}\n" for k, v in table.items())

    options = f"options = {{ prompt_cache = {'true' if prompt_cache else 'false'} }}\n"
    return (f'[endpoints.ant]\nkind = "anthropic"\nbase_url = "{anthropic_url}"\nmax_concurrency = 32\n{options}\n'
            f'[endpoints.oai]\nkind = "openai"\nbase_url = "{openai_url}"\nmax_concurrency = 32\n{options}\n'
            f'[models.sonnet-priced]\nendpoint = "ant"\nmodel = "claude-3-5-sonnet-20240620"\n'
            f'params = {{ max_tokens = 200 }}\n{prices(SONNET)}\n'
            f'[models.gpt4o-priced]\nendpoint = "oai"\nmodel = "gpt-4o-2024-08-06"\n'
            f'params = {{ max_tokens = 200 }}\n{prices(GPT4O)}\n')


def has_batch_option() -> bool:
    done = subprocess.run([sys.executable, "-m", "engine.cli", "run", "--help"], cwd=ROOT, env=env(),
                          capture_output=True, text=True)
    return "--batch" in done.stdout


def run(folder: Path, config: str, questions: int, batch: bool) -> tuple[dict[str, dict[str, float]], float]:
    folder.mkdir(parents=True)
    (folder / "tulving.toml").write_text(config)
    args = [sys.executable, "-m", "engine.cli", "--quiet", "--config", "tulving.toml", "--cache", "c.sqlite",
            "run", "--book", "synaptic-echoes", "--models", "sonnet-priced,gpt4o-priced", "--out", "run"]
    if questions < 686:
        args += ["--sample", str(questions)]
    if batch:
        args.append("--batch")
    started = time.perf_counter()
    done = subprocess.run(args, cwd=folder, env=env(), capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"tulving run failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    spending = json.loads((folder / "run" / "run.json").read_text())["spending"]
    return {r["model"]: r for r in spending if r["role"] == "answer"}, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=686)
    parser.add_argument("--batch", action="store_true", help="also run with tulving run --batch (when it exists)")
    parser.add_argument("--latency-ms", type=float, default=300.0,
                        help="loopback latency per call (default %(default)s: calls overlap as on a real API)")
    parser.add_argument("--skip-unmarked", action="store_true", help="skip the run without marking and warming")
    args = parser.parse_args()
    batch = args.batch and has_batch_option()
    if args.batch and not batch:
        print("note: tulving run has no --batch option here: batch columns left out", file=sys.stderr)
    results: dict[str, tuple[dict[str, dict[str, float]], float]] = {}
    plan = [("prompt caching", True, False)]
    if not args.skip_unmarked:
        plan.append(("no marking", False, False))
    if batch:
        plan.append(("batch + prompt caching", True, True))
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, cache, by_batch) in enumerate(plan):
            # A fresh server each time: its prompt cache must not hold the book from the previous run.
            server, openai_url, anthropic_url = start_server(batch_polls=3, latency_ms=args.latency_ms)
            try:
                results[name] = run(Path(tmp) / str(i), config_text(openai_url, anthropic_url, cache),
                                    args.questions, by_batch)
            finally:
                server.terminate()
                server.wait(timeout=30)
    print(f"synaptic-echoes in context, {args.questions} questions per model, loopback server "
          f"({args.latency_ms:g} ms a call; list prices of the built-in aliases; output tokens as the loopback "
          f"server replied)\n")
    head = ["model", "direct (list)", "prompt caching", "saved", "no marking", "batch (list x 0.5)",
            "batch + caching", "cache read", "cache written", "wall (s)"]
    rows = []
    cached_rows, cached_wall = results["prompt caching"]
    for model in ("sonnet-priced", "gpt4o-priced"):
        r = cached_rows[model]
        listed, spent = r["list_usd"], r["spent_usd"]
        unmarked = results.get("no marking")
        both = results.get("batch + prompt caching")
        rows.append([model, f"${listed:.2f}", f"${spent:.2f}", f"{1 - spent / listed:.0%}" if listed else "-",
                     f"${unmarked[0][model]['spent_usd']:.2f}" if unmarked else "-",
                     f"${listed * 0.5:.2f}",
                     f"${both[0][model]['spent_usd']:.2f}" if both else "-",
                     f"{r['cache_read_tokens']:,}", f"{r['cache_write_tokens']:,}", f"{cached_wall:.1f}"])
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    for cells in [head, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip())
    walls = ", ".join(f"{name} {wall:.1f} s" for name, (_, wall) in results.items())
    print(f"\nwall times: {walls}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
