"""User-facing errors. The CLI prints `str(err)` (one line) and exits non-zero.

`TulvingError` is defined with the shared types (providers/base.py), so that
every layer can raise it; the engine's own user errors derive from it.
"""
from providers.base import TulvingError

__all__ = ["TulvingError"]
