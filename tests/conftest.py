"""Fixtures shared by the test modules: the published books and their
question sets, loaded once per test session (loading re-runs the exact checks
on every chapter; building questions takes a second). Tests only read them."""
import pytest

from engine.benchmark.evaluation.questions import build_questions
from engine.benchmark.generation import load_book
from tests.pg_cluster import own_pg_cluster, pg_server, pg_url  # noqa: F401 -- PostgreSQL fixtures (tests/pg_cluster.py)


@pytest.fixture(scope="session")
def long_book():
    return load_book("synaptic-echoes")


@pytest.fixture(scope="session")
def short_book():
    return load_book("synaptic-echoes-short")  # the 20-event run: first 19 chapters


@pytest.fixture(scope="session")
def long_questions(long_book):
    return build_questions(long_book)


@pytest.fixture(scope="session")
def short_questions(short_book):
    return build_questions(short_book)
