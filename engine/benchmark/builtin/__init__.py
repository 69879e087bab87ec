"""The built-in "models" (writer, reader, judge): deterministic baselines and
test instruments that speak the benchmark's prompts, so they belong to the
benchmark layer, above the engine.

Importing this package registers them: the endpoint kind "builtin" with the
provider registry, and the `builtin` endpoint and `builtin:*` aliases with the
config's defaults. The benchmark's packages (engine.benchmark.generation,
engine.benchmark.evaluation) import it, so any program that runs the benchmark has them;
the engine core and the providers never name them.
"""
from engine.config import PAPER_PARAMS, register_defaults
from providers import register_kind

register_kind("builtin", "engine.benchmark.builtin.provider:BuiltinProvider")
register_defaults(
    endpoints={"builtin": {"kind": "builtin", "max_concurrency": 64, "timeout": 600, "max_attempts": 1}},
    models={
        # Deterministic baselines and test instruments -- not LLMs.
        "builtin:writer": {"endpoint": "builtin", "model": "writer", "params": PAPER_PARAMS},
        "builtin:reader": {"endpoint": "builtin", "model": "reader", "params": PAPER_PARAMS},
        "builtin:judge": {"endpoint": "builtin", "model": "judge", "params": PAPER_PARAMS},
    })
