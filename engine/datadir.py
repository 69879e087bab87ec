"""Where the benchmark data lives: one setting for the whole program.

Default: `../shared/data` beside the checkout; override with TULVING_DATA.
"""
from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "TULVING_DATA"
CHECKOUT = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    configured = os.environ.get(ENV_VAR)
    path = Path(configured).expanduser() if configured else CHECKOUT.parent / "shared" / "data"
    if not path.is_dir():
        raise FileNotFoundError(
            f"data directory {path} not found: set {ENV_VAR} to the folder holding universes/ and books/")
    return path


def universe_path(name: str) -> Path:
    return data_dir() / "universes" / f"{name}.json"


def published_book_dir(name: str = "synaptic-echoes") -> Path:
    return data_dir() / "books" / name
