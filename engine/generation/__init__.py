"""Benchmark generation: universe, events, chapters, book (see protocol.md).

The public entry points most callers need:
    from engine.generation import Book, load_book
"""
from engine.generation.bookdir import Book, BookError
from engine.generation.published import load_book

__all__ = ["Book", "BookError", "load_book"]
