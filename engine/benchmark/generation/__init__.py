"""Benchmark generation: universe, events, chapters, book (see protocol.md).

The public entry points most callers need:
    from engine.benchmark.generation import Book, load_book
"""
from engine.benchmark.generation.bookdir import Book, BookError
from engine.benchmark.generation.published import load_book

__all__ = ["Book", "BookError", "load_book"]
