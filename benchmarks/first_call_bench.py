"""Time to the first HTTP call of a run of 10 RAG models.

Ten OpenAI-format models on one loopback server answer the book's questions
in rag-paragraph mode, the RAG index embedded by the offline MiniLM
(`local:minilm`), judged by builtin:judge. Each round runs, in this order:
- in-context (the baseline: no index; its first call is bounded by the engine alone);
- RAG cold: a fresh cache; the chunks' vectors are the shipped ones
  (providers/embed_table.py) where the book is the default one, else computed;
- RAG warm: the same cache (the embeddings are read back; the answers are a
  new draw, so they are called);
- RAG cold, computed: a fresh cache and an endpoint with `precomputed = false`,
  so every chunk is embedded by the numpy encoder.
The shipped table's model digest (a hash of the ~90 MB model files, once per
process) is forgotten before each round, so every round pays it as a fresh
process would. Printed: seconds from the start of `pipeline.evaluate` to the
first chat request the server answered (its reply function's call, within
the server's 0.05 s latency), and the index's own seconds; median and range
over the rounds, with the load average before and after.

With `--cli`, the same three cold cases (in-context, RAG with the shipped
vectors, RAG computed) run as `tulving run` processes, each on a fresh cache,
timed from the process's spawn to the server's first chat request: what a
user sees, imports and loading the book included.

    python benchmarks/first_call_bench.py [--book synaptic-echoes] [--questions 30] [--rounds 2] [--cli]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.benchmark.evaluation import answers as A  # noqa: E402
from engine.benchmark.evaluation import pipeline  # noqa: E402
from engine.benchmark.evaluation.questions import build_questions  # noqa: E402
from engine.benchmark.generation.published import load_book  # noqa: E402
from engine.config import Config  # noqa: E402
from engine.loopback.server import LoopbackServer, constant, default_reply  # noqa: E402
from engine.scheduler import Engine  # noqa: E402
from providers import embed_table  # noqa: E402

MODELS = [f"m{i}" for i in range(10)]
CHAT_TIMES: list[float] = []  # time.monotonic() of every chat request the server answered


def timed_reply(api: str, body: dict) -> str | tuple[str, str]:
    CHAT_TIMES.append(time.monotonic())
    return default_reply(api, body)


def config_for(server: LoopbackServer, folder: Path) -> Config:
    path = folder / "bench.toml"
    lines = [f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nmax_concurrency = 64\n']
    lines += [f'[models.{m}]\nendpoint = "loop"\nmodel = "{m}"\n' for m in MODELS]
    lines += ['[endpoints.embed-computed]\nkind = "local-embed"\noptions = { precomputed = false }\n',
              '[models.minilm-computed]\nendpoint = "embed-computed"\nmodel = "all-MiniLM-L6-v2"\n']
    path.write_text("\n".join(lines))
    return Config.load(path)


async def first_call(config: Config, server: LoopbackServer, cache: str, book, questions, mode: str,
                     draw: int = 0, embedder: str = "local:minilm") -> tuple[float, float]:
    """(seconds to the server's first chat call, seconds of the index). `draw`:
    the answers' repeat, so that a warm run reuses the embeddings but calls again."""
    jobs = pipeline.plan_jobs(questions, MODELS, [mode])
    for job in jobs:
        job.draw = draw
    before = len(CHAT_TIMES)
    start = time.monotonic()
    async with Engine(config, cache_path=cache) as engine:
        ev = await pipeline.evaluate(engine, config, book, questions, jobs, judge="builtin:judge",
                                     embed_model=embedder if mode != A.IN_CONTEXT else None)
    first = CHAT_TIMES[before] - start
    return first, ev.retrieval_seconds


async def cli_first_call(config_path: Path, folder: Path, book: str, questions: int, mode: str,
                         embedder: str) -> float:
    """Seconds from spawning `tulving run` (fresh cache) to the server's first chat call."""
    name = f"{mode}-{embedder}-{len(CHAT_TIMES)}"
    before = len(CHAT_TIMES)
    start = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "engine.cli", "--config", str(config_path), "--cache", str(folder / f"{name}.sqlite"),
        "--quiet", "run", "--book", book, "--models", ",".join(MODELS), "--modes", mode, "--embed-model", embedder,
        "--judge", "builtin:judge", "--sample", str(questions), "--out", str(folder / name),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0 or len(CHAT_TIMES) == before:
        raise SystemExit(f"tulving run {mode} failed ({proc.returncode}): {err.decode()[-500:]}")
    return CHAT_TIMES[before] - start


async def main_cli(args: argparse.Namespace) -> None:
    cases = {"in-context (baseline)": (A.IN_CONTEXT, "local:minilm"),
             "RAG cold, shipped vectors": (A.RAG_PARAGRAPH, "local:minilm"),
             "RAG cold, computed": (A.RAG_PARAGRAPH, "minilm-computed")}
    rows: dict[str, list[float]] = {label: [] for label in cases}
    load_before = os.getloadavg()[0]
    async with LoopbackServer(models=MODELS, reply=timed_reply, latency=constant(0.05)) as server:
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                config_for(server, Path(tmp))
                for label, (mode, embedder) in cases.items():
                    rows[label].append(await cli_first_call(Path(tmp) / "bench.toml", Path(tmp), args.book,
                                                            args.questions, mode, embedder))
    print(f"`tulving run`, book {args.book}, {args.questions} questions x {len(MODELS)} models, {args.rounds} rounds, "
          f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          "seconds from spawn to the first chat call (median, range); goal <= 2 s")
    for label, values in rows.items():
        print(f"  {label:26s} {statistics.median(values):6.2f}  ({min(values):.2f}-{max(values):.2f})")


async def main(args: argparse.Namespace) -> None:
    book = load_book(args.book)
    questions = pipeline.sample_questions(build_questions(book), args.questions)
    rows: dict[str, list[float]] = {"in-context (baseline)": [], "RAG cold": [], "RAG warm": [],
                                    "RAG cold, computed": [], "index cold": [], "index warm": [],
                                    "index cold, computed": []}
    load_before = os.getloadavg()[0]
    async with LoopbackServer(models=MODELS, reply=timed_reply, latency=constant(0.05)) as server:
        for _ in range(args.rounds):
            embed_table.for_folder.cache_clear()  # as a fresh process: hash the model files again
            with tempfile.TemporaryDirectory() as tmp:
                config = config_for(server, Path(tmp))
                rows["in-context (baseline)"].append(
                    (await first_call(config, server, str(Path(tmp) / "ic.sqlite"), book, questions, A.IN_CONTEXT))[0])
                cache = str(Path(tmp) / "rag.sqlite")
                for draw, label in enumerate(("cold", "warm")):
                    first, index = await first_call(config, server, cache, book, questions, A.RAG_PARAGRAPH, draw)
                    rows[f"RAG {label}"].append(first)
                    rows[f"index {label}"].append(index)
                first, index = await first_call(config, server, str(Path(tmp) / "computed.sqlite"), book, questions,
                                                A.RAG_PARAGRAPH, embedder="minilm-computed")
                rows["RAG cold, computed"].append(first)
                rows["index cold, computed"].append(index)
    print(f"book {book.name}, {len(questions)} questions x {len(MODELS)} models, {args.rounds} rounds, "
          f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
          "seconds to the first chat call (median, range); goal <= 2 s")
    for label, values in rows.items():
        print(f"  {label:22s} {statistics.median(values):6.2f}  ({min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--book", default="synaptic-echoes")
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cli", action="store_true", help="time `tulving run` processes from their spawn")
    parsed = parser.parse_args()
    asyncio.run(main_cli(parsed) if parsed.cli else main(parsed))
