"""`tulving run` and the cache's spending ledger (cache/spending_ledger.py):
what `--max-cost` counts as spent already, and the dry run's line about it.

Under `--max-cost-scope run` (the default) the budget starts from what every
earlier invocation of the same run paid: the ledger's total for the run's
key, whatever folder or machine it ran from; a run folder's run.json (older
runs, or a cache other than the one that paid) sets a floor. Under
`--max-cost-scope invocation` it starts from 0. Either way, this
invocation's spending joins the ledger as it is paid (engine/spending_feed.py).
"""
from __future__ import annotations

import argparse

from cache.backend import open_spending_ledger
from cache.spending_ledger import RunSpending
from engine.benchmark.evaluation.run_record import spent_before
from engine.cli.common import cache_exists


async def ledger_total(cache: str | None, run: str) -> RunSpending:
    """What the ledger of `cache` holds for `run` (zeros without a cache)."""
    if not cache_exists(cache):
        return RunSpending(run=run)
    assert cache is not None  # it exists
    ledger = open_spending_ledger(cache)
    try:
        return await ledger.ledger_total(run)
    finally:
        ledger.close()


async def spending_before(args: argparse.Namespace) -> float:
    """USD `--max-cost` counts as spent before this invocation."""
    return await ledger_spent_before(args, args.run_key, floor=spent_before(args.previous))


async def ledger_spent_before(args: argparse.Namespace, run: str, *, floor: float = 0.0) -> float:
    """What earlier invocations of `run` paid, by the ledger of args' cache
    (at least `floor`), under `--max-cost-scope run`; 0 under `invocation`.
    `tulving run` and `tulving generate` both count it this way."""
    if getattr(args, "max_cost_scope", "run") != "run":
        return 0.0
    if getattr(args, "max_cost", None) is None:  # nothing reads it: the ledger is not asked
        return floor
    recorded = await ledger_total(getattr(args, "cache", None), run)
    return max(recorded.spent_usd, floor)


async def dry_run_line(args: argparse.Namespace) -> str:
    """What the ledger holds for this run, to print beside the estimate."""
    recorded = await ledger_total(getattr(args, "cache", None), args.run_key)
    if not recorded.invocations:
        return "spending ledger: nothing spent on this run yet (in this cache)"
    counted = ("--max-cost counts it" if args.max_cost_scope == "run"
               else "--max-cost-scope invocation: --max-cost does not count it")
    return (f"spending ledger: this run already spent ${recorded.spent_usd:.4f} on {recorded.calls} calls in "
            f"{recorded.invocations} invocation{'s' if recorded.invocations != 1 else ''} ({counted})")


def label(book: str, models: list[str] | None) -> str:
    """The run as `tulving cache spending` lists it."""
    return f"{book}: {','.join(models) if models else 'default run'}"
