"""The work of `tulving score` (options: engine/cli/score.py)."""
from __future__ import annotations

import argparse

from engine.config import Config
from providers.base import TulvingError


def score(args: argparse.Namespace, config: Config) -> int:
    raise TulvingError("tulving score: not built yet on this branch")
