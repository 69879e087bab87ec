"""What every command module shares: the config and engine from the global
options, and the `--dry-run` count.

The command modules (engine/commands/*.py) import these from here, below
engine/cli.py, which only builds the parser and runs a command.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from typing import Any

from cache.store import ResponseCache
from engine.config import Config
from engine.requests import Request
from engine.resolve import resolve
from engine.scheduler import Engine

DEFAULT_CACHE = os.path.join("runs", "cache.sqlite")


def load_config(args: argparse.Namespace) -> Config:
    """The config named by --config / TULVING_CONFIG, else the built-in defaults."""
    return Config.load(getattr(args, "config", None))


def open_engine(args: argparse.Namespace, **kwargs: Any) -> Engine:
    """An engine from the global options (use as `async with open_engine(args) as engine`)."""
    return Engine(load_config(args), cache_path=getattr(args, "cache", None) or None,
                  progress=not getattr(args, "quiet", False), max_cost=getattr(args, "max_cost", None),
                  batch=bool(getattr(args, "batch", False)), **kwargs)


async def dry_run_report(config: Config, cache_path: str | os.PathLike[str] | None,
                         requests: Iterable[Request]) -> tuple[int, int]:
    """(requests, how many of them the cache already holds), calling nothing.
    Raises ConfigError for an unknown model alias."""
    total = cached = 0
    cache = None
    if cache_path is not None and os.path.exists(cache_path):
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
