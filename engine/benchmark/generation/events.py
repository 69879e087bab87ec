"""Events and their meta-data, sampled exactly as the protocol says.

Events ("Events"): candidate k seeds numpy's legacy generator with
`10_000_000 * seed_events + k` and draws the universe indices of t, e, s, c
(geometric p=0.1 minus one, redrawn while >= N_universe); its content detail
comes from the Python stream the universe left. Candidates with a repeated
(t, e), then a repeated (t, s), are dropped; the first N remain, so the first
N1 events are the same for every N2 > N1.

The uniform variant (the paper's sampler ablation) is the reference's too:
candidate k seeds Python's `random` with the same candidate seed and
chooses t, e, s, c and the detail from it (`_uniform_candidate`).

`numpy.random.RandomState(s)` is the legacy global generator's class: seeding
one instance gives the numbers `numpy.random.seed(s)` gives, without touching
the global state.

Meta-events ("Meta-events"): paragraph count, the paragraph of each item and
a style, from Python's `random` reseeded per field.
"""
from __future__ import annotations

import random

import numpy as np

from engine.benchmark.generation.bookdir import MetaEvent
from engine.benchmark.generation.universe import N_UNIVERSE, Universe
from providers.base import TulvingError

GEOMETRIC_P = 0.1
DISTRIBUTIONS = ("geometric", "uniform")
_MAX_REDRAWS = 10
_BATCH = 4  # geometric values drawn per call (more only after a rare redraw)
META_POSITION_ORDER = ("location", "date", "entity", "content")  # reseed offsets 1..4


class EventsError(TulvingError):
    """Bad event-sampling parameters."""


def n_candidates(n_events: int) -> int:
    if n_events <= 200:
        return 3 * n_events
    if n_events <= 800:
        return 5 * n_events
    return 3000 * n_events


def _draw_indices(state: np.random.RandomState) -> tuple[int, int, int, int]:
    """The universe indices of t, e, s, c for one freshly seeded geometric candidate.

    Geometric values are drawn in a batch: the legacy generator gives the same
    sequence as one call per value, and a value >= N_universe is replaced by
    the next one in the sequence, exactly as redrawing it would."""
    values = state.geometric(p=GEOMETRIC_P, size=_BATCH).tolist()
    out: list[int] = []
    redraws = 0
    position = 0
    while len(out) < 4:
        if position == len(values):
            values = state.geometric(p=GEOMETRIC_P, size=_BATCH).tolist()
            position = 0
        value = values[position] - 1
        position += 1
        if value < N_UNIVERSE:
            out.append(value)
            redraws = 0
        else:
            redraws += 1
            if redraws > _MAX_REDRAWS:
                raise EventsError(f"more than {_MAX_REDRAWS} redraws of a geometric index")
    return out[0], out[1], out[2], out[3]


def _uniform_candidate(universe: Universe, seed: int) -> tuple[int, int, int, int, str]:
    """Indices of t, e, s, c and the detail of one uniform candidate: the
    reference seeds the global `random` with the candidate seed and calls
    `random.choice` on the dates, entities, locations, contents, then on the
    chosen content's details (a private `Random` gives the same numbers)."""
    rng = random.Random(seed)
    # choice over range(n) draws exactly as choice over an n-item list, and gives the index
    t, e, s, c = (rng.choice(range(len(items))) for items in
                  (universe.dates, universe.entities, universe.locations, universe.contents))
    return t, e, s, c, rng.choice(universe.spec.content_details[universe.contents[c]])


def sample_events(universe: Universe, n_events: int, seed_events: int = 0,
                  distribution: str = "geometric") -> list[dict[str, str]]:
    """The first `n_events` events (fewer only if the candidates run out).

    `uniform` (the paper's sampler ablation) is the reference's: candidate k
    seeds Python's `random` with the same candidate seed, then chooses t, e,
    s, c (in that order) and the content detail from that one stream.
    """
    if n_events < 1:
        raise EventsError(f"the number of events must be at least 1, got {n_events}")
    if distribution not in DISTRIBUTIONS:
        raise EventsError(f"unknown distribution {distribution!r} (known: {', '.join(DISTRIBUTIONS)})")
    details_rng = universe.rng()
    state = np.random.RandomState()
    seen_te: set[tuple[int, int]] = set()
    seen_ts: set[tuple[int, int]] = set()
    events: list[dict[str, str]] = []
    # Filtering is a streaming pass over the candidates in order, so stopping at
    # N kept events gives the reference's first N of the full candidate list.
    for k in range(n_candidates(n_events)):
        seed = 10_000_000 * seed_events + k
        if distribution == "uniform":
            t, e, s, c, detail = _uniform_candidate(universe, seed)
        else:
            state.seed(seed)
            t, e, s, c = _draw_indices(state)
            detail = details_rng.choice(universe.spec.content_details[universe.contents[c]])
        content = universe.contents[c]
        if (t, e) in seen_te:
            continue
        seen_te.add((t, e))
        if (t, s) in seen_ts:
            continue
        seen_ts.add((t, s))
        events.append({"date": universe.dates[t], "location": universe.locations[s],
                       "entity": universe.entities[e], "content": content, "detail": detail})
        if len(events) == n_events:
            break
    return events


def sample_meta_events(universe: Universe, n_events: int, seed_events: int = 0) -> list[MetaEvent]:
    """One meta-event per event: nb_paragraphs, idx_paragraph, style."""
    nb_choices = list(universe.spec.nb_paragraphs)
    styles = list(universe.spec.styles)
    rng = random.Random(20 * seed_events + 0)
    nbs = [rng.choice(nb_choices) for _ in range(n_events)]
    positions: dict[str, list[int]] = {}
    for offset, key in enumerate(META_POSITION_ORDER, start=1):
        rng = random.Random(20 * seed_events + offset)
        positions[key] = [rng.randint(1, nb) for nb in nbs]
    rng = random.Random(20 * seed_events + 5)
    chosen = [rng.choice(styles) for _ in range(n_events)]
    return [MetaEvent(nb_paragraphs=nbs[i],
                      idx_paragraph={key: positions[key][i] for key in META_POSITION_ORDER},
                      style=chosen[i]) for i in range(n_events)]
