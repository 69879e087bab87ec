"""The command line layer: `tulving ...` (main.py builds the parser; one module
per command group: tools, bench, cache, generate, evaluate, batches).

Top of the package's layers: it may import the benchmark (engine/benchmark/),
the development server (engine/loopback/), the engine core (engine/*.py), the
providers and the cache; nothing imports it but the entry point.
"""
