"""What every command module shares: the config and engine from the global
options, and the `--dry-run` count.

The command modules (engine/cli/*.py) import these from here, below
engine/cli/main.py, which only builds the parser and runs a command.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from cache.backend import ResponseStore, is_postgres_url, open_cache
from engine.batching_mode import batch_endpoint
from engine.cli import lifecycle
from engine.cli.config_file import LOCAL_CONFIG as LOCAL_CONFIG
from engine.cli.config_file import cache_notes as cache_notes
from engine.cli.config_file import choose_cache as choose_cache
from engine.cli.config_file import config_path as config_path
from engine.cli.config_file import default_cache as default_cache
from engine.cli.config_file import default_config as default_config
from engine.cli.config_file import load_config as load_config
from engine.config import Config, ConfigError
from engine.estimate import ESTIMATE_NOTE, Estimator
from engine.requests import Request
from engine.resolve import resolve
from engine.scheduler import Engine


def cache_exists(location: str | os.PathLike[str] | None) -> bool:
    """Whether there is a cache to read at `location`: a SQLite file that
    exists, or any PostgreSQL URL (its database is checked when opened)."""
    return location is not None and (is_postgres_url(location) or os.path.exists(location))


def check_models(config: Config, args: argparse.Namespace, names: Iterable[str]) -> None:
    """Before any work: unknown aliases stop the command; so do retired models,
    unpriced ones under --max-cost, and unpriced ones without --allow-unpriced
    (one line: nothing would count or bound what they cost). A dry run calls
    nothing: it prices retired models too, and says they are retired.
    `args.unpriced` keeps the unpriced names for the summary."""
    names = [n for n in dict.fromkeys(names) if n]
    unpriced = [n for n in names if not config.alias(n).priced and not config.is_free(config.alias(n))]
    if getattr(args, "dry_run", False):
        for name in names:
            line = config.retirement(config.alias(name))
            if line is not None:
                print(f"note: {line}", file=sys.stderr)
    else:
        config.check_callable(names, max_cost=getattr(args, "max_cost", None))
    if unpriced and not getattr(args, "allow_unpriced", False):
        raise ConfigError(f"{unpriced[0]} has no known price, so nothing would count or bound what it costs: give "
                          f"it price_in and price_out (USD per million tokens) under [models.NAME] of your config, "
                          f"or pass --allow-unpriced to count its calls as $0")
    for name in unpriced:
        print(f"note: {name} has no known price (--allow-unpriced): its calls are counted as $0", file=sys.stderr)
    args.unpriced = unpriced


def unpriced_line(args: argparse.Namespace) -> str | None:
    """The summary's reminder of the models counted as $0 (--allow-unpriced)."""
    names = getattr(args, "unpriced", None)
    return f"unpriced, counted as $0 (--allow-unpriced): {', '.join(names)}" if names else None


def open_engine(args: argparse.Namespace, config: Config | None = None, **kwargs: Any) -> Engine:
    """An engine from the global options (use as `async with open_engine(args) as engine`),
    on `config` when the command has already loaded (and adjusted) it.
    A PostgreSQL cache keeps results the database could not take in a spill
    file next to the run's output (--out), unless $TULVING_SPILL_DIR says where."""
    cache = getattr(args, "cache", None)
    out = getattr(args, "out", None)
    if isinstance(cache, str) and is_postgres_url(cache) and isinstance(out, str) and out:
        os.environ.setdefault("TULVING_SPILL_DIR", out)
    return lifecycle.watch(Engine(config or load_config(args), cache_path=getattr(args, "cache", None) or None,
                                  progress=not getattr(args, "quiet", False), max_cost=getattr(args, "max_cost", None),
                                  batch=bool(getattr(args, "batch", False)), **kwargs))


async def dry_run_report(config: Config, cache_path: str | os.PathLike[str] | None,
                         requests: Iterable[Request], *, by_batch: Counter[str] | None = None) -> tuple[int, int]:
    """(requests, how many of them the cache already holds), calling nothing.
    `by_batch`: counts the uncached requests `--batch` would send through a
    provider batch API, by endpoint (engine.batching_mode.batch_endpoint).
    Raises ConfigError for an unknown model alias."""
    total = cached = 0
    cache: ResponseStore | None = None
    if cache_exists(cache_path):
        assert cache_path is not None  # it exists
        cache = open_cache(cache_path)
        await cache.open()
    try:
        batch: list[str] = []
        routes: dict[str, str] = {}  # key -> batch endpoint

        async def flush() -> int:
            found = await cache.get_many(batch) if cache is not None else {}
            hits = sum(1 for k in batch if k in found)
            if by_batch is not None:
                by_batch.update(routes[k] for k in batch if k not in found and k in routes)
                routes.clear()
            batch.clear()
            return hits

        for request in requests:
            resolved = resolve(config, request)
            batch.append(resolved.key)
            if by_batch is not None and (endpoint := batch_endpoint(resolved)) is not None:
                routes[resolved.key] = endpoint
            total += 1
            if len(batch) >= 1000:
                cached += await flush()
        cached += await flush()
    finally:
        if cache is not None:
            await cache.close()
    return total, cached


async def dry_run_estimate(config: Config, cache_path: str | os.PathLike[str] | None,
                           fill: Callable[[Estimator], Awaitable[None]]) -> Estimator:
    """An `Estimator` filled by `fill` (which adds each role's requests), with
    the cache at `cache_path` (if it exists) telling which calls are already
    made. Calls nothing."""
    cache: ResponseStore | None = None
    if cache_exists(cache_path):
        assert cache_path is not None  # it exists
        cache = open_cache(cache_path)
        await cache.open()
    try:
        estimator = Estimator(config, cache)
        await fill(estimator)
    finally:
        if cache is not None:
            await cache.close()
    return estimator


def print_estimate(estimator: Estimator, *, assumptions_below: bool = False) -> None:
    """The estimator's table by model and role; its assumptions in a sentence,
    unless the command prints them below as a table (`tulving run --dry-run`)."""
    if assumptions_below:
        print("cost estimate by model and role, before any call (worst case: every reply at its max_tokens; "
              "assumptions below):")
    else:
        print(f"cost estimate, before any call ({ESTIMATE_NOTE}):")
    print(estimator.table())
    total = estimator.totals()
    if total.prefix_tokens:
        print(f"prompt caching's expected saving where prompts share a prefix: "
              f"${total.direct_usd - total.cached_direct_usd:.4f} direct, "
              f"${total.batch_usd - total.cached_batch_usd:.4f} by batch")
