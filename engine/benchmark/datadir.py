"""Where the benchmark data lives.

The paper's published dataset ships inside the package (`engine/benchmark/data/`): the
three universes, the published books (`synaptic-echoes` and its first 20
events, `synaptic-echoes-short`) with their ground truth, and the published
leaderboard and F1 tables. A published name always means the packaged copy,
so a score made anywhere is computed on the same bytes.

A user's own universes and books are found by name under the user's data
folder (`universes/NAME.json`, `books/NAME/`), or by path. The data folder is
TULVING_DATA when set, else `$XDG_DATA_HOME/tulving` (default
`~/.local/share/tulving`): `tulving data fetch` / `import` install the rest of
the published release there (books/, runs/, release/: engine/benchmark/release/).
"""
from __future__ import annotations

import os
from pathlib import Path

from providers.base import TulvingError

ENV_VAR = "TULVING_DATA"
# Package data, installed with the code (a wheel unpacks it beside this file).
PACKAGED = Path(__file__).resolve().parent / "data"


class DataError(TulvingError):
    """A data folder or file that cannot be found."""


def data_dir() -> Path:
    """The packaged data: universes/, books/, published/."""
    return PACKAGED


def default_data_home() -> Path:
    """Where the user's data goes when TULVING_DATA is not set (XDG base directories)."""
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "share"
    return base / "tulving"


def data_home() -> Path:
    """The user's data folder to write to (created by the caller): TULVING_DATA
    when set, else the XDG one."""
    configured = os.environ.get(ENV_VAR)
    return Path(configured).expanduser() if configured else default_data_home()


def user_data_dir() -> Path | None:
    """The folder named by TULVING_DATA; when it is not set, the XDG data
    folder if it exists; else None."""
    configured = os.environ.get(ENV_VAR)
    if not configured:
        home = default_data_home()
        return home if home.is_dir() else None
    path = Path(configured).expanduser()
    if not path.is_dir():
        raise DataError(f"{ENV_VAR}={configured}: no such folder (it should hold universes/ and/or books/)")
    return path


def published_names(kind: str) -> tuple[str, ...]:
    """The names shipped with the package: kind is "universes" or "books"."""
    folder = PACKAGED / kind
    if kind == "universes":
        return tuple(sorted(p.stem for p in folder.glob("*.json")))
    return tuple(sorted(p.name for p in folder.iterdir() if p.is_dir()))


def _is_name(text: str) -> bool:
    """A bare name (looked up in the data folders), not a path."""
    return bool(text) and "/" not in text and os.sep not in text and text not in (".", "..")


def universe_path(name: str) -> Path:
    """A universe file by name: packaged, then TULVING_DATA/universes/NAME.json.
    The path may not exist: the caller reports it."""
    packaged = PACKAGED / "universes" / f"{name}.json"
    if packaged.is_file():
        return packaged
    user = user_data_dir()
    return (user if user is not None else PACKAGED) / "universes" / f"{name}.json"


def published_book_dir(name: str = "synaptic-echoes") -> Path:
    """A packaged book folder by name."""
    return PACKAGED / "books" / name


def book_dir(name: str) -> Path | None:
    """A book folder by name (packaged, then TULVING_DATA/books/NAME), or None."""
    if not _is_name(name):
        return None
    packaged = published_book_dir(name)
    if packaged.is_dir():
        return packaged
    user = user_data_dir()
    if user is not None and (user / "books" / name).is_dir():
        return user / "books" / name
    return None
