"""Universe files: load and validate the raw materials, build the static universe.

A universe file is JSON with the keys of `REQUIRED_KEYS` (see
engine/benchmark/data/universes/default.json). The static universe (protocol, "Universe") holds
N_universe = 100 dates, full names, locations and contents, built with
Python's `random` in a fixed order. The Python random stream left after the
entity draws continues into event generation (the content details); we keep
it as a state in `Universe.stream_state` instead of the process-global
generator, which gives the same numbers without leaking state between calls.
"""
from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.benchmark.datadir import published_names, universe_path, user_data_dir
from providers.base import TulvingError

N_UNIVERSE = 100
PUBLISHED_UNIVERSES = published_names("universes")  # default, news, scifi (packaged)
REQUIRED_KEYS = ("start_date", "end_date", "first_names", "last_names", "locations", "contents",
                 "content_details", "styles", "nb_paragraphs", "secondary_first_names",
                 "secondary_last_names")
_MAX_ENTITY_DRAWS = 1_000_000


class UniverseError(TulvingError):
    """A universe file that cannot be used; the message names the problem."""


@dataclass(frozen=True)
class UniverseSpec:
    """The raw materials of a universe, validated."""

    name: str
    start_date: dt.date
    end_date: dt.date
    first_names: tuple[str, ...]
    last_names: tuple[str, ...]
    locations: tuple[str, ...]
    contents: tuple[str, ...]
    content_details: Mapping[str, tuple[str, ...]]
    styles: Mapping[str, tuple[str, ...]]   # style -> adjectives, in file order
    nb_paragraphs: tuple[int, ...]
    secondary_first_names: tuple[str, ...]
    secondary_last_names: tuple[str, ...]


@dataclass(frozen=True)
class Universe:
    """The static universe: N_universe items per dimension, plus the raw spec."""

    spec: UniverseSpec
    seed: int
    dates: tuple[str, ...]
    entities: tuple[str, ...]
    locations: tuple[str, ...]
    contents: tuple[str, ...]
    stream_state: tuple[object, ...]  # Python random state after step 2 (feeds the detail draws)

    @property
    def name(self) -> str:
        return self.spec.name

    def rng(self) -> random.Random:
        """A fresh generator positioned where the universe left the stream."""
        r = random.Random()
        r.setstate(self.stream_state)
        return r


# -- loading and validation --------------------------------------------------------
def load_universe_spec(name_or_path: str | Path) -> UniverseSpec:
    """A universe by name (the published default, news, scifi, then a user's
    TULVING_DATA/universes/NAME.json) or a JSON file of the same shape."""
    text = str(name_or_path)
    by_name = Path(text).suffix != ".json" and "/" not in text
    path = universe_path(text) if by_name else Path(text)
    if by_name and not path.is_file() and Path(text).is_file():
        path = Path(text)  # a file without the .json suffix, given by path
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        user = user_data_dir()
        where = f", or in {user / 'universes'}" if user is not None else " (TULVING_DATA names a folder of your own)"
        raise UniverseError(f"universe {text!r}: no such file (published universes: "
                            f"{', '.join(PUBLISHED_UNIVERSES)}{where})") from None
    except json.JSONDecodeError as exc:
        raise UniverseError(f"universe file {path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    default_name = text if by_name else path.stem
    return validate_universe(raw, source=str(path), default_name=default_name)


def _names(raw: Mapping[str, object], key: str, source: str, minimum: int) -> tuple[str, ...]:
    value = raw[key]
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise UniverseError(f"{source}: {key} must be a list of non-empty strings")
    seen: set[str] = set()
    for v in value:
        if v in seen:
            raise UniverseError(f"{source}: {key} has a duplicate: {v!r}")
        seen.add(v)
    if len(value) < minimum:
        raise UniverseError(f"{source}: {key} has {len(value)} items, needs at least {minimum}")
    return tuple(value)


def _date(raw: Mapping[str, object], key: str, source: str) -> dt.date:
    value = raw[key]
    try:
        return dt.date.fromisoformat(str(value))
    except ValueError:
        raise UniverseError(f"{source}: {key} {value!r} is not a date YYYY-MM-DD") from None


def _content_details(details_raw: object, contents: tuple[str, ...], source: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(details_raw, dict):
        raise UniverseError(f"{source}: content_details must map each content to a list of details")
    details: dict[str, tuple[str, ...]] = {}
    for content in contents:
        if content not in details_raw:
            raise UniverseError(f"{source}: content_details has no details for content {content!r}")
        details[content] = _names(details_raw, content, f"{source}: content_details", 1)
    return details


def _styles(styles_raw: object, source: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(styles_raw, dict) or not styles_raw:
        raise UniverseError(f"{source}: styles must map each style to its adjectives")
    styles: dict[str, tuple[str, ...]] = {}
    for style, adjectives in styles_raw.items():
        if not isinstance(adjectives, list) or not adjectives or not all(isinstance(a, str) for a in adjectives):
            raise UniverseError(f"{source}: style {style!r} needs a non-empty list of adjectives")
        styles[style] = tuple(adjectives)
    return styles


def validate_universe(raw: object, *, source: str = "universe", default_name: str = "custom") -> UniverseSpec:
    """Check a parsed universe file; raise UniverseError with a one-line message."""
    if not isinstance(raw, dict):
        raise UniverseError(f"{source}: a universe file holds a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        raise UniverseError(f"{source}: missing key(s) {', '.join(missing)}")
    start, end = _date(raw, "start_date", source), _date(raw, "end_date", source)
    if (end - start).days < N_UNIVERSE:
        raise UniverseError(f"{source}: end_date must be at least {N_UNIVERSE} days after start_date "
                            f"({start} .. {end})")
    first = _names(raw, "first_names", source, 1)
    last = _names(raw, "last_names", source, 1)
    if len(first) * len(last) < N_UNIVERSE:
        raise UniverseError(f"{source}: first_names x last_names give fewer than {N_UNIVERSE} full names")
    locations = _names(raw, "locations", source, N_UNIVERSE)
    contents = _names(raw, "contents", source, N_UNIVERSE)
    details = _content_details(raw["content_details"], contents, source)
    styles = _styles(raw["styles"], source)
    nb = raw["nb_paragraphs"]
    if (not isinstance(nb, list) or not nb
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in nb)):
        raise UniverseError(f"{source}: nb_paragraphs must be a non-empty list of positive integers")
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise UniverseError(f"{source}: name must be a non-empty string")
    return UniverseSpec(
        name=name, start_date=start, end_date=end, first_names=first, last_names=last,
        locations=locations, contents=contents, content_details=details, styles=styles,
        nb_paragraphs=tuple(nb),
        secondary_first_names=_names(raw, "secondary_first_names", source, 1),
        secondary_last_names=_names(raw, "secondary_last_names", source, 1))


# -- the static universe --------------------------------------------------------------
def build_universe(spec: UniverseSpec, seed: int = 0) -> Universe:
    """Protocol "Universe", steps 1-4."""
    n = N_UNIVERSE
    # 1. dates: random.seed(seed); sample of day offsets (the end date is never drawn)
    rng = random.Random(seed)
    days = rng.sample(range((spec.end_date - spec.start_date).days), n)
    dates = tuple((spec.start_date + dt.timedelta(days=d)).strftime("%B %d, %Y") for d in days)
    # 2. entities: random.seed(seed + 1); the stream then continues into the events
    rng = random.Random(seed + 1)
    entities: list[str] = []
    seen: set[str] = set()
    for _ in range(_MAX_ENTITY_DRAWS):
        full = f"{rng.choice(spec.first_names)} {rng.choice(spec.last_names)}"
        if full not in seen:
            seen.add(full)
            entities.append(full)
            if len(entities) == n:
                break
    else:  # pragma: no cover - validation guarantees enough combinations
        raise UniverseError(f"universe {spec.name}: could not draw {n} distinct full names")
    # 3. locations and contents: each shuffled by its own Random(seed)
    locations, contents = list(spec.locations), list(spec.contents)
    random.Random(seed).shuffle(locations)
    random.Random(seed).shuffle(contents)
    return Universe(spec=spec, seed=seed, dates=dates, entities=tuple(entities),
                    locations=tuple(locations[:n]), contents=tuple(contents[:n]),
                    stream_state=rng.getstate())


def load_universe(name_or_path: str | Path, seed: int = 0) -> Universe:
    return build_universe(load_universe_spec(name_or_path), seed)
