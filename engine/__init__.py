"""Tulving: an async engine for the Episodic Memory Benchmark for LLMs."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "tulving-bench"

try:
    # One version, pyproject.toml's, as the installed distribution records it.
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
