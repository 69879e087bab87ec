"""The `tulving` command line.

    tulving [--config PATH] [--cache PATH] [--quiet] [--max-cost USD] COMMAND ...

Command modules (cache/command.py, engine/generation/command.py,
engine/evaluation/command.py) each expose `register(subparsers)`, adding
subcommands whose handler is `handler(args) -> int`; handlers build engines
with `open_engine(args)` and may use `dry_run_report` for `--dry-run`. This
module adds `models`, `config check`, `serve-loopback` and `bench-latency`.

User errors (a bad config, an unknown model, a missing key or file) print one
line, `tulving: error: ...`, and exit 2; other fatal provider errors exit 1;
the other exit codes (incomplete runs, --max-cost, storage, Ctrl-C, SIGTERM)
are listed in engine/errors.py. Global options may come before or after the
command. SIGTERM stops like Ctrl-C (engines close, the cache is flushed).
"""
from __future__ import annotations

import argparse
import asyncio
import errno
import importlib
import os
import signal
import statistics
import sys
import time
import uuid
from dataclasses import fields
from typing import Any, Iterable, Sequence

from engine.config import Config
from engine.errors import (EXIT_FAILED, EXIT_INTERRUPTED, EXIT_PIPE, EXIT_STORAGE, EXIT_TERMINATED, EXIT_USAGE,
                           TulvingError, printable)
from engine.argtypes import non_negative_float
from engine.requests import ChatRequest, EmbedRequest, Request
from engine.resolve import resolve
from engine.scheduler import Engine
from providers.base import AUTH, CONFIG, ProviderError

DEFAULT_CACHE = os.path.join("runs", "cache.sqlite")
COMMAND_MODULES = ("cache.command", "engine.generation.command", "engine.evaluation.command")


# -- helpers for command modules ----------------------------------------------------------

def load_config(args: argparse.Namespace) -> Config:
    """The config named by --config / TULVING_CONFIG, else the built-in defaults."""
    return Config.load(getattr(args, "config", None))


def open_engine(args: argparse.Namespace, **kwargs: Any) -> Engine:
    """An engine from the global options (use as `async with open_engine(args) as engine`)."""
    return Engine(load_config(args), cache_path=getattr(args, "cache", None) or None,
                  progress=not getattr(args, "quiet", False), max_cost=getattr(args, "max_cost", None),
                  **kwargs)


async def dry_run_report(config: Config, cache_path: str | os.PathLike | None,
                         requests: Iterable[Request]) -> tuple[int, int]:
    """(requests, how many of them the cache already holds), calling nothing.
    Raises ConfigError for an unknown model alias."""
    total = cached = 0
    cache = None
    if cache_path is not None and os.path.exists(cache_path):
        from cache.store import ResponseCache

        cache = ResponseCache(cache_path)
        await cache.open()
    try:
        batch: list[str] = []

        async def flush() -> int:
            found = await cache.get_many(batch) if cache is not None else {}
            hits = sum(1 for k in batch if k in found)
            batch.clear()
            return hits

        for request in requests:
            batch.append(resolve(config, request).key)
            total += 1
            if len(batch) >= 1000:
                cached += await flush()
        cached += await flush()
    finally:
        if cache is not None:
            await cache.close()
    return total, cached


# -- built-in subcommands ------------------------------------------------------------------

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
    return 0


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
    from providers import loopback_server

    return loopback_server.main(args.server_args)


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

    def requests():
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
            if outcome.ok:
                latencies.append(outcome.result.latency)
            else:
                errors[outcome.error.kind] = errors.get(outcome.error.kind, 0) + 1
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


# -- parser and entry point ---------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tulving",
        description="Episodic Memory Benchmark for LLMs: generate books, evaluate models, at high throughput.",
        epilog="Configuration: a TOML file of [endpoints.*] and [models.*] merged over the built-in defaults "
               "(see `tulving config check`). API keys are read from the environment variables the "
               "endpoints name.")
    parser.add_argument("--config", metavar="PATH", default=os.environ.get("TULVING_CONFIG"),
                        help="TOML config (default: $TULVING_CONFIG, else built-in defaults)")
    parser.add_argument("--cache", metavar="PATH", default=os.environ.get("TULVING_CACHE", DEFAULT_CACHE),
                        help="response cache, SQLite (default: $TULVING_CACHE, else %(default)s)")
    parser.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    parser.add_argument("--max-cost", metavar="USD", type=non_negative_float,
                        help="send no new call once the run's spending would exceed this")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("models", help="list model aliases, their endpoints and whether keys are set")
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

    for name in COMMAND_MODULES:  # every one is part of the CLI: a failed import is a broken install
        importlib.import_module(name).register(sub)
    return parser


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _fail(message: str, code: int) -> int:
    """Print one error line (control characters escaped: it may quote a
    server, a file name or model output) and return `code`."""
    _print_err(f"tulving: error: {' '.join(printable(message).split())}")
    return code


def _print_err(line: str) -> None:
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):  # stderr gone: nothing left to tell
        pass


_GLOBAL_VALUED = ("--config", "--cache", "--max-cost")
_GLOBAL_FLAGS = ("--quiet",)


def hoist_global_options(argv: Sequence[str]) -> list[str]:
    """Move the global options written after the command (`tulving run
    --cache X`) in front of it, where argparse expects them. What follows
    `serve-loopback` or `--` is left alone."""
    argv = list(argv)
    front: list[str] = []
    rest: list[str] = []
    i = 0
    seen_command = False
    while i < len(argv):
        token = argv[i]
        if token == "--" or token == "serve-loopback":
            rest.extend(argv[i:])
            break
        name = token.split("=", 1)[0]
        if seen_command and name in _GLOBAL_VALUED and "=" in token:
            front.append(token)
        elif seen_command and token in _GLOBAL_VALUED and i + 1 < len(argv):
            front.extend(argv[i:i + 2])
            i += 1
        elif seen_command and token in _GLOBAL_FLAGS:
            front.append(token)
        else:
            if not token.startswith("-") and not (i > 0 and argv[i - 1] in _GLOBAL_VALUED):
                seen_command = True
            rest.append(token)
        i += 1
    return front + rest


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into the same orderly stop as Ctrl-C."""


_terminated = False


def _on_sigterm(signum: int, frame: Any) -> None:
    """Stop like Ctrl-C: inside asyncio.run, SIGINT cancels the main task, so
    engines close and the cache is flushed; elsewhere it raises KeyboardInterrupt."""
    global _terminated
    _terminated = True
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        os.kill(os.getpid(), signal.SIGINT)  # asyncio.Runner's handler cancels the main task
    else:
        raise Terminated()


_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _os_error(exc: OSError) -> int:
    name = exc.filename or ""
    what = exc.strerror or str(exc)
    where = f"{name}: " if name else ""
    code = EXIT_STORAGE if exc.errno in _STORAGE_ERRNOS else EXIT_USAGE
    return _fail(f"{where}{what}", code)


def main(argv: Sequence[str] | None = None) -> int:
    global _terminated
    _terminated = False
    argv = hoist_global_options(sys.argv[1:] if argv is None else argv)
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if _in_main_thread() else None
    try:
        return _main(argv)
    except KeyboardInterrupt:
        _print_err("tulving: terminated" if _terminated else "tulving: interrupted")
        return EXIT_TERMINATED if _terminated else EXIT_INTERRUPTED
    except BrokenPipeError:  # `tulving ... | head`: the reader left; exit quietly
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_PIPE
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "command", None) == "serve-loopback":  # its options belong to the server
        args.server_args = extra + args.server_args
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(printable(x) for x in extra)}")
    if getattr(args, "func", None) is None:
        return _usage(parser)
    _install_uvloop()
    try:
        return int(args.func(args) or 0)
    except TulvingError as exc:
        return _fail(str(exc), getattr(exc, "exit_code", EXIT_USAGE))
    except ProviderError as exc:
        return _fail(str(exc), EXIT_USAGE if exc.kind in (AUTH, CONFIG) else EXIT_FAILED)
    except FileNotFoundError as exc:
        return _fail(f"file not found: {exc.filename or exc}", EXIT_USAGE)
    except (KeyboardInterrupt, BrokenPipeError):
        raise
    except OSError as exc:
        return _os_error(exc)
    except UnicodeDecodeError as exc:
        return _fail(f"a file read is not UTF-8 text ({exc.reason} at byte {exc.start})", EXIT_USAGE)
    except RecursionError as exc:
        return _fail(f"input nested too deeply ({exc})", EXIT_USAGE)
    except Exception as exc:  # noqa: BLE001 -- a bug: one line, the traceback on request
        if os.environ.get("TULVING_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (set TULVING_DEBUG=1 for the traceback)",
                     EXIT_FAILED)


if __name__ == "__main__":
    sys.exit(main())
