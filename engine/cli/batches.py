"""`tulving batches`: the provider batches runs on this cache submitted
(`--batch`), as the cache file's batch ledger records them;
`tulving batches cancel ID` asks the provider to cancel one.

A batch is listed while it still owes keys (results not yet in the cache);
`--all` lists every recorded batch.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime
from typing import TYPE_CHECKING

from cache.location import is_postgres_url
from engine.cli import lifecycle
from engine.cli.commands import command_help
from engine.cli.config_file import load_config
from engine.errors import printable
from providers.base import ProviderError, TulvingError
from providers.kinds import open_batch_api

if TYPE_CHECKING:
    from cache.backend import BatchLedgerStore
    from cache.batches import LedgerBatch  # its module opens SQLite and loads numpy: not for --help


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("batches", help=command_help("batches"),
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--all", action="store_true", help="also batches whose results are all in the cache")
    p.add_argument("--refresh", action="store_true",
                   help="ask each batch's provider for its current state first (needs the config and keys)")
    p.set_defaults(func=cmd_list)
    sub = p.add_subparsers(dest="batches_command", metavar="ACTION")
    c = sub.add_parser("cancel", help="ask the provider to cancel a batch (its finished lines are kept)")
    c.add_argument("batch_id", metavar="ID")
    c.set_defaults(func=cmd_cancel)


def _age(iso: str) -> str:
    try:
        seconds = time.time() - datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return "?"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _counts(batch: LedgerBatch) -> str:
    return " ".join(f"{k}={v}" for k, v in batch.counts.items() if v) or "-"


def _ledger(args: argparse.Namespace) -> BatchLedgerStore | None:
    path = getattr(args, "cache", None)
    if not path or not (is_postgres_url(path) or os.path.exists(path)):
        return None
    from cache.backend import open_ledger

    return open_ledger(path)


async def _refresh(args: argparse.Namespace, ledger: BatchLedgerStore, batches: list[LedgerBatch]) -> None:
    """Poll each listed batch's provider and record what it says; a batch
    that cannot be polled keeps its last seen state (said on stderr)."""
    config = load_config(args)
    for batch in batches:
        spec = config.endpoints.get(batch.endpoint)
        if spec is None or batch.id.startswith("pending:"):
            continue
        try:
            api = open_batch_api(spec, config.api_key(spec))
            try:
                info = await api.poll(batch.id)
            finally:
                await api.aclose()
        except (TulvingError, ProviderError) as exc:  # a missing key, a dead server
            print(f"tulving: {batch.id}: not refreshed ({printable(exc)})", file=sys.stderr)
            continue
        await ledger.update(batch.id, info.status, dict(info.counts))


async def _list(args: argparse.Namespace) -> list[LedgerBatch]:
    ledger = _ledger(args)
    if ledger is None:
        return []
    try:
        batches = await ledger.batches(owing_only=not args.all)
        if args.refresh and batches:
            await _refresh(args, ledger, batches)
            batches = await ledger.batches(owing_only=not args.all)
        return batches
    finally:
        ledger.close()


def cmd_list(args: argparse.Namespace) -> int:
    batches = lifecycle.run_briefly(_list(args))
    if not batches:
        print("no pending batches" if not args.all else "no batches recorded")
        return 0
    rows = [("id", "endpoint", "model", "state", "requests", "owed", "counts", "age")]
    for b in batches:
        rows.append((b.id, b.endpoint, b.model or "-", b.state, str(b.requests), str(b.owed), _counts(b),
                     _age(b.submitted_at)))
    widths = [max(len(printable(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(printable(cell).ljust(w) for cell, w in zip(row, widths)).rstrip())
    if any(b.owed for b in batches):
        print("(owed: results not in the cache yet; rerun the command that submitted them to collect them)")
    return 0


async def _cancel(args: argparse.Namespace) -> str:
    ledger = _ledger(args)
    if ledger is None:
        raise TulvingError(f"no batch {args.batch_id!r} in the cache {args.cache} (no such file)")
    try:
        found = [b for b in await ledger.batches() if b.id == args.batch_id]
        if not found:
            raise TulvingError(f"no batch {args.batch_id!r} recorded in the cache {args.cache} "
                               f"(`tulving batches --all` lists them)")
        batch = found[0]
        config = load_config(args)
        spec = config.endpoints.get(batch.endpoint)
        if spec is None:
            raise TulvingError(f"batch {batch.id} was sent to endpoint {batch.endpoint!r}, which the config "
                               f"no longer declares")
        api = open_batch_api(spec, config.api_key(spec))
        try:
            info = await api.cancel(batch.id)
        finally:
            await api.aclose()
        await ledger.update(batch.id, info.status, dict(info.counts))
        return f"batch {info.id} on {batch.endpoint}: {info.status}"
    finally:
        ledger.close()


def cmd_cancel(args: argparse.Namespace) -> int:
    print(printable(lifecycle.run_briefly(_cancel(args))))
    return 0
