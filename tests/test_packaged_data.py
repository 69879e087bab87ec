"""The paper's dataset ships inside the package; a user's own data is an extra place.

The packaged copies must equal ../shared/data (the source they were copied
from) byte for byte where that folder exists beside the checkout; a user who
cloned or pip-installed Tulving has no such folder, and nothing in the package
may look for it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.benchmark.datadir import DataError, data_dir, published_book_dir
from engine.benchmark.generation.bookdir import read_book_dir
from engine.benchmark.generation.published import PUBLISHED, first_events, load_book
from engine.benchmark.generation.universe import PUBLISHED_UNIVERSES, UniverseError, load_universe_spec

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} is absent (a clone without shared/ beside it): "
                                                "nothing to compare the packaged data with")
def test_packaged_data_equals_shared_data_byte_for_byte():
    shared, packaged = _files(SHARED), _files(data_dir())
    assert shared, "shared/data is empty"
    missing = sorted(set(shared) - set(packaged))
    assert not missing, f"files of shared/data not packaged: {missing}"
    differing = sorted(name for name in shared if packaged[name] != shared[name])
    assert not differing, f"packaged copies differ from shared/data: {differing}"


def test_the_short_book_folder_is_the_first_20_events_of_the_long_one():
    long_raw = read_book_dir(published_book_dir("synaptic-echoes"))
    derived = first_events(long_raw, 20)
    short = published_book_dir("synaptic-echoes-short")
    assert (short / "book.txt").read_text(encoding="utf-8") == derived["text"]
    for name in ("chapters", "events", "meta_events"):
        text = (short / f"{name}.json").read_text(encoding="utf-8")
        assert text == json.dumps(derived[name], indent=1, ensure_ascii=False), name
    assert len(derived["chapters"]) == 19 and len(derived["events"]) == 20


def test_published_names_are_the_packaged_ones():
    assert set(PUBLISHED) == {"synaptic-echoes", "synaptic-echoes-short"}
    assert set(PUBLISHED_UNIVERSES) == {"default", "news", "scifi"}
    for name in ("leaderboard.json", "paper_f1_by_bin.json"):
        json.loads((data_dir() / "published" / name).read_text())


def test_no_package_code_looks_for_the_shared_folder():
    offenders = []
    for package in ("engine", "providers", "cache"):
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if "../shared" in text or '"shared"' in text or "'shared'" in text:
                offenders.append(str(path.relative_to(REPO)))
    assert not offenders


def test_published_books_load_without_tulving_data(monkeypatch, tmp_path):
    monkeypatch.delenv("TULVING_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    book = load_book("synaptic-echoes-short")
    assert book.n_chapters == 19 and book.metadata["n_events"] == 20
    assert load_universe_spec("news").name == "news"


def test_tulving_data_is_an_extra_place_for_a_users_books_and_universes(monkeypatch, tmp_path):
    user = tmp_path / "mydata"
    shutil.copytree(published_book_dir("synaptic-echoes-short"), user / "books" / "my-book")
    (user / "universes").mkdir()
    spec = json.loads((data_dir() / "universes" / "scifi.json").read_text())
    spec.pop("name", None)  # named after its file, then
    (user / "universes" / "my-universe.json").write_text(json.dumps(spec))
    monkeypatch.setenv("TULVING_DATA", str(user))

    book = load_book("my-book")
    assert book.name == "my-book" and book.n_chapters == 19 and book.path == user / "books" / "my-book"
    assert load_universe_spec("my-universe").name == "my-universe"
    # Published names still mean the packaged data, whatever TULVING_DATA holds.
    shutil.copytree(published_book_dir("synaptic-echoes-short"), user / "books" / "synaptic-echoes")
    assert load_book("synaptic-echoes").n_chapters == 196
    # A book folder by path works too, wherever it is.
    assert load_book(str(user / "books" / "my-book")).n_chapters == 19


def test_unknown_names_and_a_missing_tulving_data_folder_are_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("TULVING_DATA", str(tmp_path))
    with pytest.raises(Exception, match="no book named 'nope'.*synaptic-echoes"):
        load_book("nope")
    with pytest.raises(UniverseError, match="universe 'nope': no such file.*default, news, scifi"):
        load_universe_spec("nope")
    monkeypatch.setenv("TULVING_DATA", str(tmp_path / "missing"))
    with pytest.raises(DataError, match="TULVING_DATA=.*missing: no such folder"):
        load_book("nope")
