"""Prices that change by date and by prompt length, and the cost of one call.

A model alias has base prices (`price_in`, `price_out`, ...) and, optionally,
price bands (`prices = [...]` in a config, `"prices"` in the registry): each
band holds the prices in force from `since` to `until` (dates YYYY-MM-DD,
both days included, either open) for prompts over `above` tokens (0: any
prompt). A call is priced by the band in force on its day for its prompt
length: among the bands whose dates hold the day and whose `above` the prompt
exceeds, the one with the highest `above` (then the latest `since`) wins; a
price a band leaves unset is the base one. No band: the base prices.

    band = price_band(alias.prices, input_tokens=300_000, day="2026-11-28")
    band.label                         # ">272,000 tokens", "until 2026-12-31", "" (base)

Examples, as the providers price them (sources beside each in the registry):
OpenAI bills a whole gpt-6.1 request over 272K input tokens at the long-context
rates; Google's Gemini 3.8 Flash costs half until 2026-12-31; Anthropic cut
Sonnet 5.5's cache reads on 2026-10-07.

Where a provider reports what a call cost (OpenRouter's `usage.cost`), that
figure is what is counted (`ChatResult.reported_cost`); the table's price is
the estimate before the call and the cross-check after it
(`disagrees`: beyond DISAGREE_SHARE, the summary says so).
"""
from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PRICE_FIELDS = ("price_in", "price_out", "price_cached_in", "price_cache_write", "price_cache_write_1h")
BAND_KEYS = ("above", "since", "until", "source", *PRICE_FIELDS)
DISAGREE_SHARE = 0.10    # a reported cost off the table's by more than this share is reported
DISAGREE_USD = 0.0001    # ...and by more than this many dollars (rounding on tiny calls is not news)


@dataclass(frozen=True, slots=True)
class PriceBand:
    """Prices in force over [since, until] for prompts over `above` tokens."""

    above: int = 0
    since: str | None = None
    until: str | None = None
    price_in: float | None = None
    price_out: float | None = None
    price_cached_in: float | None = None
    price_cache_write: float | None = None
    price_cache_write_1h: float | None = None
    source: str | None = None  # where the price was read, and when

    def holds(self, day: str, input_tokens: int) -> bool:
        return (input_tokens > self.above and (self.since is None or self.since <= day)
                and (self.until is None or day <= self.until))

    @property
    def label(self) -> str:
        """What sets this band apart, for tables: ">272,000 tokens", "until 2026-12-31"."""
        parts = []
        if self.above:
            parts.append(f">{self.above:,} tokens")
        if self.since:
            parts.append(f"since {self.since}")
        if self.until:
            parts.append(f"until {self.until}")
        return ", ".join(parts)

    @property
    def short(self) -> str:
        """The label in one word, for a table cell: ">272K", "<=2026-12-31", ">204.8K,>=2027-01-01"."""
        parts = []
        if self.above:
            parts.append(f">{self.above / 1000:g}K" if self.above >= 1000 else f">{self.above}")
        if self.since:
            parts.append(f">={self.since}")
        if self.until:
            parts.append(f"<={self.until}")
        return ",".join(parts)

    def prices(self) -> dict[str, Any]:
        """The prices this band sets (the others are the base's), by field name (floats)."""
        return {name: value for name in PRICE_FIELDS if (value := getattr(self, name)) is not None}


def today() -> str:
    """The call's day, as prices are dated (UTC)."""
    return datetime.datetime.now(datetime.UTC).date().isoformat()


def price_band(bands: Sequence[PriceBand], input_tokens: int, day: str | None = None) -> PriceBand | None:
    """The band in force on `day` (default today) for a prompt of
    `input_tokens`, or None (the base prices apply)."""
    if not bands:
        return None
    day = day or today()
    best: PriceBand | None = None
    for band in bands:
        if band.holds(day, input_tokens) and (best is None or (band.above, band.since or "")
                                              > (best.above, best.since or "")):
            best = band
    return best


def band_of(table: Mapping[str, object]) -> PriceBand:
    """A band from a checked table (engine/config.py checks its keys and values)."""
    def number(key: str) -> float | None:
        value = table.get(key)
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    def text(key: str) -> str | None:
        value = table.get(key)
        if isinstance(value, datetime.date):
            return value.isoformat()
        return value if isinstance(value, str) else None

    above = table.get("above")
    return PriceBand(above=above if isinstance(above, int) and not isinstance(above, bool) else 0,
                     since=text("since"), until=text("until"), source=text("source"),
                     **{name: number(name) for name in PRICE_FIELDS})


def bands_label(bands: Iterable[PriceBand]) -> str:
    """Every band in one cell: "until 2026-12-31: 0.75/3.75; >200,000 tokens: 2.5/15"."""
    cells = []
    for band in bands:
        prices = band.prices()
        cells.append(f"{band.short}: {prices.get('price_in', '-'):g}/{prices.get('price_out', '-'):g}"
                     if "price_in" in prices and "price_out" in prices
                     else f"{band.short}: " + ", ".join(f"{k.removeprefix('price_')} {v:g}" for k, v in prices.items()))
    return "; ".join(cells)


def disagrees(reported: float, table: float) -> bool:
    """Whether a provider's reported cost is off the table's price by more
    than the tolerance (both a share and an absolute amount)."""
    gap = abs(reported - table)
    return gap > DISAGREE_USD and gap > DISAGREE_SHARE * max(reported, table)
