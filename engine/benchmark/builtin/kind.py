"""The endpoint kind "builtin", declared by an entry point of group
`tulving.providers` (pyproject.toml) like any other kind: its provider, and
the `builtin` endpoint and `builtin:*` aliases it adds to every config."""
from __future__ import annotations

from engine.config import PAPER_PARAMS
from providers.kinds import Capabilities, ProviderKind

BUILTIN = ProviderKind(
    name="builtin",
    provider="engine.benchmark.builtin.provider:BuiltinProvider",
    doc="the benchmark's deterministic writer, reader and judge (baselines and test instruments, not LLMs)",
    capabilities=Capabilities(seeded_draws=True),
    default_endpoints={"builtin": {"kind": "builtin", "max_concurrency": 64, "timeout": 600, "max_attempts": 1}},
    default_models={
        # Deterministic baselines and test instruments -- not LLMs.
        "builtin:writer": {"endpoint": "builtin", "model": "writer", "params": PAPER_PARAMS},
        "builtin:reader": {"endpoint": "builtin", "model": "reader", "params": PAPER_PARAMS},
        "builtin:judge": {"endpoint": "builtin", "model": "judge", "params": PAPER_PARAMS},
    },
)
