"""Universe, events and meta-events against the published data and the protocol."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.benchmark.datadir import published_book_dir, universe_path
from engine.benchmark.generation.events import EventsError, _draw_indices, sample_events, sample_meta_events
from engine.benchmark.generation.universe import UniverseError, build_universe, load_universe, load_universe_spec
from engine.errors import TulvingError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import repetition_table  # noqa: E402

PUBLISHED = published_book_dir("synaptic-echoes")


@pytest.fixture(scope="module")
def default_universe():
    return load_universe("default")


@pytest.fixture(scope="module")
def events200(default_universe):
    return sample_events(default_universe, 200)


def test_static_universe_matches_paper_listing(default_universe):
    # paper Listing lst:universe
    assert default_universe.dates[:3] == ("February 27, 2026", "May 11, 2026", "March 23, 2024")
    assert default_universe.locations[:3] == ("American Museum of Natural History", "Metropolitan Museum of Art",
                                              "High Line")
    assert default_universe.entities[:3] == ("Henry Reed", "Levi Rodriguez", "Scarlett Thomas")
    assert default_universe.contents[:3] == ("Tech Hackathon", "Theater Performance", "Educational Workshop")
    for items in (default_universe.dates, default_universe.entities, default_universe.locations,
                  default_universe.contents):
        assert len(items) == len(set(items)) == 100


def test_events_and_meta_events_equal_published(default_universe, events200):
    published_events = json.loads((PUBLISHED / "events.json").read_text())
    published_meta = json.loads((PUBLISHED / "meta_events.json").read_text())
    assert len(events200) == 200
    for i, (ours, theirs) in enumerate(zip(events200, published_events)):
        assert ours == theirs, f"event {i}"
    metas = sample_meta_events(default_universe, 200)
    for i, (ours, theirs) in enumerate(zip(metas, published_meta)):
        assert ours == theirs, f"meta-event {i}"
    # same key order as the published file, so the JSON compares textually too
    assert json.dumps(metas) == json.dumps(published_meta)


def test_first_events_do_not_depend_on_n(default_universe, events200):
    for n in (1, 20, 57, 199):
        assert sample_events(default_universe, n) == events200[:n]
        assert sample_meta_events(default_universe, n) == sample_meta_events(default_universe, 200)[:n]


def test_repeated_calls_give_identical_results_and_leave_global_state(default_universe, events200):
    random.seed(123)
    np.random.seed(123)
    py_state, np_state = random.getstate(), np.random.get_state()
    again = sample_events(load_universe("default"), 200)
    assert again == events200
    assert sample_events(default_universe, 200) == events200
    assert random.getstate() == py_state
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
               for a, b in zip(np.random.get_state(), np_state))


def test_other_seeds_and_uniform_differ_but_are_deterministic(default_universe, events200):
    seed1 = sample_events(default_universe, 50, seed_events=1)
    assert seed1 != events200[:50]
    assert seed1 == sample_events(default_universe, 50, seed_events=1)
    uniform = sample_events(default_universe, 200, distribution="uniform")
    assert uniform == sample_events(default_universe, 200, distribution="uniform")
    assert uniform != events200
    # uniform spreads items: many more distinct dates than the geometric draw
    assert len({e["date"] for e in uniform}) > len({e["date"] for e in events200}) + 20
    with pytest.raises(EventsError):
        sample_events(default_universe, 10, distribution="zipf")
    with pytest.raises(EventsError):
        sample_events(default_universe, 0)


def test_no_repeated_date_entity_or_date_location(events200):
    assert len({(e["date"], e["entity"]) for e in events200}) == 200
    assert len({(e["date"], e["location"]) for e in events200}) == 200


@pytest.mark.parametrize("name", ["news", "scifi"])
def test_other_universes_build(name):
    universe = load_universe(name)
    events = sample_events(universe, 20)
    metas = sample_meta_events(universe, 20)
    assert len(events) == 20 and all(m["style"] == name for m in metas)
    assert all(e["detail"] == f"witnessed a {e['content']}" for e in events)


# -- validation ---------------------------------------------------------------------------------
def _write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "u.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.fixture
def raw_default() -> dict:
    return json.loads(universe_path("default").read_text())


def test_a_users_file_of_the_same_shape_loads(tmp_path, raw_default):
    raw_default["name"] = "mine"
    spec = load_universe_spec(_write(tmp_path, raw_default))
    assert spec.name == "mine"
    assert build_universe(spec).dates == load_universe("default").dates


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r["locations"].__setitem__(5, r["locations"][0]), "locations has a duplicate: 'Empire State Building'"),
    (lambda r: r.__setitem__("contents", r["contents"][:99]), "contents has 99 items, needs at least 100"),
    (lambda r: r["content_details"].pop(r["contents"][3]), "content_details has no details for content"),
    (lambda r: r.__setitem__("start_date", "2024-13-01"), "start_date '2024-13-01' is not a date"),
    (lambda r: r.__setitem__("end_date", "2024-02-01"), "end_date must be at least 100 days after start_date"),
    (lambda r: r.pop("styles"), "missing key(s) styles"),
    (lambda r: r.__setitem__("nb_paragraphs", [0, 1]), "nb_paragraphs must be a non-empty list of positive"),
    (lambda r: r["content_details"].__setitem__(r["contents"][0], []), "needs at least 1"),
])
def test_bad_universe_files_fail_with_one_line_errors(tmp_path, raw_default, mutate, message):
    mutate(raw_default)
    with pytest.raises(UniverseError) as info:
        load_universe_spec(_write(tmp_path, raw_default))
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, TulvingError)


def test_missing_or_broken_universe_file(tmp_path):
    with pytest.raises(UniverseError, match="no such file"):
        load_universe_spec(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(UniverseError, match="not valid JSON"):
        load_universe_spec(broken)


# -- the repetition table -------------------------------------------------------------------------
def test_repetition_table_quick():
    ours = repetition_table.table(repetitions=1000, seed=1)
    for key, row in repetition_table.PAPER.items():
        for b, (mean, sd) in row.items():
            got_mean, got_sd = ours[key][b]
            # the paper rounds means to integers; 1000 repetitions: standard error < 0.2
            assert abs(got_mean - mean) <= 0.75, (key, b, got_mean, mean)
            assert abs(got_sd - sd) <= 0.35, (key, b, got_sd, sd)


def _naive_indices(seed: int) -> list[int]:
    """The protocol read literally: the global legacy generator, one call per value."""
    np.random.seed(seed)
    out = []
    for _ in range(4):
        value = np.random.geometric(p=0.1) - 1
        while value >= 100:
            value = np.random.geometric(p=0.1) - 1
        out.append(int(value))
    return out


@pytest.mark.parametrize("seed", [0, 1, 20093, 21159, 50650])  # the last three need a redraw
def test_batched_draws_equal_one_call_per_value(seed):
    state = np.random.RandomState()
    state.seed(seed)
    assert list(_draw_indices(state)) == _naive_indices(seed)


def _reference_uniform(universe, n: int, seed_events: int) -> list[dict]:
    """The reference's uniform sampler restated (issue "fidelity", point 11):
    the global `random` reseeded with each candidate seed, then
    random.choice of t, e, s, c and of the detail; the (t, e) then (t, s)
    filters; the first n."""
    state = random.getstate()
    try:
        candidates = []
        for k in range(3 * n):
            random.seed(10_000_000 * seed_events + k)
            t, e = random.choice(universe.dates), random.choice(universe.entities)
            s, c = random.choice(universe.locations), random.choice(universe.contents)
            candidates.append((t, s, e, c, random.choice(universe.spec.content_details[c])))
    finally:
        random.setstate(state)
    kept, seen_te, seen_ts = [], set(), set()
    for t, s, e, c, d in candidates:
        if (t, e) not in seen_te:
            seen_te.add((t, e))
            kept.append((t, s, e, c, d))
    out = []
    for t, s, e, c, d in kept:
        if (t, s) not in seen_ts:
            seen_ts.add((t, s))
            out.append({"date": t, "location": s, "entity": e, "content": c, "detail": d})
    return out[:n]


# the reference's first uniform event of the default universe, seed 0
FIRST_UNIFORM_EVENT = {"date": "October 17, 2025", "location": "Whitney Museum of American Art",
                       "entity": "Daniel Hall", "content": "Photography Exhibition",
                       "detail": "Explained conceptual photography"}


@pytest.mark.parametrize("name, seed_events", [("default", 0), ("default", 1), ("news", 0), ("scifi", 7)])
def test_uniform_is_the_reference_sampler(name, seed_events):
    universe = load_universe(name)
    assert sample_events(universe, 200, seed_events, distribution="uniform") == \
        _reference_uniform(universe, 200, seed_events)


def test_first_uniform_event_is_pinned(default_universe):
    assert sample_events(default_universe, 1, distribution="uniform") == [FIRST_UNIFORM_EVENT]
