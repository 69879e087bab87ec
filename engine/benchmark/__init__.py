"""The benchmark layer: the Episodic Memory Benchmark itself, built on the engine.

    datadir.py    where the packaged dataset (data/) and the user's books live
    builtin/      the built-in writer, reader and judge (deterministic baselines)
    generation/   universes, events, chapters, books
    evaluation/   questions, answers (in-context, RAG, fine-tuned), judging, scores, reports
    latency/      provider latency benchmarks (`tulving bench`)

It imports the engine core (engine/*.py), the providers and the cache, never
the command line (engine/cli/).
"""
