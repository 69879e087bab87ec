"""`tulving bench` (alias `bench-latency`): latency and throughput of models
under a chosen load, the metric set of vLLM's `bench serve`.

    tulving bench --models gpt-6-luna,claude-sonnet-5-5 --rate 4 --arrival poisson -n 200 --slo ttft=500ms
    tulving bench --models llama-70b --sweep concurrency=1,4,16,64 --duration 30 --plots bench/
    tulving bench-latency --model gpt-4o-mini -n 50     # the old command: 50 calls, one at a time

Every request goes through the engine (rate limits, the endpoint's queue and
retries apply), streamed, never read from the cache (nor written to it
without `--store`). The load, the prompts, the figures and the output are in
engine/benchmark/latency/ (load, prompts, runner, metrics, report, plots). Models run
one after another, each over every load point, so they never share the
machine's client or a server; a model's warm-up requests run before its
first point and are not measured.

Option values are checked before anything is sent; a bad one is one line and
exit 2. Exit 1 when a run completed no request at all.
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from engine.benchmark.evaluation.answers import FINETUNED, IN_CONTEXT
from engine.benchmark.latency import load as load_shapes
from engine.benchmark.latency.load import LoadPoint
from engine.benchmark.latency.metrics import DEFAULT_PERCENTILES, parse_percentiles, parse_slo
from engine.cli import lifecycle
from engine.cli.argtypes import add_allow_unpriced
from engine.cli.commands import command_help
from engine.cli.config_file import load_config
from engine.errors import printable
from providers.base import TulvingError

if TYPE_CHECKING:
    from engine.benchmark.latency.prompts import PromptSet
    from engine.benchmark.latency.report import BenchRun
    from engine.config import Config
    from engine.requests import Request

# The engine, the prompts and the report are imported once the options are
# checked and the config read: `--help` and a bad option or config answer
# before they load (tests/test_startup.py).
BOOK_MODES = (IN_CONTEXT, FINETUNED)  # engine/benchmark/latency/prompts.py's, without loading it

_DESCRIPTION = """\
Latency and throughput of models under a chosen load: TTFT, TPOT, ITL, E2E
(mean, median, std, min, max, percentiles), goodput under SLOs, peaks, and
the client's own cost. Requests go through the engine (rate limits, queue,
retries), streamed, never answered from the cache.

examples:
  tulving bench --models gpt-6-luna,claude-sonnet-5-5 --rate 4 -n 200 --slo ttft=500ms,tpot=50ms
  tulving bench --models llama-70b --sweep concurrency=1,4,16,64 --duration 30 --plots bench/
  tulving bench --models m --rate 10 --arrival gamma:0.5 --json out.json --per-request --csv out.csv
  tulving bench --models m --book synaptic-echoes-short --mode in-context -n 50"""

DEFAULTS = {  # (bench, bench-latency)
    "n": (100, 50), "max_concurrency": (None, 1), "output_tokens": (64, 16), "warmup": (1, 0),
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("bench", help=command_help("bench"),
                       description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _options(p)
    p = sub.add_parser("bench-latency", help=command_help("bench-latency"))
    _options(p)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", "--model", dest="models", metavar="M1,M2",
                   help="model aliases (see `tulving models`), compared in one table")
    add_allow_unpriced(p)
    load = p.add_argument_group("load")
    load.add_argument("-n", "--requests", dest="n", metavar="N", help="requests per load point (default 100)")
    load.add_argument("--duration", metavar="S", help="send for S seconds per load point instead of -n")
    load.add_argument("--rate", default="inf", metavar="inf|R", help="requests per second (default inf: all at once)")
    load.add_argument("--arrival", default="poisson", metavar="poisson|gamma:B|constant",
                      help="inter-arrival times at a finite rate (gamma:B, B<1 burstier; default poisson)")
    load.add_argument("--seed", default="0", help="seed of the arrival times (default 0)")
    load.add_argument("--max-concurrency", "-c", "--concurrency", dest="max_concurrency", metavar="C",
                      help="requests in flight at most (with --rate inf: a closed loop of C)")
    load.add_argument("--warmup", metavar="N",
                      help="unmeasured requests per model first (default 1: the first call loads the token counter "
                           "and opens a connection)")
    load.add_argument("--sweep", metavar="rate=R1,R2|concurrency=C1,C2",
                      help="one measurement per rate or per concurrency (overrides --rate / --max-concurrency)")
    prompts = p.add_argument_group("prompts")
    prompts.add_argument("--input-tokens", default="256", metavar="N", help="synthetic prompt length (default 256)")
    prompts.add_argument("--output-tokens", "--max-tokens", dest="output_tokens", metavar="N",
                         help="max_tokens of each reply (default 64)")
    prompts.add_argument("--ignore-eos", action="store_true",
                         help="send ignore_eos (vLLM, SGLang): replies run to --output-tokens")
    prompts.add_argument("--book", metavar="NAME|PATH", help="send the book's benchmark questions instead")
    prompts.add_argument("--mode", default="in-context", help=f"with --book: {' or '.join(BOOK_MODES)}")
    prompts.add_argument("--no-stream", action="store_true", help="do not stream (no TTFT, ITL or TPOT)")
    prompts.add_argument("--store", action="store_true", help="write the replies to the cache (never read)")
    prompts.add_argument("--embed", action="store_true", help="probe the embeddings API instead of chat")
    out = p.add_argument_group("output")
    out.add_argument("--percentiles", default="50,90,95,99", help="percentiles to report (default 50,90,95,99)")
    out.add_argument("--slo", metavar="ttft=500ms,tpot=50ms,e2e=10s", help="goodput: requests meeting all of these")
    out.add_argument("--json", metavar="PATH", help="write the summary as JSON")
    out.add_argument("--per-request", action="store_true", help="with --json: one row per request too")
    out.add_argument("--csv", metavar="PATH", help="write one row per model and load point as CSV")
    out.add_argument("--plots", metavar="DIR", help="write latency/throughput vs load and the TTFT CDF (PNG, SVG)")
    p.set_defaults(func=_cmd_bench)


def _int(value: str | None, option: str, minimum: int) -> int | None:
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        raise TulvingError(f"{option}: not an integer: {value!r}") from None
    if n < minimum:
        raise TulvingError(f"{option} must be at least {minimum}, got {n}")
    return n


class BenchPlan(TypedDict):
    """The checked options of a latency benchmark."""
    models: list[str]
    points: list[LoadPoint]
    sweep: tuple[str, list[float]] | None  # (what varies, its values)
    warmup: int | None
    input_tokens: int
    output_tokens: int
    percentiles: list[float]
    slo: dict[str, float]


def _plan(args: argparse.Namespace) -> BenchPlan:
    """Every option checked and parsed, before anything is sent."""
    alias = args.command == "bench-latency"

    def default(name: str) -> int | None:
        return DEFAULTS[name][1 if alias else 0]

    models = _models(args.models)
    duration = _duration(args)
    n = None if duration is not None else (_int(args.n, "-n", 1) or default("n"))
    concurrency = _int(args.max_concurrency, "--max-concurrency", 1)
    if concurrency is None:
        concurrency = default("max_concurrency")
    rate = load_shapes.parse_rate(args.rate)
    sweep = load_shapes.parse_sweep(args.sweep) if args.sweep else None
    base = LoadPoint(rate=rate, arrival=load_shapes.parse_arrival(args.arrival), max_concurrency=concurrency,
                     requests=n, duration=duration, seed=_int(args.seed, "--seed", 0) or 0)
    planned = load_shapes.points(base, sweep)
    if any(p.duration is not None and math.isinf(p.rate) and not p.max_concurrency for p in planned):
        raise TulvingError("--duration at --rate inf needs --max-concurrency (a closed loop)")
    output_tokens = _int(args.output_tokens, "--output-tokens", 1) or default("output_tokens")
    assert output_tokens is not None  # DEFAULTS gives both commands one
    return {
        "models": models, "points": planned, "sweep": sweep,
        "warmup": default("warmup") if args.warmup is None else _int(args.warmup, "--warmup", 0),
        "input_tokens": _int(args.input_tokens, "--input-tokens", 1) or 0,  # argparse's default: never None
        "output_tokens": output_tokens,
        "percentiles": parse_percentiles(args.percentiles) if args.percentiles else list(DEFAULT_PERCENTILES),
        "slo": parse_slo(args.slo) if args.slo else {},
    }


def _models(text: str | None) -> list[str]:
    if not text:
        raise TulvingError("--models is required (model aliases, comma-separated; see `tulving models`)")
    models = [m.strip() for m in text.split(",") if m.strip()]
    if not models:
        raise TulvingError("--models: expected a comma-separated list of model aliases")
    return models


def _duration(args: argparse.Namespace) -> float | None:
    """--duration in seconds (None: not given); -n and --duration exclude each other."""
    if args.duration is not None and args.n is not None:
        raise TulvingError("give -n or --duration, not both")
    if args.duration is None:
        return None
    duration = load_shapes.parse_rate(args.duration, "--duration")  # a positive finite number
    if math.isinf(duration):
        raise TulvingError("--duration must be a finite number of seconds")
    return duration


def _check_models(config: Config, models: list[str], max_cost: float | None) -> None:
    """Unknown, retired or (under --max-cost) unpriced aliases and missing
    keys stop the command before any call."""
    config.check_callable(models, max_cost=max_cost)
    for name in models:
        alias = config.alias(name)
        for endpoint in config.endpoints_of(alias):
            config.api_key(endpoint)


def _factory(args: argparse.Namespace, model: str, prompts: PromptSet | None, output_tokens: int, nonce: str,
             embed: bool) -> Callable[[int], Request]:
    """The model's requests, each new (a counter over warm-up and every point)."""
    from engine.requests import ChatRequest, EmbedRequest

    counter = itertools.count()
    extra = {"ignore_eos": True} if args.ignore_eos else None

    def make(_: int) -> Request:
        k = next(counter)
        if embed or prompts is None:
            return EmbedRequest(model=model, texts=[f"latency probe {nonce} {k}"])
        return ChatRequest(model=model, messages=prompts.messages(k), max_tokens=output_tokens, extra=extra,
                           stream=not args.no_stream, cache_read=False, cache_write=args.store)
    return make


def _client_concurrency(point: LoadPoint) -> int:
    """Requests the client may hold in flight at once (0: set by the rate, unknown)."""
    if point.max_concurrency:
        return point.max_concurrency
    return point.requests or 0 if math.isinf(point.rate) else 0


def _load_average() -> float:
    """The machine's 1-minute load average: figures on shared cores move with it."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else math.nan


def _note(args: argparse.Namespace, line: str) -> None:
    if not args.quiet:
        print(line, file=sys.stderr, flush=True)


async def _bench(args: argparse.Namespace, plan: BenchPlan, config: Config, prompts: PromptSet | None
                 ) -> list[BenchRun]:
    from engine.benchmark.latency.metrics import summarize
    from engine.benchmark.latency.report import BenchRun
    from engine.benchmark.latency.runner import run_point
    from engine.scheduler import Engine
    from providers.kinds import kind_of

    nonce = uuid.uuid4().hex[:8]
    runs: list[BenchRun] = []
    cache_path = args.cache if args.store else None  # no cache at all unless asked: nothing is ever read
    async with Engine(config, cache_path=cache_path, progress=False, max_cost=args.max_cost) as engine:
        for model in plan["models"]:
            alias = config.alias(model)
            caps = kind_of(config.endpoints_of(alias)[0]).capabilities
            embed = args.embed or (caps.embeddings and not caps.chat)
            make = _factory(args, model, None if embed else prompts, plan["output_tokens"], nonce, embed)
            slots = sum(ep.max_concurrency for ep in config.endpoints_of(alias))
            wanted = max(_client_concurrency(p) for p in plan["points"])
            if wanted > slots:
                _note(args, f"note: {printable(model)}'s endpoints allow {slots} calls in flight (max_concurrency in "
                            f"the config); the rest wait in the engine's queue (the 'queued' row)")
            if plan["warmup"]:
                first = plan["points"][0]
                await run_point(engine, make, LoadPoint(requests=plan["warmup"], max_concurrency=first.max_concurrency))
            for point in plan["points"]:
                run = await run_point(engine, make, point)
                summary = summarize(run.records, duration=run.duration, percentiles=plan["percentiles"],
                                    slo=plan["slo"])
                assert run.client is not None
                runs.append(BenchRun(model=model, point=point, summary=summary, client=run.client,
                                     records=run.records))
                _note(args, f"bench {printable(model)} {point.label}: {summary.completed}/{summary.requests} ok "
                            f"in {summary.duration:.2f} s")
    return runs


def _cmd_bench(args: argparse.Namespace) -> int:
    plan = _plan(args)
    config = load_config(args)
    from engine.benchmark.latency.prompts import book_questions, synthetic
    from engine.benchmark.latency.report import console, slo_text, to_csv, to_json
    from engine.cli.common import check_models

    check_models(config, args, plan["models"])  # retired, unpriced: one line before any call
    _check_models(config, plan["models"], getattr(args, "max_cost", None))
    prompts: PromptSet | None = None
    if not args.embed:
        if args.book:
            prompts = book_questions(args.book, args.mode)
        else:
            prompts = synthetic(plan["input_tokens"], uuid.uuid4().hex[:8])
    for path in (args.json, args.csv):  # unwritable output fails before the calls, not after
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8"):
                pass
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    load_before = _load_average()
    runs = lifecycle.run(_bench(args, plan, config, prompts))  # SIGTERM stops it as Ctrl-C does
    load_avg = _load_average()
    if args.embed:
        what, stream = "embeddings", "not streamed"
    else:
        assert prompts is not None
        what = f"{prompts.describe}, max_tokens {plan['output_tokens']}"
        stream = "not streamed" if args.no_stream else "streamed where the endpoint can"
    cache = "never read from the cache, replies stored" if args.store else "no cache"
    print(f"tulving bench: {what}, {stream}, {cache}; machine load average {load_before:.2f} at the start, "
          f"{load_avg:.2f} at the end, {os.cpu_count()} cores")
    if plan["slo"]:
        print(f"SLO: {slo_text(plan['slo'])}")
    print(console(runs, plan["percentiles"]))
    settings = {"started_at": started_at, "models": plan["models"], "prompts": what,
                "max_tokens": None if args.embed else plan["output_tokens"], "stream": stream,
                "store": args.store, "warmup": plan["warmup"], "percentiles": plan["percentiles"],
                "slo": plan["slo"], "sweep": list(plan["sweep"]) if plan["sweep"] else None,
                "load_average_start": load_before, "load_average_end": load_avg, "cpus": os.cpu_count()}
    if args.json:
        Path(args.json).write_bytes(to_json(runs, settings, per_request=args.per_request))
    if args.csv:
        Path(args.csv).write_text(to_csv(runs), encoding="utf-8")
    if args.plots:
        from engine.benchmark.latency.plots import all_figures  # matplotlib only when asked

        all_figures(Path(args.plots), runs, max(plan["percentiles"]))
    return 1 if any(r.summary.completed == 0 for r in runs) else 0
