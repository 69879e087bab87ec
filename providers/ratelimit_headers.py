"""The rate limits a reply's headers report, as a `providers.base.RateLimitInfo`.

Two header families (from the OpenAI and Anthropic API references):

- OpenAI (and the OpenAI-compatible servers that copy it):
  `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`; the reset is a
  relative duration ("1s", "6m0s", "12ms"), the time until the budget is full
  again. OpenAI has one token limit (prompt and completion together).
- Anthropic: `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
  {limit,remaining,reset}`; the reset is an absolute RFC 3339 time. "tokens"
  is the most restrictive token limit in force; input and output tokens have
  limits of their own.

Resets become seconds from when the headers are read. A header that is absent
or unreadable (not a finite non-negative number, a duration or a time) is
left None: a server's garbage never fails a call. The duration and time
parsers here also serve providers/http_errors.py, which reads the reset
headers for a 429's wait.
"""
from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from datetime import datetime
from email.utils import parsedate_to_datetime

from providers.base import RateLimitInfo

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")  # "ms" before "m"
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

# (RateLimitInfo field prefix, the limit / remaining / reset header names), built once: this runs on every reply.
_OPENAI = tuple((kind, f"x-ratelimit-limit-{kind}", f"x-ratelimit-remaining-{kind}", f"x-ratelimit-reset-{kind}")
                for kind in ("requests", "tokens"))
_ANTHROPIC = tuple((field, f"anthropic-ratelimit-{group}-limit", f"anthropic-ratelimit-{group}-remaining",
                    f"anthropic-ratelimit-{group}-reset")
                   for field, group in (("requests", "requests"), ("tokens", "tokens"),
                                        ("input_tokens", "input-tokens"), ("output_tokens", "output-tokens")))

# Every header name read above: a reply (a plain dict of lower-case names) that
# has none of them is passed over with one set operation, not 18 look-ups.
_NAMES = frozenset(name for group in (*_OPENAI, *_ANTHROPIC) for name in group[1:])


def parse_duration(value: str) -> float | None:
    """OpenAI's reset durations ("1s", "6m0s", "20ms", "1h2m3.5s", Go's
    time.Duration format) or a bare number of seconds -> seconds; None when
    unreadable."""
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)  # a bare number of seconds
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(value):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    return total if pos == len(value) and math.isfinite(total) else None


def seconds_until(when: datetime, now: float | None) -> float:
    """Seconds from `now` (Unix time; default the clock) until `when`, 0.0 if past."""
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def parse_rfc3339(value: str, now: float | None) -> float | None:
    """Seconds from `now` until an RFC 3339 instant with a time zone
    ("2026-11-24T22:10:49Z"), 0.0 if past; None when unreadable."""
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        return seconds_until(when, now) if when.tzinfo is not None else None
    except (ValueError, OverflowError):
        return None


def _count(value: str | None) -> float | None:
    """A limit or a remaining count: a finite number >= 0, else None."""
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def rate_limit_info(headers: Mapping[str, str], *, now: float | None = None) -> RateLimitInfo | None:
    """What `headers` (lower-case names, or a case-insensitive mapping) say of
    the rate limits; None when they carry no readable rate-limit header.
    `now` (Unix time) is when the reply arrived, for Anthropic's absolute
    resets (default: the clock)."""
    if type(headers) is dict and _NAMES.isdisjoint(headers):  # (a case-insensitive mapping is read name by name)
        return None
    get = headers.get
    fields: dict[str, float] = {}
    for field, limit_name, remaining_name, reset_name in _OPENAI:
        limit_text, remaining_text, reset_text = get(limit_name), get(remaining_name), get(reset_name)
        if limit_text is None and remaining_text is None and reset_text is None:
            continue
        _put(fields, field, _count(limit_text), _count(remaining_text),
             parse_duration(reset_text) if reset_text else None)
    for field, limit_name, remaining_name, reset_name in _ANTHROPIC:
        limit_text, remaining_text, reset_text = get(limit_name), get(remaining_name), get(reset_name)
        if limit_text is None and remaining_text is None and reset_text is None:
            continue
        if reset_text and now is None:
            # The server's clock, when its reply says it (Date): a client clock
            # running behind would make every reset look longer, a minute an hour.
            now = _server_time(get("date"))
            if now is None:
                now = time.time()  # one clock reading for every group
        _put(fields, field, _count(limit_text), _count(remaining_text),
             parse_rfc3339(reset_text, now) if reset_text else None)
    return RateLimitInfo(**fields) if fields else None


def _server_time(value: str | None) -> float | None:
    """The reply's Date header (RFC 9110 IMF-fixdate) as Unix time, or None."""
    if not value:
        return None
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


def _put(fields: dict[str, float], field: str, limit: float | None, remaining: float | None,
         reset: float | None) -> None:
    """Keep a group's readable values (OpenAI's first, where a server sent both families)."""
    for what, value in (("limit", limit), ("remaining", remaining), ("reset", reset)):
        if value is not None:
            fields.setdefault(f"{field}_{what}", value)
