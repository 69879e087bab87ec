"""Secondary entities: the name list and the `$entity_X` substitution.

Protocol: `random.seed(1)`, 500,000 first names; `random.seed(2)`, 500,000 last
names; zipped "First Last", repeats dropped keeping order, first 100,000 kept.
Walking the valid chapters in order, each chapter takes the next names, one
per distinct `$entity_X`; `$entity_X` becomes the X-th name it took. When a
chapter skips numbers (uses $entity_1 and $entity_3 only), X is read as its
rank among the numbers used, so every placeholder gets a name.
"""
from __future__ import annotations

import random
import re
from collections.abc import Sequence
from functools import lru_cache

N_DRAWS = 500_000
N_NAMES = 100_000
PLACEHOLDER = re.compile(r"\$entity_(\d+)")


@lru_cache(maxsize=4)
def _names(first: tuple[str, ...], last: tuple[str, ...]) -> tuple[str, ...]:
    rng = random.Random(1)
    firsts = rng.choices(first, k=N_DRAWS)
    rng = random.Random(2)
    lasts = rng.choices(last, k=N_DRAWS)
    unique = dict.fromkeys(f"{a} {b}" for a, b in zip(firsts, lasts))
    return tuple(list(unique)[:N_NAMES])


def secondary_names(first_names: Sequence[str], last_names: Sequence[str]) -> tuple[str, ...]:
    """The list of secondary names (at most 100,000)."""
    return _names(tuple(first_names), tuple(last_names))


def placeholder_numbers(text: str) -> list[int]:
    """The distinct X of `$entity_X` in `text`, ascending."""
    return sorted({int(x) for x in PLACEHOLDER.findall(text)})


def fill_placeholders(text: str, names: Sequence[str]) -> str:
    """Replace each `$entity_X` by the name of X's rank (see module docstring)."""
    rank = {x: i for i, x in enumerate(placeholder_numbers(text))}
    return PLACEHOLDER.sub(lambda m: names[rank[int(m.group(1))]], text)


class NameDealer:
    """Hands out the secondary names chapter by chapter, in book order."""

    def __init__(self, names: Sequence[str]):
        self._names = names
        self._next = 0

    def take(self, count: int) -> list[str]:
        if self._next + count > len(self._names):
            raise ValueError(f"secondary name list exhausted ({len(self._names)} names)")
        taken = list(self._names[self._next:self._next + count])
        self._next += count
        return taken

    def fill(self, text: str) -> tuple[str, list[str]]:
        """(text with names, the names taken) for the next chapter."""
        taken = self.take(len(placeholder_numbers(text)))
        return fill_placeholders(text, taken), taken
