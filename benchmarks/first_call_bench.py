"""Time to the first HTTP call of a run of 10 RAG models (issue 23).

Ten OpenAI-format models on one loopback server answer the book's questions
in rag-paragraph mode, the RAG index embedded by the offline MiniLM
(`local:minilm`), judged by builtin:judge. Each round runs twice on one cache
file: cold (a fresh cache: the chunks are embedded) and warm (the same cache:
the embeddings are read back; the answers are a new draw, so they are called). Printed per round: seconds from the start of
`pipeline.evaluate` to the first chat request the server answered (its reply
function's call, within the server's 0.05 s latency), and the
index's own seconds, beside the baseline of the same round: a run of the same
models in-context (no index), whose first call is bounded by the engine alone.

    python benchmarks/first_call_bench.py [--book synaptic-echoes] [--questions 30] [--rounds 2]
"""
from __future__ import annotations

import argparse
import asyncio
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

MODELS = [f"m{i}" for i in range(10)]
CHAT_TIMES: list[float] = []  # time.monotonic() of every chat request the server answered


def timed_reply(api: str, body: dict) -> str | tuple[str, str]:
    CHAT_TIMES.append(time.monotonic())
    return default_reply(api, body)


def config_for(server: LoopbackServer, folder: Path) -> Config:
    path = folder / "bench.toml"
    lines = [f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nmax_concurrency = 64\n']
    lines += [f'[models.{m}]\nendpoint = "loop"\nmodel = "{m}"\n' for m in MODELS]
    path.write_text("\n".join(lines))
    return Config.load(path)


async def first_call(config: Config, server: LoopbackServer, cache: str, book, questions, mode: str,
                     draw: int = 0) -> tuple[float, float]:
    """(seconds to the server's first chat call, seconds of the index). `draw`:
    the answers' repeat, so that a warm run reuses the embeddings but calls again."""
    jobs = pipeline.plan_jobs(questions, MODELS, [mode])
    for job in jobs:
        job.draw = draw
    before = len(CHAT_TIMES)
    start = time.monotonic()
    async with Engine(config, cache_path=cache) as engine:
        ev = await pipeline.evaluate(engine, config, book, questions, jobs, judge="builtin:judge",
                                     embed_model="local:minilm" if mode != A.IN_CONTEXT else None)
    first = CHAT_TIMES[before] - start
    return first, ev.retrieval_seconds


async def main(args: argparse.Namespace) -> None:
    book = load_book(args.book)
    questions = pipeline.sample_questions(build_questions(book), args.questions)
    rows: dict[str, list[float]] = {"in-context (baseline)": [], "RAG cold": [], "RAG warm": [],
                                    "index cold": [], "index warm": []}
    async with LoopbackServer(models=MODELS, reply=timed_reply, latency=constant(0.05)) as server:
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                config = config_for(server, Path(tmp))
                rows["in-context (baseline)"].append(
                    (await first_call(config, server, str(Path(tmp) / "ic.sqlite"), book, questions, A.IN_CONTEXT))[0])
                cache = str(Path(tmp) / "rag.sqlite")
                for draw, label in enumerate(("cold", "warm")):
                    first, index = await first_call(config, server, cache, book, questions, A.RAG_PARAGRAPH, draw)
                    rows[f"RAG {label}"].append(first)
                    rows[f"index {label}"].append(index)
    print(f"book {book.name}, {len(questions)} questions x {len(MODELS)} models, {args.rounds} rounds; "
          "seconds to the first chat call (median, range); goal <= 2 s")
    for label, values in rows.items():
        print(f"  {label:22s} {statistics.median(values):6.2f}  ({min(values):.2f}-{max(values):.2f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--book", default="synaptic-echoes")
    parser.add_argument("--questions", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    asyncio.run(main(parser.parse_args()))
