"""The engine's own tools: `models`, `config check`, `serve-loopback` and
`bench-latency`."""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import fields

from engine.commands import probe
from engine.commands.common import load_config
from engine.loopback import cli as loopback_cli
from engine.requests import ChatRequest, EmbedRequest
from engine.scheduler import Engine
from providers.base import TulvingError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("models", help="list model aliases, their endpoints and whether keys are set")
    p.add_argument("--probe", action="store_true",
                   help="send one minimal request per remote endpoint whose key is set (or none needed) and "
                        "show the rate limits its reply reports (without it, nothing is sent)")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("config", help="configuration tools")
    config_sub = p.add_subparsers(dest="config_command", metavar="ACTION")
    check = config_sub.add_parser("check", help="validate the config and print it merged (no secrets)")
    check.set_defaults(func=_cmd_config_check)
    p.set_defaults(func=lambda args: _usage(p))

    p = sub.add_parser("serve-loopback", add_help=False,
                       help="serve the OpenAI/Anthropic APIs on loopback, to try the engine without keys "
                            "(options: see `tulving serve-loopback --help`)")
    p.add_argument("server_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_serve_loopback)

    p = sub.add_parser("bench-latency", help="measure a model's latency: N small uncached calls, p50/p90/p99",
                       description="Send N small prompts to a model alias, bypassing the cache, and print "
                                   "latency percentiles, throughput and errors.")
    p.add_argument("--model", required=True, help="model alias (see `tulving models`)")
    p.add_argument("-n", type=int, default=50, help="number of calls (default %(default)s)")
    p.add_argument("-c", "--concurrency", type=int, default=1, help="calls in flight (default %(default)s)")
    p.add_argument("--max-tokens", type=int, default=16, help="reply length cap (default %(default)s)")
    p.add_argument("--embed", action="store_true", help="probe the embeddings API instead of chat")
    p.set_defaults(func=_cmd_bench_latency)


def _cmd_models(args: argparse.Namespace) -> int:
    config = load_config(args)
    rows = [("alias", "endpoint", "model", "kind", "key set")]
    for name in sorted(config.models):
        alias = config.models[name]
        for ep_name in alias.endpoints:
            ep = config.endpoints[ep_name]
            key = "-" if not ep.key_env else ("yes" if os.environ.get(ep.key_env) else f"no ({ep.key_env})")
            rows.append((name, ep_name, alias.model, ep.kind, key))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return asyncio.run(probe.probe_all(config)) if args.probe else 0


def _cmd_config_check(args: argparse.Namespace) -> int:
    config = load_config(args)
    print(f"# config: {config.source} (valid)")
    for name in sorted(config.endpoints):
        ep = config.endpoints[name]
        print(f"[endpoints.{name}]")
        for f in fields(ep):
            value = getattr(ep, f.name)
            if f.name == "name" or value is None or (f.name == "options" and not value):
                continue
            if f.name == "key_env":  # the variable's name only, never its value
                value = f"{value} ({'set' if os.environ.get(value) else 'not set'})"
            print(f"{f.name} = {value!r}")
        print()
    for name in sorted(config.models):
        alias = config.models[name]
        print(f"[models.{name}]")
        print(f"endpoints = {list(alias.endpoints)!r}")
        print(f"model = {alias.model!r}")
        if alias.params:
            print(f"params = {dict(alias.params)!r}")
        for attr in ("price_in", "price_out", "context_tokens"):
            if getattr(alias, attr) is not None:
                print(f"{attr} = {getattr(alias, attr)!r}")
        if alias.reasoning:
            print("reasoning = true")
        print()
    return 0


def _cmd_serve_loopback(args: argparse.Namespace) -> int:
    return loopback_cli.main(args.server_args)


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


async def _bench_latency(args: argparse.Namespace) -> int:
    config = load_config(args)
    alias = config.alias(args.model)
    nonce = uuid.uuid4().hex[:8]  # fresh prompts: no server-side cache either
    embed = config.endpoints_of(alias)[0].kind == "local-embed" or args.embed

    def requests() -> Iterator[ChatRequest | EmbedRequest]:
        for i in range(args.n):
            if embed:
                yield EmbedRequest(model=args.model, texts=[f"latency probe {nonce} {i}"])
            else:
                yield ChatRequest(model=args.model, max_tokens=args.max_tokens,
                                  messages=[{"role": "user", "content": f"Reply with one word. ({nonce} {i})"}])

    latencies: list[float] = []
    errors: dict[str, int] = {}
    start = time.perf_counter()
    # No cache: every probe is a real call. The window bounds concurrency.
    async with Engine(config, cache_path=None, progress=not args.quiet, window=args.concurrency) as engine:
        async for outcome in engine.stream(requests(), total=args.n, label=f"bench {args.model}"):
            result, error = outcome.result, outcome.error
            if result is not None:
                latencies.append(result.latency)
            elif error is not None:
                errors[str(error.kind)] = errors.get(str(error.kind), 0) + 1
    wall = time.perf_counter() - start
    latencies.sort()
    print(f"model {args.model} ({alias.model} on {', '.join(alias.endpoints)}): {args.n} calls, "
          f"concurrency {args.concurrency}, {wall:.2f} s")
    if latencies:
        print(f"latency p50 {_percentile(latencies, .5) * 1000:.1f} ms  p90 {_percentile(latencies, .9) * 1000:.1f} ms"
              f"  p99 {_percentile(latencies, .99) * 1000:.1f} ms  mean {statistics.fmean(latencies) * 1000:.1f} ms")
    print(f"throughput {len(latencies) / wall:.1f} calls/s")
    print(f"errors {sum(errors.values())}" + (f" {errors}" if errors else ""))
    return 0 if latencies else 1


def _cmd_bench_latency(args: argparse.Namespace) -> int:
    if args.n < 1 or args.concurrency < 1:
        raise TulvingError("-n and --concurrency must be at least 1")
    return asyncio.run(_bench_latency(args))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2
