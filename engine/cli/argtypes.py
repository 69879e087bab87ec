"""argparse value types shared by the command modules (a bad value is a one-line
usage error naming the option), and the options several commands share."""
from __future__ import annotations

import argparse
import math
from typing import TypeVar

_N = TypeVar("_N", int, float)


def _number(text: str, kind: type[_N], minimum: float, what: str) -> _N:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}")
    return value


def positive_int(text: str) -> int:
    return _number(text, int, 1, "an integer")


def non_negative_int(text: str) -> int:
    return _number(text, int, 0, "an integer")


def non_negative_float(text: str) -> float:
    return _number(text, float, 0, "a number")


def csv_list(text: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def add_allow_unpriced(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-unpriced", action="store_true",
                        help="call models without a known price (counted as $0; the estimate and summary name "
                             "them) instead of stopping")
