"""The `tulving` command line.

    tulving [--config PATH] [--cache PATH] [--quiet] [--max-cost USD] COMMAND ...

This module builds the parser (the global options) and runs a command. The
command modules (engine/commands/: tools, cache, generate, evaluate) each
expose `register(subparsers)`, adding subcommands whose handler is
`handler(args) -> int`; handlers build engines with
`engine.commands.common.open_engine(args)`.

User errors (a bad config, an unknown model, a missing key or file) print one
line, `tulving: error: ...`, and exit 2; other fatal provider errors exit 1;
Ctrl-C exits 130.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Sequence

from engine.commands.argtypes import non_negative_float
from engine.commands import cache as cache_commands
from engine.commands import evaluate, generate, tools
from engine.commands.common import DEFAULT_CACHE
from engine.errors import TulvingError
from providers.base import AUTH, CONFIG, ProviderError

COMMAND_MODULES = (tools, cache_commands, generate, evaluate)


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

    for module in COMMAND_MODULES:
        module.register(sub)
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
    print(f"tulving: error: {' '.join(message.split())}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "command", None) == "serve-loopback":  # its options belong to the server
        args.server_args = extra + args.server_args
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if getattr(args, "func", None) is None:
        return _usage(parser)
    _install_uvloop()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("tulving: interrupted", file=sys.stderr)
        return 130
    except TulvingError as exc:
        return _fail(str(exc), getattr(exc, "exit_code", 2))
    except ProviderError as exc:
        return _fail(str(exc), 2 if exc.kind in (AUTH, CONFIG) else 1)
    except FileNotFoundError as exc:
        return _fail(f"file not found: {exc.filename or exc}", 2)


if __name__ == "__main__":
    sys.exit(main())
