"""The `tulving` command line.

    tulving [--config PATH] [--cache PATH] [--quiet] [--max-cost USD] COMMAND ...

This module builds the parser (the global options) and runs a command. The
command modules (engine/cli/: tools, bench, cache, generate, evaluate, batches,
data) each expose `register(subparsers)`, adding subcommands whose handler is
`handler(args) -> int`; handlers build engines with
`engine.cli.common.open_engine(args)`. Only the named command's module is
imported: `tulving --help` lists the commands from the table of
engine/cli/commands.py, so that it, --version and a usage error answer without
loading numpy, scipy, aiohttp or the SDKs (tests/test_startup.py).

User errors (a bad config, an unknown model, a missing key or file) print one
line, `tulving: error: ...`, and exit 2; other fatal provider errors exit 1;
the other exit codes (incomplete runs, --max-cost, storage, Ctrl-C, SIGTERM)
are listed in engine/errors.py. Global options may come before or after the
command. SIGTERM stops like Ctrl-C (engines close, the cache is flushed),
whether or not SIGINT is ignored (engine/cli/lifecycle.py).
"""
from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from cache.location import split_password
from engine.cli import lifecycle
from engine.cli.argtypes import non_negative_float
from engine.cli.commands import COMMANDS, module_of
from engine.cli.config_file import cache_notes, choose_cache, default_cache, default_config
from engine.cli.lifecycle import Terminated

# engine.errors and providers.base are imported where an error is handled:
# --help and --version need neither (nor the providers package they load).

# -- parser and entry point ---------------------------------------------------------------

class _VersionAction(argparse.Action):
    """--version: the installed version, read only when asked for (engine.__version__)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[object] | None, option_string: str | None = None) -> None:
        from engine import __version__

        print(f"tulving {__version__}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose "invalid choice" (a mistyped command, action
    or option value) names the closest choice first; the subcommands' parsers
    are of this class too (add_subparsers builds them with the parent's)."""

    def _check_value(self, action: argparse.Action, value: object) -> None:
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            from engine.errors import did_you_mean  # only on the way to an error

            guess = did_you_mean(value, map(str, action.choices or ())) if isinstance(value, str) else ""
            if not guess:
                raise
            choices = ", ".join(map(repr, action.choices or ()))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}: {guess} (choose from {choices})"
                                         ) from exc


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of the global options and every command. `command`'s module
    registers its commands in full; every other command is a placeholder
    (its name and help, for `tulving --help` and the list of choices)."""
    parser = _Parser(
        prog="tulving",
        description="Episodic Memory Benchmark for LLMs: generate books, evaluate models, at high throughput.",
        epilog="Configuration: a TOML file of [endpoints.*] and [models.*] merged over the built-in defaults "
               "(see `tulving config check`). API keys are read from the environment variables the "
               "endpoints name.")
    parser.add_argument("--config", metavar="PATH", default=os.environ.get("TULVING_CONFIG"),
                        help=f"TOML config (default: $TULVING_CONFIG, else ./tulving.toml, else {default_config()} "
                             "when it exists, else built-in defaults; `tulving config init` writes a starter)")
    parser.add_argument("--cache", metavar="PATH",
                        help="response cache: a SQLite file, or a postgresql://user@host/db URL shared by "
                             "processes and machines (default: $TULVING_CACHE, else the config's [cache] url, "
                             f"else {default_cache()})")
    parser.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    parser.add_argument("--version", action=_VersionAction, help="print the installed version and exit")
    parser.add_argument("--max-cost", metavar="USD", type=non_negative_float,
                        help="send no new call once the run's spending would exceed this")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = module_of(command)
    for entry in COMMANDS:
        if entry.module != chosen:
            sub.add_parser(entry.name, help=entry.help, add_help=False)
        elif entry.name not in sub.choices:  # the module's first command: it registers all of its own
            importlib.import_module(entry.module).register(sub)
    return parser


def parse(argv: list[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace, list[str]]:
    """(parser, args, unparsed) of `argv`. A first pass over the placeholders
    finds the command (and answers --help, --version and usage errors of the
    global options); then the command's module parses its options."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    command = getattr(args, "command", None)
    if command is not None:
        parser = build_parser(command)
        args, extra = parser.parse_known_args(argv)
    return parser, args, extra


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _fail(message: str, code: int) -> int:
    """Print one error line (control characters escaped: it may quote a
    server, a file name or model output) and return `code`."""
    from engine.errors import printable

    _print_err(f"tulving: error: {' '.join(printable(message).split())}")
    return code


def _print_err(line: str) -> None:
    try:
        print(line, file=sys.stderr)
    except (OSError, ValueError):  # stderr gone: nothing left to tell
        pass


_GLOBAL_VALUED = ("--config", "--cache", "--max-cost")
_CALLING_COMMANDS = ("run", "generate", "finetune", "bench")  # commands that fill the response cache
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


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Stop like Ctrl-C: a running command coroutine has its main task
    cancelled (engines close, the cache is flushed: engine/cli/lifecycle.py);
    synchronous code gets a KeyboardInterrupt."""
    if not lifecycle.terminate():
        raise Terminated()


_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _os_error(exc: OSError) -> int:
    name = exc.filename or ""
    what = exc.strerror or str(exc)
    where = f"{name}: " if name else ""
    from engine.errors import EXIT_STORAGE, EXIT_USAGE

    code = EXIT_STORAGE if exc.errno in _STORAGE_ERRNOS else EXIT_USAGE
    return _fail(f"{where}{what}", code)


def main(argv: Sequence[str] | None = None) -> int:
    lifecycle.reset()
    argv = hoist_global_options(sys.argv[1:] if argv is None else argv)
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if _in_main_thread() else None
    try:
        return _main(argv)
    except KeyboardInterrupt:
        terminated = lifecycle.terminating()
        kept = lifecycle.kept_line()
        _print_err(("tulving: terminated" if terminated else "tulving: interrupted") + (f": {kept}" if kept else ""))
        from engine.errors import EXIT_INTERRUPTED, EXIT_TERMINATED

        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    except BrokenPipeError:  # `tulving ... | head`: the reader left; exit quietly
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        from engine.errors import EXIT_PIPE

        return EXIT_PIPE
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _password_apart(args: argparse.Namespace) -> None:
    """A `--cache postgresql://user:PASSWORD@host/db`: the password moves to
    $PGPASSWORD (where the driver reads it), so that no message, log, run.json
    or report can show it: everything else sees the URL without it."""
    cache = getattr(args, "cache", None)
    if not isinstance(cache, str):
        return
    url, password = split_password(cache)
    if password is not None:
        os.environ["PGPASSWORD"] = password
        args.cache = url


def _main(argv: list[str]) -> int:
    parser, args, extra = parse(argv)
    if getattr(args, "command", None) == "serve-loopback":  # its options belong to the server
        args.server_args = extra + args.server_args
    elif extra:
        from engine.errors import printable

        parser.error(f"unrecognized arguments: {' '.join(printable(x) for x in extra)}")
    if getattr(args, "func", None) is None:
        return _usage(parser)
    from engine.errors import EXIT_USAGE
    from providers.base import TulvingError

    try:
        choose_cache(args)
    except TulvingError as exc:  # a bad config file or [cache] section: one line
        return _fail(str(exc), getattr(exc, "exit_code", EXIT_USAGE))
    _password_apart(args)
    args.cache_from_env = bool(os.environ.get("TULVING_CACHE"))
    notes = cache_notes(args) if getattr(args, "command", None) in _CALLING_COMMANDS else []
    try:
        return _run_command(args)
    finally:  # said once the command has used the cache: never before a usage error
        if notes and os.path.exists(args.cache):
            for note in notes:
                _print_err(f"note: {note}")


def _run_command(args: argparse.Namespace) -> int:
    """The command's exit code, its errors as one line and the code that tells them apart."""
    from engine.errors import EXIT_FAILED, EXIT_USAGE
    from providers.base import AUTH, CONFIG, ProviderError, TulvingError

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
