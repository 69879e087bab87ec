"""Tulving: an async engine for the Episodic Memory Benchmark for LLMs."""

__version__ = "0.1.0"
