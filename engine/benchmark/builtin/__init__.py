"""The built-in "models" (writer, reader, judge): deterministic baselines and
test instruments that speak the benchmark's prompts, so they belong to the
benchmark layer, above the engine.

They are the endpoint kind "builtin" (kind.py), registered through the entry
point group `tulving.providers` like every kind: the config finds the kind,
the `builtin` endpoint and the `builtin:*` aliases when it loads, whatever was
imported first. Importing this package registers nothing.
"""
