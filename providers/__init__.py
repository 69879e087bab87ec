"""Providers: one module per wire protocol, and the registry of provider kinds
(providers/kinds.py, read from the entry point group `tulving.providers`)."""
from __future__ import annotations

from providers.kinds import make_provider

__all__ = ["make_provider"]
