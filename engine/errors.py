"""User-facing errors and exit codes (`TulvingError`, their base, lives with
the shared types in providers/base.py). The CLI prints `str(err)` (one line,
control characters escaped by `printable`) and exits with the error's code.

Exit codes (README, "Using it"):
    0  done: every planned result exists
    1  a fatal provider error, or an internal error
    2  bad input: a malformed config, book, universe or file, an unknown model, a missing key
    3  incomplete: some calls failed for good (rerun to retry them: finished calls are cached)
    4  stopped by --max-cost (rerun with a higher budget to continue)
    5  results could not be stored (cache or output not writable, disk full)
    130 interrupted (Ctrl-C), 141 output pipe closed (`| head`), 143 terminated (SIGTERM)
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from providers.base import TulvingError as TulvingError  # the shared base: every layer raises it

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INCOMPLETE = 3
EXIT_BUDGET = 4
EXIT_STORAGE = 5
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141
EXIT_TERMINATED = 143


class StorageError(TulvingError):
    """Results could not be written (cache, run folder)."""

    exit_code = EXIT_STORAGE


# C0 controls (ESC among them) but tab, DEL and the C1 controls, plus the
# bidirectional overrides that can make a line read differently than it is.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """`text` safe to print on a terminal: control characters (ANSI escapes,
    carriage returns, bells, newlines) shown as `\\x1b`-style escapes, lone
    surrogates replaced. Use it on everything printed that came from outside:
    server error bodies, model output, file and model names."""
    text = str(text)
    if _CONTROL.search(text):
        text = _CONTROL.sub(_escape, text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """"did you mean 'X'?" for the known name closest to a mistyped `word`,
    else "": the start of an error's next step."""
    import difflib  # only on the way to an error

    close = difflib.get_close_matches(word, list(dict.fromkeys(choices)), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""
