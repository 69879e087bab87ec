"""Tulving: an async engine for the Episodic Memory Benchmark for LLMs."""
from __future__ import annotations

DISTRIBUTION = "tulving-bench"


def __getattr__(name: str) -> str:
    """`engine.__version__`: pyproject.toml's version, as the installed
    distribution records it, read when first asked for (importlib.metadata
    costs more than the rest of `tulving --help`)."""
    if name != "__version__":
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found
