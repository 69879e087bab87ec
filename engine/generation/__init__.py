"""Benchmark generation: universe, events, chapters, book (see protocol.md).

The public entry points most callers need:
    from engine.generation import Book, load_book
"""
import engine.builtin  # noqa: F401 -- registers the built-in writer, reader and judge
from engine.generation.bookdir import Book, BookError
from engine.generation.published import load_book

__all__ = ["Book", "BookError", "load_book"]
