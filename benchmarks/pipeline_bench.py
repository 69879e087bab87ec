"""Benchmark of the whole evaluation pipeline against the loopback server.

Every question of a book is answered in-context (the whole book in each
prompt) by an OpenAI-format model served on loopback with a fixed latency,
then judged by builtin:judge, through one Engine with a fresh cache; then the
same run again, from the cache. Prints wall times, calls per second and the
peak resident memory, which shows that book-sized prompts are built lazily
(686 prompts of the long book would be ~300 MB if held at once).

    python benchmarks/pipeline_bench.py [--book synaptic-echoes] [--latency-ms 200] [--concurrency 32]
        [--http-client pool|aiohttp]
"""
from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.benchmark.evaluation import pipeline  # noqa: E402
from engine.benchmark.evaluation.questions import build_questions  # noqa: E402
from engine.benchmark.generation.published import load_book  # noqa: E402
from engine.config import Config  # noqa: E402
from engine.loopback.server import LoopbackServer, constant  # noqa: E402
from engine.scheduler import Engine  # noqa: E402


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def one_run(config: Config, book, questions, cache: str) -> tuple[float, pipeline.Evaluation]:
    jobs = pipeline.plan_jobs(questions, ["bench-model"], ["in-context"])
    start = time.perf_counter()
    async with Engine(config, cache_path=cache) as engine:
        ev = await pipeline.evaluate(engine, config, book, questions, jobs, judge="builtin:judge")
    return time.perf_counter() - start, ev


async def main(args: argparse.Namespace) -> None:
    book = load_book(args.book)
    questions = build_questions(book)
    print(f"book {book.name}: {book.n_tokens} tokens, {len(questions)} questions; "
          f"rss after loading {peak_rss_mb():.0f} MB; baseline: the {len(questions)} in-context prompts held at "
          f"once would be {len(questions) * len(book.text) / 1e6:.0f} MB of text (x2 more as request bodies)")
    async with LoopbackServer(models=["bench"], latency=constant(args.latency_ms / 1000)) as server:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bench.toml"
            path.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\n'
                            f'max_concurrency = {args.concurrency}\n'
                            f'options = {{ http_client = "{args.http_client}" }}\n\n'
                            '[models.bench-model]\nendpoint = "loop"\nmodel = "bench"\n')
            config = Config.load(path)
            cache = str(Path(tmp) / "cache.sqlite")
            for label in ("cold", "cached"):
                wall, ev = await one_run(config, book, questions, cache)
                stats = ev.stats[("bench-model", "in-context")]
                print(f"{label:6s}: {wall:6.2f} s, {stats.calls} outcomes ({stats.calls / wall:.0f}/s), "
                      f"{stats.cache_hits} cache hits, server calls so far "
                      f"{server.stats.by_path['/v1/chat/completions']}, peak rss {peak_rss_mb():.0f} MB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--book", default="synaptic-echoes")
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--http-client", choices=["pool", "aiohttp"], default="pool",
                        help="the providers' HTTP client (default %(default)s)")
    asyncio.run(main(parser.parse_args()))
