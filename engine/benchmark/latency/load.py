"""Load shapes: when requests are sent, how many at once, and sweeps over them.

- `parse_rate("inf" | "R")`, `parse_arrival("poisson" | "gamma:B" | "constant")`,
  `parse_sweep("rate=1,2,4" | "concurrency=1,4,16")`: the option values, each
  a one-line `TulvingError` when malformed.
- `arrival_offsets(rate, arrival, seed)`: the send times of an open-loop load,
  in seconds after the start, as vLLM's `bench serve` draws them: the first
  request at 0, then gaps drawn from a gamma distribution of mean 1/rate and
  shape B (`scale = 1/(rate*B)`, so the gaps' squared coefficient of variation
  is 1/B): B = 1 is a Poisson process, B < 1 burstier, B > 1 more regular;
  `constant` spaces them exactly 1/rate apart; an infinite rate sends
  everything at once. Seeded: the same seed gives the same schedule.
- `LoadPoint`: one measured load (rate, arrival, concurrency cap, request
  count or duration), and `points(base, sweep)` the list a sweep makes.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from providers.base import TulvingError

SWEEP_KINDS = ("rate", "concurrency")


@dataclass(frozen=True, slots=True)
class Arrival:
    kind: str                 # "poisson" | "gamma" | "constant"
    burstiness: float = 1.0   # gamma's shape B (poisson: 1)

    def __str__(self) -> str:
        return f"gamma:{self.burstiness:g}" if self.kind == "gamma" else self.kind


@dataclass(frozen=True, slots=True)
class LoadPoint:
    rate: float = math.inf            # requests/s; inf: all at once
    arrival: Arrival = Arrival("poisson")
    max_concurrency: int | None = None  # requests the client holds in flight at most
    requests: int | None = 100         # how many (or None with a duration)
    duration: float | None = None      # seconds of arrivals (then the requests in flight finish)
    seed: int = 0

    @property
    def label(self) -> str:
        rate = "inf" if math.isinf(self.rate) else f"{self.rate:g}/s"
        conc = f" c{self.max_concurrency}" if self.max_concurrency else ""
        return f"{rate}{conc}"


def _number(option: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TulvingError(f"{option}: not a number: {text!r}") from None
    if math.isnan(value):
        raise TulvingError(f"{option}: not a number: {text!r}")
    return value


def parse_rate(text: str, option: str = "--rate") -> float:
    if text.strip().lower() in ("inf", "infinity"):
        return math.inf
    value = _number(option, text)
    if not (0 < value < math.inf):
        raise TulvingError(f"{option} must be a positive number of requests per second or 'inf', got {text!r}")
    return value


def parse_arrival(text: str) -> Arrival:
    kind, sep, arg = text.strip().partition(":")
    if kind in ("poisson", "constant") and not sep:
        return Arrival(kind)
    if kind == "gamma" and sep:
        burstiness = _number("--arrival gamma:B", arg)
        if not (0 < burstiness < math.inf):
            raise TulvingError(f"--arrival gamma:B needs a positive finite B, got {arg!r}")
        return Arrival("gamma", burstiness)
    raise TulvingError(f"--arrival must be poisson, constant or gamma:B (B > 0, e.g. gamma:0.5), got {text!r}")


def parse_sweep(text: str) -> tuple[str, list[float]]:
    """("rate", [1.0, 2.0]) or ("concurrency", [1.0, 4.0])."""
    kind, sep, values = text.partition("=")
    kind = kind.strip()
    if not sep or kind not in SWEEP_KINDS or not values.strip():
        raise TulvingError(f"--sweep must be rate=R1,R2,... or concurrency=C1,C2,..., got {text!r}")
    parsed: list[float] = []
    for item in values.split(","):
        if kind == "rate":
            parsed.append(parse_rate(item, "--sweep rate"))
        else:
            try:
                c = int(item)
            except ValueError:
                raise TulvingError(f"--sweep concurrency: not an integer: {item!r}") from None
            if c < 1:
                raise TulvingError(f"--sweep concurrency values must be at least 1, got {item!r}")
            parsed.append(float(c))
    return kind, parsed


def points(base: LoadPoint, sweep: tuple[str, list[float]] | None) -> list[LoadPoint]:
    if sweep is None:
        return [base]
    kind, values = sweep
    if kind == "rate":
        return [dataclasses.replace(base, rate=v) for v in values]
    return [dataclasses.replace(base, max_concurrency=int(v)) for v in values]


def arrival_offsets(rate: float, arrival: Arrival, seed: int) -> Iterator[float]:
    """Send times in seconds after the start, endless (the caller stops it)."""
    if math.isinf(rate):
        yield from itertools.repeat(0.0)
        return
    t = 0.0
    if arrival.kind == "constant":
        for i in itertools.count():
            yield i / rate
    import numpy as np  # here: parsing --rate must not load numpy (tests/test_startup.py)

    rng = np.random.default_rng(seed)
    shape = 1.0 if arrival.kind == "poisson" else arrival.burstiness
    scale = 1.0 / (rate * shape)
    yield t
    while True:
        for gap in rng.gamma(shape, scale, size=1024).tolist():  # drawn in blocks: cheap per request
            t += gap
            yield t


def schedule(point: LoadPoint) -> Iterator[float]:
    """The point's send offsets: `requests` of them, or those before `duration`
    (endless at an infinite rate: the runner then stops sending by the clock)."""
    offsets = arrival_offsets(point.rate, point.arrival, point.seed)
    if point.requests is not None:
        yield from itertools.islice(offsets, point.requests)
        return
    assert point.duration is not None
    if math.isinf(point.rate):
        yield from offsets
        return
    for t in offsets:
        if t >= point.duration:
            return
        yield t
