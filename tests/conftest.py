"""Fixtures shared by the test modules: the published books and their
question sets, loaded once per test session (loading re-runs the exact checks
on every chapter; building questions takes a second). Tests only read them.

The user's cache and config directories (XDG) point into a temporary folder
for the whole session, before any engine module reads them: no test writes
to the real home, and no user config changes what a test sees."""
import atexit
import os
import shutil
import tempfile

_HOME = tempfile.mkdtemp(prefix="tulving-tests-home-")
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ["XDG_CACHE_HOME"] = os.path.join(_HOME, "cache")
os.environ["XDG_CONFIG_HOME"] = os.path.join(_HOME, "config")

import pytest  # noqa: E402

from engine.benchmark.evaluation.questions import build_questions  # noqa: E402
from engine.benchmark.generation import load_book  # noqa: E402
from tests.pg_cluster import own_pg_cluster, pg_server, pg_url  # noqa: E402,F401 -- PostgreSQL fixtures (tests/pg_cluster.py)


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
