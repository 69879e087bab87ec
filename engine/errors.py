"""User-facing errors. The CLI prints `str(err)` (one line) and exits non-zero."""


class TulvingError(Exception):
    """Bad input or a condition the user must fix: a malformed config, book or
    universe, an unknown model, a missing key or model file."""

    exit_code = 2
