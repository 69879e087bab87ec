"""`tulving cache stats | explain | prune | export | import | check | recover | copy | spending`: the
cache (global `--cache PATH`) seen from the command line. See cache/admin.py,
cache/copy.py for `copy` (any two backends: SQLite files, postgresql:// URLs)
and cache/spending_ledger.py for `spending` (either backend). A PostgreSQL
cache takes `copy`, `export`, `import` and `spending`; the other commands
read SQLite files (copy the database into one first)."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from cache.location import is_postgres_url, redact
from engine.cli import lifecycle
from engine.cli.commands import command_help
from providers.base import TulvingError

if TYPE_CHECKING:
    from types import ModuleType

    from engine.requests import ChatRequest, EmbedRequest



def _admin() -> ModuleType:
    """cache/admin.py, loaded by the subcommand that uses it (`tulving cache
    --help` answers without it: tests/test_startup.py)."""
    from cache import admin

    return admin


_CHAT_FIELDS = {"model", "messages", "temperature", "max_tokens", "seed", "stop", "extra", "draw"}
_EMBED_FIELDS = {"model", "texts"}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("cache", help=command_help("cache"),
                                   description="Inspect and maintain the response cache (--cache PATH).")
    commands = parser.add_subparsers(dest="cache_command", metavar="COMMAND", required=True)

    p = commands.add_parser("stats", help="entries by op and model, chunks, file size, oldest/newest")
    p.set_defaults(func=_damage_is_one_line(_stats))

    p = commands.add_parser("explain", help="why a request misses: the nearest cached entry and what differs",
                            description='REQUEST is a JSON file (or - for stdin) like {"model": "gpt-4o", '
                                        '"messages": [...], "temperature": 1.0, "max_tokens": 4096, "draw": 0} '
                                        'or {"model": "text-embedding-3-small", "texts": [...]}.')
    p.add_argument("request", nargs="?", help="request JSON file, or - for stdin")
    p.add_argument("--key", help="show the entry with this key instead")
    p.add_argument("--full", action="store_true", help="with --key: do not shorten long texts and vectors")
    p.set_defaults(func=_damage_is_one_line(_explain))

    p = commands.add_parser("prune", help="delete old entries or a model's entries, orphaned chunks, then VACUUM")
    p.add_argument("--older-than", type=float, metavar="DAYS", help="entries cached more than DAYS days ago")
    p.add_argument("--model", action="append", default=[], metavar="NAME",
                   help="entries of this model (a config alias or the provider's model name); repeatable")
    p.set_defaults(func=_damage_is_one_line(_prune))

    p = commands.add_parser("export", help="write the cache as JSON Lines (chunks, then entries)")
    p.add_argument("path", help="output file, or - for stdout")
    p.set_defaults(func=_damage_is_one_line(_export))

    p = commands.add_parser("check", help="read every entry and compare it with its checksum (exit 5 if damaged)")
    p.set_defaults(func=_damage_is_one_line(_check))

    p = commands.add_parser("recover", help="copy the readable, undamaged entries of a damaged cache into a new file")
    p.add_argument("--out", metavar="PATH", help="the new cache file (default: PATH.recovered)")
    p.set_defaults(func=_damage_is_one_line(_recover))

    p = commands.add_parser("import", help="merge an export into the cache (existing keys are kept)")
    p.add_argument("path", help="export file, or - for stdin")
    p.set_defaults(func=_damage_is_one_line(_import))

    p = commands.add_parser("copy", help="copy every entry of one cache into another (SQLite files or "
                                         "postgresql:// URLs), checksums verified, with its batch and spending "
                                         "ledgers; idempotent",
                            description="Copy every entry of SRC into DST (each a SQLite file or a postgresql:// "
                                        "URL; DST is created if missing). Keys DST holds are kept. Entries whose "
                                        "checksum or chunks are wrong are left out and counted. The batch ledger "
                                        "(batches not yet collected) and the spending ledger (what --max-cost "
                                        "counts) go along; a ledger row DST holds is kept unless SRC's is newer.")
    p.add_argument("source", metavar="SRC")
    p.add_argument("target", metavar="DST")
    p.set_defaults(func=_damage_is_one_line(_copy))

    p = commands.add_parser("spending", help="the spending ledger: what each run cost, over all its invocations "
                                             "(what --max-cost counts)")
    p.set_defaults(func=_damage_is_one_line(_spending))


def _damage_is_one_line(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A cache command over a file SQLite cannot read through: one line naming
    the file and what to do, not a traceback."""
    import functools
    import sqlite3

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except sqlite3.DatabaseError as exc:
            from cache.store import damaged

            raise damaged(getattr(args, "cache", "") or "the cache", exc) from None

    return run


def _location(args: argparse.Namespace) -> str:
    path = getattr(args, "cache", None)
    if not path:
        raise TulvingError("no cache file given: pass --cache PATH")
    return str(path)


def _cache(args: argparse.Namespace) -> str:
    """The SQLite file the command works on; a PostgreSQL URL is refused in one line."""
    path = _location(args)
    if is_postgres_url(path):
        raise TulvingError(f"`tulving cache {args.cache_command}` reads a SQLite cache file, not {redact(path)}: "
                           f"copy the database into one first (`tulving cache copy {redact(path)} FILE.sqlite`)")
    return path


def _copy(args: argparse.Namespace) -> int:
    from cache.copy import copy_cache

    report = lifecycle.run_briefly(copy_cache(args.source, args.target))
    print(report.format())
    return 0


def _through_sqlite(args: argparse.Namespace, work: Callable[[str], int]) -> int:
    """`export` / `import` on a PostgreSQL cache: through a temporary SQLite copy."""
    import tempfile

    from cache.copy import copy_cache

    url = _location(args)
    with tempfile.TemporaryDirectory(prefix="tulving-cache-") as folder:
        local = str(Path(folder) / "cache.sqlite")
        if args.cache_command == "export":
            lifecycle.run_briefly(copy_cache(url, local))
            return work(local)
        code = work(local)
        lifecycle.run_briefly(copy_cache(local, url))
        return code


def _check(args: argparse.Namespace) -> int:
    from engine.errors import EXIT_STORAGE

    report = _admin().check(_cache(args))
    print(report.format())
    return 0 if report.ok else EXIT_STORAGE


def _recover(args: argparse.Namespace) -> int:
    path = _cache(args)
    report = _admin().recover(path, args.out or f"{path}.recovered")
    print(report.format())
    return 0


def _stats(args: argparse.Namespace) -> int:
    print(_admin().format_stats(_admin().stats(_cache(args))))
    return 0


def _explain(args: argparse.Namespace) -> int:
    if args.key:
        print(_admin().show_entry(_cache(args), args.key, full=args.full))
        return 0
    if not args.request:
        raise TulvingError("cache explain needs a REQUEST file (or -), or --key KEY")
    from engine.config import Config
    from engine.resolve import resolve

    request = parse_request(_read_json(args.request))
    resolved = resolve(Config.load(getattr(args, "config", None)), request)
    print(_admin().explain(_cache(args), resolved.identity).format())
    return 0


def parse_request(data: object) -> ChatRequest | EmbedRequest:
    """A ChatRequest or EmbedRequest from the JSON form `explain` takes."""
    from engine.requests import ChatRequest, EmbedRequest

    if not isinstance(data, dict) or not isinstance(data.get("model"), str):
        raise TulvingError('a request must be a JSON object with a "model" alias')
    if "texts" in data:
        unknown = set(data) - _EMBED_FIELDS
        if unknown:
            raise TulvingError(f"unknown field(s) {sorted(unknown)} in an embedding request "
                               f"(allowed: {sorted(_EMBED_FIELDS)})")
        texts = data["texts"]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise TulvingError('"texts" must be a list of strings')
        return EmbedRequest(model=data["model"], texts=texts)
    unknown = set(data) - _CHAT_FIELDS
    if unknown:
        raise TulvingError(f"unknown field(s) {sorted(unknown)} in a chat request (allowed: {sorted(_CHAT_FIELDS)})")
    messages = data.get("messages")
    if (not isinstance(messages, list) or not messages
            or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                       for m in messages)):
        raise TulvingError('"messages" must be a non-empty list of {"role": ..., "content": ...} objects')
    draw = data.get("draw", 0)
    if not isinstance(draw, int) or isinstance(draw, bool) or draw < 0:
        raise TulvingError(f'"draw" must be a non-negative integer, got {draw!r}')
    return ChatRequest(model=data["model"], messages=messages, temperature=data.get("temperature"),
                       max_tokens=data.get("max_tokens"), seed=data.get("seed"), stop=data.get("stop"),
                       extra=data.get("extra"), draw=draw)


def _read_json(source: str) -> object:
    if source == "-":
        raw = sys.stdin.buffer.read()
    else:
        try:
            raw = Path(source).read_bytes()
        except OSError as exc:
            raise TulvingError(f"cannot read {source}: {exc.strerror}") from None
    import orjson

    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TulvingError(f"{source} is not valid JSON: {exc}") from None


def _prune(args: argparse.Namespace) -> int:
    models = set(args.model)
    if args.model:  # an alias stands for its provider model name
        from engine.config import Config

        config = Config.load(getattr(args, "config", None))
        models |= {config.models[name].model for name in args.model if name in config.models}
    report = _admin().prune(_cache(args), older_than_days=args.older_than, models=sorted(models))
    print(report.format())
    return 0


def _export(args: argparse.Namespace) -> int:
    if is_postgres_url(_location(args)):
        return _through_sqlite(args, lambda local: _export_file(local, args))
    return _export_file(_cache(args), args)


def _export_file(path: str, args: argparse.Namespace) -> int:
    counts = _admin().export_jsonl(path, args.path)
    if args.path != "-":
        print(f"exported {counts['entries']:,} entries and {counts['blobs']:,} chunks to {args.path}")
    return 0


def _import(args: argparse.Namespace) -> int:
    if is_postgres_url(_location(args)):
        return _through_sqlite(args, lambda local: _import_file(local, args))
    return _import_file(_cache(args), args)


def _import_file(path: str, args: argparse.Namespace) -> int:
    counts = _admin().import_jsonl(path, args.path)
    print(f"imported {counts['imported']:,} entries ({counts['skipped']:,} already cached, skipped) "
          f"and {counts['blobs']:,} new chunks")
    return 0


def _spending(args: argparse.Namespace) -> int:
    """Every run the ledger knows: its key, what it is, USD, calls, invocations, last update."""
    from cache.backend import open_spending_ledger
    from cache.spending_ledger import RunSpending
    from engine.errors import printable

    location = _location(args)
    if not is_postgres_url(location) and not Path(location).is_file():
        raise TulvingError(f"no cache file at {location}")
    async def read() -> list[RunSpending]:
        ledger = open_spending_ledger(location)
        try:
            return await ledger.runs()
        finally:
            ledger.close()  # in the loop: a PostgreSQL pool ends with its loop

    runs = lifecycle.run_briefly(read())
    if not runs:
        print("no spending recorded in this cache")
        return 0
    rows = [("run", "spent", "calls", "invocations", "last", "what")]
    rows += [(r.run[:12], f"${r.spent_usd:.4f}", str(r.calls), str(r.invocations), r.updated_at[:19], r.label)
             for r in runs]
    widths = [max(len(printable(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(printable(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    print(f"total: ${sum(r.spent_usd for r in runs):.4f} over {len(runs)} run{'s' if len(runs) != 1 else ''}")
    return 0
