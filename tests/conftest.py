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
from tests.wheel_install import installed  # noqa: E402,F401 -- the wheel in a fresh venv (tests/wheel_install.py)


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


# The realism ablation's runs (tests/test_trust.py, tests/test_report_realism.py):
# a 40-event book written and rated by the built-in writer, the built-in reader
# in context and by RAG with MiniLM, and a 5-question run on the short book.
REALISM_STEPS = (("generate", "--events", "40", "--model", "builtin:writer", "--out", "book"),
                 ("book", "realism", "book", "--model", "builtin:writer"),
                 ("run", "--book", "book", "--models", "builtin:reader", "--out", "run"),
                 ("run", "--book", "book", "--models", "builtin:reader", "--modes", "rag-paragraph", "--embed-model",
                  "local:minilm", "--out", "rag"),
                 ("run", "--book", "synaptic-echoes-short", "--models", "builtin:reader", "--sample", "5",
                  "--out", "unrated"))


@pytest.fixture(scope="session")
def realism_runs(tmp_path_factory):
    """A folder where the CLI ran REALISM_STEPS once per session: the book and
    its ratings (book/), the runs (run/, rag/, unrated/). Read only: the tests
    read these runs in place and write their reports and comparisons elsewhere
    (they used to rerun every step from a copy of the cache, seconds each)."""
    from tests.cli import tulving

    folder = tmp_path_factory.mktemp("realism")
    env = {k: v for k, v in os.environ.items() if k not in ("TULVING_CONFIG", "TULVING_CACHE")}
    env.update(XDG_CACHE_HOME=str(folder / "xdg-cache"), XDG_CONFIG_HOME=str(folder / "xdg-config"))
    for step in REALISM_STEPS:
        done = tulving(folder, "--quiet", "--cache", "c.sqlite", *step, env=env)
        assert done.returncode == 0, done.stderr
    return folder


@pytest.fixture(scope="session")
def offline_short_run(tmp_path_factory):
    """One offline run (tests/report_runs.py `offline_run`: the built-in reader
    in context on the short book, judged by the built-in judge), made once per
    session for the tests that read it or a copy of it (`copied_run`): it was
    made ten times, a second or two each."""
    from tests.report_runs import offline_run

    return offline_run(tmp_path_factory.mktemp("offline-run"))


@pytest.fixture(scope="session")
def three_run_report(offline_short_run, tmp_path_factory):
    """The report over the offline run, its hostile twin and a sampled run
    (tests/report_runs.py `report_of_three_runs`), made once for the tests that
    read it (tests/test_report_html.py, tests/test_browser_report.py)."""
    from tests.report_runs import report_of_three_runs

    return report_of_three_runs(offline_short_run, tmp_path_factory.mktemp("report"))
