"""Peak memory of a big book in context through the built-in reader.

Each case runs in its own subprocess (peak RSS is a high-water mark): every
question of the book answered in-context by builtin:reader and judged by
builtin:judge, through one Engine with a fresh on-disk cache. Cases: a
2,000-event and a 4,000-event book, each with N and 2N questions, so that
flatness in the number of questions shows beside the book's size.

The books are written offline by builtin:writer (`tulving generate`, not
timed) into benchmarks/artifacts/ (ignored by git) and reused by later runs:
the 2,000-event book with the default geometric sampler (1,999 chapters,
504k tokens: the audit's book), the 4,000-event book with the uniform one
(the geometric sampler has only ~2,320 distinct events in the default
universe; uniform gives 3,992 chapters, 1.01M tokens). The 4,000-event
book's standard selection has 354 questions; its 2N case takes 686 of the
book's questions selected 10 per (template, bin) instead of 5.

    python benchmarks/memory_bench.py [--cases 2000:312,2000:623,4000:343,4000:686]

Prints, per case: the book's size in MB and tokens, the questions, the RSS
after loading the book and building its questions (the baseline), the peak
RSS of the whole run and the wall time.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ARTIFACTS = ROOT / "benchmarks" / "artifacts"
BOOKS = {2000: ("memory-book-2000", []), 4000: ("memory-book-4000", ["--uniform"])}
GOAL_MB = 600


def book_folder(events: int) -> Path:
    """The book of `events` events, written by builtin:writer once (not timed)."""
    name, options = BOOKS[events]
    folder = ARTIFACTS / name
    if not (folder / "book.json").is_file():
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        print(f"writing the {events}-event book into {folder} (once; not timed) ...", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "engine.cli", "--quiet", "--cache", str(Path(tmp) / "gen.sqlite"),
                            "generate", "--events", str(events), *options, "--model", "builtin:writer",
                            "--out", str(folder)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return folder


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def questions_of(book: object, n: int) -> list:
    from engine.benchmark.evaluation import pipeline
    from engine.benchmark.evaluation import questions as Q

    chosen = Q.build_questions(book)  # type: ignore[arg-type]
    if n > len(chosen):  # more than the standard selection: 10 per (template, bin)
        candidates = Q.non_empty_candidates(book.chapters, len(book.events)) + Q.empty_candidates(book)  # type: ignore[attr-defined]
        chosen = Q.select(Q.dedupe(candidates), per_group=10)
    if n > len(chosen):
        raise SystemExit(f"the book has only {len(chosen)} questions")
    return pipeline.sample_questions(chosen, n)


async def child(folder: str, n: int) -> dict[str, float]:
    from engine.benchmark.evaluation import pipeline
    from engine.benchmark.generation.published import load_book
    from engine.config import Config
    from engine.scheduler import Engine

    book = load_book(folder)
    questions = questions_of(book, n)
    baseline = peak_rss_mb()
    config = Config.load()
    jobs = pipeline.plan_jobs(questions, ["builtin:reader"], ["in-context"])
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        async with Engine(config, cache_path=str(Path(tmp) / "cache.sqlite")) as engine:
            ev = await pipeline.evaluate(engine, config, book, questions, jobs, judge="builtin:judge")
        wall = time.perf_counter() - start
    answered = sum(r.answer is not None for r in ev.records)
    return {"book_mb": len(book.text.encode()) / 1e6, "tokens": book.n_tokens, "questions": len(questions),
            "answered": answered, "baseline_mb": baseline, "peak_mb": peak_rss_mb(), "wall": wall}


def run_case(events: int, n: int) -> dict[str, float]:
    folder = book_folder(events)
    out = subprocess.run([sys.executable, __file__, "--child", str(folder), str(n)], cwd=ROOT, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="2000:312,2000:623,4000:343,4000:686",
                        help="EVENTS:QUESTIONS,... (default %(default)s)")
    parser.add_argument("--child", nargs=2, metavar=("BOOK", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args.child[0], int(args.child[1])))))
        return
    print(f"in-context, builtin:reader + builtin:judge, fresh cache; goal: peak <= {GOAL_MB} MB, flat in questions")
    print(f"{'events':>6} {'book MB':>7} {'tokens':>9} {'questions':>9} {'after load MB':>13} "
          f"{'peak RSS MB':>11} {'wall s':>7}")
    for case in args.cases.split(","):
        events, n = (int(x) for x in case.split(":"))
        r = run_case(events, n)
        print(f"{events:>6} {r['book_mb']:>7.1f} {r['tokens']:>9,} {r['questions']:>9} {r['baseline_mb']:>13.0f} "
              f"{r['peak_mb']:>11.0f} {r['wall']:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
