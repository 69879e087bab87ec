"""`tulving generate` and `tulving book {stats,chrono,realism}`.

    tulving generate --universe default --events 200 --seed 0 --model claude-sonnet-5-5 --out books/mine
                     [--itermax 10] [--uniform] [--events-only] [--dry-run]

Every call goes through the engine's cache (global --cache), so a killed run
resumes where it stopped and a rerun rebuilds the identical book with zero
calls. `--events-only` writes events.json and meta_events.json without any
model call; `--dry-run` prints the plan and the first prompt and calls nothing.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.benchmark.generation.assemble import book_tokens, build_book
from engine.benchmark.generation.bookdir import MetaEvent, check_output_folder, write_book_dir, write_events
from engine.benchmark.generation.prompts import chapter_messages
from engine.benchmark.generation.published import load_book
from engine.benchmark.generation.secondary import secondary_names
from engine.benchmark.generation.stats import write_stats
from engine.benchmark.generation.universe import N_UNIVERSE, PUBLISHED_UNIVERSES, Universe, load_universe
from engine.cli import lifecycle
from engine.cli.argtypes import add_allow_unpriced, non_negative_int, positive_int
from engine.cli.commands import command_help
from engine.cli.config_file import load_config
from engine.errors import EXIT_INCOMPLETE, EXIT_STORAGE, printable
from providers.base import TulvingError

if TYPE_CHECKING:
    from engine.benchmark.generation.chapters import ChapterRun
    from engine.config import Config
    from engine.estimate import Estimator
    from engine.scheduler import Engine

# The chapters' generator (the engine), the events' sampler (numpy) and the
# estimate are imported by the handlers: `--help` and a bad option or config
# answer before they load (tests/test_startup.py).
ITERMAX_HELP = "candidates per event (default 10)"  # chapters.DEFAULT_ITERMAX: tests/test_startup.py checks it

# Events a universe can hold: the filter keeps one event per (date, entity) pair.
MAX_EVENTS = N_UNIVERSE * N_UNIVERSE
SLOW_EVENTS = 2_000                # above this, say how long sampling takes
CANDIDATES_PER_SECOND = 100_000    # measured: 2,000 events (6 million candidates) in ~20 s


class GenerationIncomplete(TulvingError):
    exit_code = EXIT_INCOMPLETE


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("generate", help=command_help("generate"),
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--universe", default="default",
                   help="default, news, scifi, or a universe JSON file (default %(default)s)")
    p.add_argument("--events", type=positive_int, default=200, help="number of events (default %(default)s)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="events seed (default %(default)s)")
    p.add_argument("--universe-seed", type=non_negative_int, default=0,
                   help="static universe seed (default %(default)s)")
    p.add_argument("--model", help="model alias writing and checking the chapters (e.g. builtin:writer)")
    p.add_argument("--out", help="book folder to write")
    p.add_argument("--name", help="book name (default: the folder name)")
    p.add_argument("--itermax", type=positive_int, help=ITERMAX_HELP)
    p.add_argument("--uniform", action="store_true", help="uniform instead of geometric item sampling")
    p.add_argument("--events-only", action="store_true", help="write events and meta-events only; no model call")
    p.add_argument("--dry-run", action="store_true", help="print the plan and the first prompt; call nothing")
    p.add_argument("--batch", action="store_true",
                   help="send uncached chat calls to openai/anthropic endpoints through their batch APIs "
                        "(half the price, results within 24 h); a killed run, rerun, resumes its batches")
    add_allow_unpriced(p)
    p.add_argument("--max-cost-scope", choices=["run", "invocation"], default="run",
                   help="what --max-cost bounds: the generation's whole spending, what earlier invocations of the "
                        "same generation (universe, seeds, events, model, itermax) paid through this cache included "
                        "(default; `tulving cache spending` lists it), or this invocation's alone")
    p.set_defaults(func=generate_handler)

    book = subparsers.add_parser("book", help=command_help("book"))
    book_sub = book.add_subparsers(dest="book_command", metavar="ACTION")
    s = book_sub.add_parser("stats", help="generation statistics of a book (printed, saved as stats.json)")
    s.add_argument("book", help="published book name or book folder")
    s.add_argument("--out", help="folder for stats.json (default: the book folder; a packaged book: printed only)")
    s.set_defaults(func=stats_handler)
    c = book_sub.add_parser("chrono", help="write the chronologically ordered variant of a book")
    c.add_argument("book", help="published book name or book folder")
    c.add_argument("--out", required=True, help="folder of the new book")
    c.set_defaults(func=chrono_handler)
    r = book_sub.add_parser("realism", help="rate each event's realism with an LLM judge (realism.json)")
    r.add_argument("book", help="published book name or book folder")
    r.add_argument("--model", required=True, help="judge model alias")
    r.add_argument("--out", help="file to write (default: <book folder>/realism.json)")
    add_allow_unpriced(r)
    r.set_defaults(func=realism_handler)

    def book_usage(args: argparse.Namespace) -> int:
        book.print_help(sys.stderr)
        return 2

    book.set_defaults(func=book_usage)


def _say(args: argparse.Namespace, message: str) -> None:
    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr)


def _open_engine(args: argparse.Namespace) -> Engine:
    from engine.cli.common import open_engine

    return open_engine(args)


# -- generate ----------------------------------------------------------------------------------
def generate_handler(args: argparse.Namespace) -> int:
    if args.events > MAX_EVENTS:
        raise TulvingError(f"--events {args.events:,}: a universe holds at most {MAX_EVENTS:,} events (one per "
                           f"date and entity of its {N_UNIVERSE} dates and {N_UNIVERSE} entities)")
    from engine.benchmark.generation.chapters import DEFAULT_ITERMAX, ChapterRequests
    from engine.benchmark.generation.events import n_candidates, sample_events, sample_meta_events
    from engine.cli.common import check_models, dry_run_estimate, print_estimate

    if args.itermax is None:
        args.itermax = DEFAULT_ITERMAX
    if args.events > SLOW_EVENTS and not args.quiet:
        _say(args, f"note: sampling {args.events:,} events draws up to {n_candidates(args.events):,} candidates "
                   f"(about {n_candidates(args.events) / CANDIDATES_PER_SECOND:,.0f} s on one core)")
    universe = load_universe(args.universe, seed=args.universe_seed)
    distribution = "uniform" if args.uniform else "geometric"
    events = sample_events(universe, args.events, seed_events=args.seed, distribution=distribution)
    metas = sample_meta_events(universe, len(events), seed_events=args.seed)
    if len(events) < args.events:
        _say(args, f"note: only {len(events)} distinct events could be sampled")
    styles = universe.spec.styles
    if args.dry_run:
        messages = chapter_messages(events[0], metas[0], styles[metas[0]["style"]], universe.name)
        print(f"universe {universe.name}, seed {args.seed}, {len(events)} events ({distribution})")
        if args.model:

            config = load_config(args)
            check_models(config, args, [args.model])  # a retired writer is priced, and said retired
            first = ChapterRequests(config, events, metas, styles, model=args.model, universe=universe.name)

            async def fill(estimator: Estimator) -> None:
                await estimator.add("write", (first.write(i, 0) for i in range(len(events))))

            estimator = lifecycle.run(dry_run_estimate(config, getattr(args, "cache", None), fill))
            total, cached = sum(r.calls for r in estimator.rows()), sum(r.cached for r in estimator.rows())
            print(f"model {args.model}: {total} first-candidate chapter calls ({cached} already cached), "
                  f"at most {2 * args.itermax * len(events)} calls in all (itermax {args.itermax})")
            print_estimate(estimator)
            print("(first candidates only: each rejected candidate and each LLM check adds a call)")
        print("first chapter prompt:\n")
        for m in messages:
            print(f"[{m['role']}]\n{m['content']}\n")
        return 0
    if not args.out:
        raise TulvingError("generate needs --out (the book folder to write)")
    out = Path(args.out)
    check_output_folder(out)  # before the first call, not after the last
    if args.events_only:
        write_events(out, events, metas)
        print(f"wrote {len(events)} events and meta-events to {out}")
        return 0
    if not args.model:
        raise TulvingError("generate needs --model (or --events-only / --dry-run)")
    check_models(load_config(args), args, [args.model])  # retired / unpriced: before any call
    return lifecycle.run(_generate(args, universe, events, metas, distribution, out))


async def _checked_config(args: argparse.Namespace) -> Config:
    """The config, its endpoints asked first under --batch whether they have a
    batch API (a vLLM or llama.cpp server has none: stop, or go direct when the
    endpoint says batch = "auto")."""
    config = load_config(args)
    if getattr(args, "batch", False):
        from engine.batching_mode import check_batch_apis

        for note in await check_batch_apis(config, [args.model]):
            print(f"note: {note}", file=sys.stderr)
    return config


def _universe_source(args: argparse.Namespace) -> str:
    """A published universe by name, a user's universe by absolute path (what load_universe takes)."""
    return args.universe if args.universe in PUBLISHED_UNIVERSES else str(Path(args.universe).resolve())


def generation_key(args: argparse.Namespace, distribution: str) -> str:
    """The generation in the cache's spending ledger: a digest of what makes
    its calls (the output folder and the name are not in it, so a rerun into
    another folder counts what the first one paid)."""
    import hashlib

    import orjson

    what = {"command": "generate", "universe": _universe_source(args), "universe_seed": args.universe_seed,
            "seed": args.seed, "events": args.events, "distribution": distribution, "model": args.model,
            "itermax": args.itermax}
    return hashlib.sha256(orjson.dumps(what, option=orjson.OPT_SORT_KEYS)).hexdigest()


async def _generate(args: argparse.Namespace, universe: Universe, events: list[dict[str, str]],
                    metas: list[MetaEvent], distribution: str, out: Path) -> int:
    from engine.benchmark.generation.chapters import ChapterGenerator
    from engine.cli.run_spending import ledger_spent_before
    from engine.scheduler import Engine

    start = time.perf_counter()
    config = await _checked_config(args)
    key = generation_key(args, distribution)
    # The engine's run-wide progress line: every round of draws counted on one line (off with --quiet).
    # What it pays goes to the cache's spending ledger as it is paid, so a killed and rerun
    # generation counts the first invocation's spending under --max-cost.
    engine = Engine(config, cache_path=getattr(args, "cache", None) or None, progress=not args.quiet,
                    max_cost=getattr(args, "max_cost", None), batch=bool(getattr(args, "batch", False)),
                    spent_before=await ledger_spent_before(args, key), spending_run=key,
                    spending_label=f"generate {out.name}: {args.model}")
    async with engine:
        generator = ChapterGenerator(engine, events, metas, universe.spec.styles, model=args.model,
                                     universe=universe.name, itermax=args.itermax)
        run = await generator.run()
    if not run.valid and run.call_errors:
        raise GenerationIncomplete(
            f"no chapter written: {args.model} could not be reached or failed on every call "
            f"({run.call_errors} calls failed; last: {run.last_error}); nothing was written to {out}")
    if not run.valid:  # the log of every candidate and why it failed is kept: the work is not lost
        out.mkdir(parents=True, exist_ok=True)
        (out / "generation_log.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in run.log))
        raise GenerationIncomplete(f"no chapter written: {printable(run.why_none_passed())}; try another --model "
                                   f"or a higher --itermax; why each candidate failed: {out / 'generation_log.jsonl'}")
    valid = {i: text for i, (_, text) in run.valid.items()}
    names = secondary_names(universe.spec.secondary_first_names, universe.spec.secondary_last_names)
    text, chapters = build_book(valid, events, metas, names)
    source = _universe_source(args)  # load_universe(book.universe) works
    metadata = {"name": args.name or out.name, "universe": source, "universe_name": universe.name,
                "seed": args.seed,
                "universe_seed": args.universe_seed, "n_events": len(events), "distribution": distribution,
                "model": args.model, "itermax": args.itermax, "n_chapters": len(chapters),
                "n_tokens": book_tokens(text), "failed_events": run.failed_events}
    write_book_dir(out, text=text, chapters=chapters, events=events, meta_events=metas, metadata=metadata,
                   log=run.log)
    book = load_book(out)  # re-reads and re-checks what was written
    _, report = write_stats(book, out)
    elapsed = time.perf_counter() - start
    _say(args, report)
    for line in run.spending.lines():
        _say(args, line)
    print(f"wrote {out}: {len(chapters)} chapters from {len(events)} events "
          f"({len(run.failed_events)} dropped), {metadata['n_tokens']} tokens; "
          f"{run.calls + run.cache_hits} calls ({run.cache_hits} cached), {elapsed:.1f} s")  # docs/reports.md's words
    return _exit_status(args, run, engine.stats.cache_write_errors)


def _exit_status(args: argparse.Namespace, run: ChapterRun, cache_write_errors: int) -> int:
    """0, or the exit status (said on stderr) of a book written with calls lost or replies not cached."""
    if cache_write_errors:
        print(f"tulving: error: {cache_write_errors} replies could not be stored in the cache "
              f"{getattr(args, 'cache', '')}: a rerun would pay for them again", file=sys.stderr)
        return EXIT_STORAGE
    if run.error_events:
        print(f"tulving: incomplete: {len(run.error_events)} events dropped because their calls failed "
              f"({run.call_errors} failed calls; last: {printable(run.last_error)}); rerun the same command "
              f"to retry them (finished calls are cached)", file=sys.stderr)
        return EXIT_INCOMPLETE
    return 0


# -- book ... --------------------------------------------------------------------------------------
def stats_handler(args: argparse.Namespace) -> int:
    """The book's statistics, printed; saved as stats.json (and positions.png)
    in --out, else in the book's folder; a published book (packaged, not a
    folder of the user's) with no --out is printed only."""
    from engine.benchmark.generation.stats import compute_stats, format_stats

    book = load_book(args.book)
    folder = Path(args.out) if args.out else book.path
    if folder is None:
        print(format_stats(compute_stats(book)))
        print(f"(not saved: {args.book} is a packaged book; --out DIR saves stats.json and positions.png there)")
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    stats, report = write_stats(book, folder)
    print(report)
    print(f"saved {folder / 'stats.json'}")
    return 0


def chrono_handler(args: argparse.Namespace) -> int:
    from engine.benchmark.generation.derived import chronological_book

    book = chronological_book(load_book(args.book))
    out = Path(args.out)
    write_book_dir(out, text=book.text, chapters=book.chapters, events=book.events,
                   meta_events=book.meta_events,
                   metadata={**book.metadata, "name": out.name, "n_chapters": book.n_chapters,
                             "n_tokens": book_tokens(book.text)})
    load_book(out)
    print(f"wrote {out}: {book.n_chapters} chapters in story order")
    return 0


def realism_handler(args: argparse.Namespace) -> int:
    from engine.benchmark.generation.derived import rate_realism
    from engine.cli.common import check_models

    book = load_book(args.book)
    check_models(load_config(args), args, [args.model])

    async def run() -> list[dict[str, Any]]:
        async with _open_engine(args) as engine:
            return await rate_realism(engine, book, args.model)

    rows = lifecycle.run(run())
    target = Path(args.out) if args.out else (book.path / "realism.json" if book.path else None)
    if target is None:
        raise TulvingError(f"{args.book} is a published book: give --out for realism.json")
    target.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    rated = [r["realism"] for r in rows if r["realism"] is not None]
    mean = sum(rated) / len(rated) if rated else float("nan")
    print(f"wrote {target}: {len(rated)}/{len(rows)} events rated, mean realism {mean:.2f}")
    return 0
