"""Where the config and the response cache are, and loading the config: what
`tulving --help` shows as defaults and what a command reads first.

Kept apart from engine/cli/common.py (which builds engines) so that the
parser, and a config error, need nothing heavier than the standard library:
`tulving --help` and `tulving run --config bad.toml` answer at once.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.config import Config

# Where the response cache lived before it moved to the user's cache directory:
# an existing one in the working directory is still used, so nobody loses it.
LEGACY_CACHE = os.path.join("runs", "cache.sqlite")


def _xdg(variable: str, fallback: str) -> Path:
    value = os.environ.get(variable)
    return Path(value) if value and os.path.isabs(value) else Path.home() / fallback


def default_cache() -> str:
    """The response cache without --cache / TULVING_CACHE: ./runs/cache.sqlite when
    it exists (the old default), else $XDG_CACHE_HOME/tulving/cache.sqlite
    (~/.cache/tulving/cache.sqlite), shared by every working directory."""
    if os.path.exists(LEGACY_CACHE):
        return LEGACY_CACHE
    return str(_xdg("XDG_CACHE_HOME", ".cache") / "tulving" / "cache.sqlite")


def default_config() -> Path:
    """Where `tulving config init` writes, and the config read without
    --config / TULVING_CONFIG when it exists: $XDG_CONFIG_HOME/tulving/config.toml."""
    return _xdg("XDG_CONFIG_HOME", ".config") / "tulving" / "config.toml"


LOCAL_CONFIG = "tulving.toml"  # a project's config, read from the working directory


def config_path(args: argparse.Namespace) -> str | os.PathLike[str] | None:
    """The config file named by --config / TULVING_CONFIG, else ./tulving.toml
    (the project's, in the working directory), else the user's
    (`default_config()`) when there is one, else None (the built-in defaults)."""
    path: str | os.PathLike[str] | None = getattr(args, "config", None)
    if path is None and Path(LOCAL_CONFIG).is_file():
        path = LOCAL_CONFIG
    if path is None and default_config().is_file():
        path = default_config()
    return path


def load_config(args: argparse.Namespace) -> Config:
    """The config of `config_path`, merged over the built-in defaults."""
    from engine.config import Config  # standard library and providers.kinds only: still light

    return Config.load(config_path(args))


def choose_cache(args: argparse.Namespace) -> None:
    """Set `args.cache`: --cache, else $TULVING_CACHE, else the config file's
    [cache] url, else `default_cache()`. A config URL's password comes from
    the variable its `password_env` names, moved to $PGPASSWORD (where the
    driver reads it, with ~/.pgpass or $PGPASSFILE as the fallback)."""
    from cache.location import is_postgres_url
    from engine.config import Config

    if getattr(args, "cache", None):
        return
    args.cache = os.environ.get("TULVING_CACHE") or ""
    if args.cache:
        return
    path = config_path(args)
    section = Config.cache_section(path) if path is not None else None
    if section is None or section.url is None:
        args.cache = default_cache()
        return
    args.cache = section.url
    password = section.password() if is_postgres_url(section.url) else None
    if password is not None:
        os.environ["PGPASSWORD"] = password


def cache_notes(args: argparse.Namespace) -> list[str]:
    """What to tell the user of the default cache: where a new one goes (once:
    until it exists), or that the old ./runs/cache.sqlite is still used."""
    cache = getattr(args, "cache", None)
    if not cache or cache != default_cache() or getattr(args, "cache_from_env", False):
        return []
    if cache == LEGACY_CACHE:
        return [f"using {LEGACY_CACHE} (found in this folder) as the response cache; new runs elsewhere use "
                f"{_xdg('XDG_CACHE_HOME', '.cache') / 'tulving' / 'cache.sqlite'}: move it there to share it"]
    if not os.path.exists(cache):
        return [f"the response cache is {cache} (shared by every folder; --cache or TULVING_CACHE to change it)"]
    return []
