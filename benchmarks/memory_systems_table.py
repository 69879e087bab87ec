"""Memory systems side by side on one book, offline: the paper's built-in modes
(in-context, rag-paragraph, rag-chapter), the no-memory baseline, mem0 (stored
as given, and with its LLM extraction), LanceDB, graphiti on Kuzu -- each read by the built-in
reader and scored by the built-in judge -- as one Markdown table.

It runs `tulving run` as a user would (a subprocess, on an empty cache in a
temporary folder, so ingest is measured, not replayed), then reads the run's
scores.json, run.json and results.jsonl. Dollars are at list prices as if the
run's calls had gone to a named current model (`--price-as`, default
gpt-6.1-terra; embeddings at text-embedding-3-small): the memory systems' own
calls (ingest, recall) and the answering calls, with the token counts the run
recorded (the built-in models count characters / 4). The judge's calls are
left out: the same for every row.

    python benchmarks/memory_systems_table.py [--book synaptic-echoes-short] [--sample N]
        [--memory mem0,mem0-extract,lancedb,graphiti] [--price-as ALIAS] [--keep DIR]

The built-in reader is a lexical baseline, not an LLM, and mem0's and graphiti's
extraction through it copies sentences (docs/memory-systems-adapters.md): the table
compares memories under one reader, not what an LLM would score.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILTIN_MODES = "in-context,rag-paragraph,rag-chapter,no-memory"
SYSTEMS = "mem0,mem0-extract,lancedb,graphiti"
CHAT, EMBED = "builtin:reader", "local:minilm"


def run(folder: Path, args: argparse.Namespace) -> float:
    """`tulving run` on an empty cache; its wall time in seconds."""
    command = [sys.executable, "-m", "engine.cli", "--quiet", "--cache", str(folder / "cache.sqlite"), "run",
               "--book", args.book, "--models", CHAT, "--judge", "builtin:judge", "--embed-model", EMBED,
               "--modes", args.modes, "--memory", args.memory, "--out", str(folder / "run")]
    if args.sample:
        command += ["--sample", str(args.sample)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TULVING_CACHE", None)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"tulving run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return time.perf_counter() - start


def prices(price_as: str, embed_as: str):
    from engine.config import Config

    config = Config.load()
    return config.alias(price_as), config.alias(embed_as)


def memory_usd(spending: list[dict], name: str, chat_alias, embed_alias) -> tuple[float, dict[str, int]]:
    """List-price dollars of a memory system's own calls, and its ingest calls by kind."""
    usd, ingest_calls = 0.0, defaultdict(int)
    for row in spending:
        if not row["role"].startswith(f"memory {name}: "):
            continue
        alias = embed_alias if row["model"] == EMBED else chat_alias
        usd += alias.cost(row["input_tokens"], row["output_tokens"])
        if row["role"].endswith(": ingest"):
            ingest_calls["embed" if row["model"] == EMBED else "chat"] += row["calls"]
    return usd, dict(ingest_calls)


def answer_usd(results: Path, chat_alias) -> dict[str, float]:
    """List-price dollars of the answering calls, per memory."""
    out: dict[str, float] = defaultdict(float)
    for line in results.read_text().splitlines():
        row = json.loads(line)
        out[row["mode"]] += chat_alias.cost(row.get("input_tokens") or 0, row.get("output_tokens") or 0)
    return out


def interval(value, ci) -> str:
    if value is None:
        return "undefined"
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{value:.3f}"


def ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def table(folder: Path, args: argparse.Namespace) -> list[str]:
    """The Markdown table of one run (the folder `run` wrote)."""
    scores = json.loads((folder / "run" / "scores.json").read_text())
    run_json = json.loads((folder / "run" / "run.json").read_text())
    chat_alias, embed_alias = prices(args.price_as, args.embed_price_as)
    answers = answer_usd(folder / "run" / "results.jsonl", chat_alias)
    lines = ["| memory | Simple Recall [95% CI] | Chronological Awareness [95% CI] | chapter recall | chapter precision "
             "| ingest s | ingest calls (chat / embed) | recall p50 / p95 ms | evidence tokens | memory $ | answer $ "
             "| total $ |", "|---" * 12 + "|"]
    for row in sorted(scores["runs"], key=lambda r: -(r["simple_recall"] or 0)):
        name, memory = row["mode"], row.get("memory") or {}
        phases = run_json["memory"].get(name, {}).get("phases", {})
        latency = run_json["memory"].get(name, {}).get("recall_latency", {})
        mem_usd, calls = memory_usd(run_json["spending"], name, chat_alias, embed_alias)
        total = mem_usd + answers[name]
        recall, precision = memory.get("retrieval_recall"), memory.get("retrieval_precision")
        lines.append(
            f"| {name} | {interval(row['simple_recall'], row.get('simple_recall_ci'))} "
            f"| {interval(row['chronological_awareness'], row.get('chronological_awareness_ci'))} "
            f"| {'-' if recall is None else f'{recall:.2f}'} | {'-' if precision is None else f'{precision:.2f}'} "
            f"| {phases.get('ingest', {}).get('seconds', 0):.1f} | {calls.get('chat', 0)} / {calls.get('embed', 0)} "
            f"| {ms(latency.get('p50'))} / {ms(latency.get('p95'))} "
            f"| {memory.get('evidence_tokens') or 0:,.0f} | {mem_usd:.4f} | {answers[name]:.4f} | {total:.4f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--book", default="synaptic-echoes-short")
    parser.add_argument("--sample", type=int, default=0, help="questions (default: all)")
    parser.add_argument("--modes", default=BUILTIN_MODES)
    parser.add_argument("--memory", default=SYSTEMS)
    parser.add_argument("--price-as", default="gpt-6.1-terra", help="chat model whose list prices are applied")
    parser.add_argument("--embed-price-as", default="text-embedding-3-small")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tulving-memory-table-") as temporary:
        folder = args.keep or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        seconds = run(folder, args)
        questions = json.loads((folder / "run" / "scores.json").read_text())["runs"][0]["questions"]
        print(f"{args.book}, {questions} questions, reader {CHAT}, judge builtin:judge, embeddings {EMBED}; "
              f"dollars at {args.price_as} / {args.embed_price_as} list prices; one run, {seconds:.0f} s wall\n")
        print("\n".join(table(folder, args)))


if __name__ == "__main__":
    main()
