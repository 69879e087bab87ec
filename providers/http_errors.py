"""Turning HTTP failures into `providers.base` error kinds.

Shared by the OpenAI-format and Anthropic-format providers:

- `status_error(status, body, headers, ...)`: a non-2xx reply -> ProviderError
  (429 -> rate_limited with the server's wait, 5xx/529 -> overloaded, 401/403 ->
  auth, 400/404/422 -> bad_request unless the body says the prompt is too long
  or the content policy refused it, 413 -> prompt_too_long, 408 -> timeout).
  One exception to "429 is retryable": OpenAI's 429 `insufficient_quota` (no
  credit left) is classified auth, since waiting cannot fix it.
- `exception_error(exc, ...)`: an exception raised while calling, by
  providers/http_pool.py, aiohttp or asyncio -> ProviderError (timeouts ->
  timeout; refused connections, TLS failures, resets, replies cut short or
  not HTTP -> connection).
- Every error from a reply carries what its headers said of the rate limits
  (`rate_limits`, providers/ratelimit_headers.py).
- `stream_error(data, ...)`: an error event in the middle of a 2xx stream,
  classified by its type as the same error in a reply would be.
- `retry_after(headers)`: how long the server asked us to wait, from
  `retry-after[-ms]` or, failing that, the OpenAI / Anthropic rate-limit reset
  headers. A 429 whose headers name no retry-after but whose OpenAI error
  message says "Please try again in 644ms" (or "1.574s", "6m0s": Go durations)
  waits that long, not the whole bucket's refill the reset headers tell.
- `x-should-retry` ("true" / "false", exactly; the official SDKs' private
  header): the server's word on retrying overrides the status's own
  (`ServerDecided`), as both SDKs' `_should_retry` do.

Every message is one line, length-capped and scrubbed of the API key, even when
the server echoes the key back (`redact`).
"""
from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from email.utils import parsedate_to_datetime

import orjson

from providers.base import (
    AUTH,
    BAD_REPLY,
    BAD_REQUEST,
    CONFIG,
    CONNECTION,
    CONTENT_FILTER,
    OVERLOADED,
    PROMPT_TOO_LONG,
    RATE_LIMITED,
    RETRYABLE,
    TIMEOUT,
    ErrorKind,
    ProviderError,
)
from providers.model_registry import model_in_message, not_found_hint
from providers.ratelimit_headers import parse_duration, parse_rfc3339, rate_limit_info, seconds_until

_MAX_MESSAGE = 300

# Codes / phrases by which OpenAI, Anthropic and the common OpenAI-compatible
# servers (vLLM, llama.cpp, Ollama, OpenRouter) say "the prompt does not fit".
_CONTEXT_CODES = {"context_length_exceeded", "string_above_max_length", "exceed_context_size_error"}
_CONTEXT_PHRASES = re.compile(
    r"prompt is too long|maximum context length|context length|context window|context size|exceeds the context"
    r"|too many tokens|input is too long|reduce the length of the messages", re.IGNORECASE)
_FILTER_CODES = {"content_filter", "content_policy_violation", "content_policy", "safety", "responsible_ai_policy_violation"}

# Key-looking strings scrubbed from messages in addition to the exact key.
_SECRET_PATTERNS = re.compile(
    r"(?i)\bBearer\s+\S+|\bsk-[A-Za-z0-9_\-*.]{6,}|\bx-api-key\W+\S+")


def redact(text: str, secret: str | None) -> str:
    """`text` on one line, capped, with `secret` and key-like tokens removed."""
    if secret:
        if len(secret) >= 8:  # a real key: wherever it appears
            text = text.replace(secret, "***")
        else:  # a short one only where it stands as a key, not inside words ("e" of "expected")
            text = re.sub(rf"(?<![\w\-]){re.escape(secret)}(?![\w\-])", "***", text)
    text = _SECRET_PATTERNS.sub("***", text)
    text = " ".join(text.split())
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE - 3] + "..."
    return text


# -- retry-after -----------------------------------------------------------------

def _parse_retry_after(value: str, now: float | None) -> float | None:
    """A `retry-after` value: delay seconds or an HTTP date."""
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return None if when is None else seconds_until(when, now)


# "Please try again in 644ms." / "in 18.642s." / "in 6m0s." in OpenAI's 429
# messages (seen in users' reports of the API's errors, 2023-2025; checked 2026-11-26).
_TRY_AGAIN = re.compile(r"try again in ((?:\d+(?:\.\d+)?(?:ms|h|m|s))+)\b", re.IGNORECASE)


def try_again_in(message: str) -> float | None:
    """The wait an error message names ("Please try again in 644ms."), in seconds."""
    match = _TRY_AGAIN.search(message)
    return parse_duration(match.group(1)) if match else None


def _exhausted_first(resets: list[tuple[float, bool]]) -> float | None:
    """The wait for the limit that is exhausted (remaining == 0); when the
    server did not say which one, the longest wait."""
    if not resets:
        return None
    exhausted = [wait for wait, empty in resets if empty]
    return max(exhausted) if exhausted else max(wait for wait, _ in resets)


def _header_wait(headers: Mapping[str, str], now: float | None) -> float | None:
    """`retry-after-ms`, else `retry-after`: the wait the server named."""
    value = headers.get("retry-after-ms")
    if value is not None:
        try:
            return max(0.0, float(value) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    return None if value is None else _parse_retry_after(value, now)


def _reset_wait(headers: Mapping[str, str], now: float | None) -> float | None:
    """The OpenAI / Anthropic rate-limit reset headers' wait (the exhausted limit's)."""
    resets: list[tuple[float, bool]] = []
    for kind in ("requests", "tokens"):  # OpenAI style
        value = headers.get(f"x-ratelimit-reset-{kind}")
        wait = parse_duration(value) if value else None
        if wait is not None:
            resets.append((wait, headers.get(f"x-ratelimit-remaining-{kind}") == "0"))
    for kind in ("requests", "tokens", "input-tokens", "output-tokens"):  # Anthropic style
        value = headers.get(f"anthropic-ratelimit-{kind}-reset")
        wait = parse_rfc3339(value, now) if value else None
        if wait is not None:
            resets.append((wait, headers.get(f"anthropic-ratelimit-{kind}-remaining") == "0"))
    return _exhausted_first(resets)


def retry_after(headers: Mapping[str, str], *, now: float | None = None, message: str = "") -> float | None:
    """Seconds the server asked us to wait, or None when it did not say: its
    retry-after header, else the wait its error `message` names ("Please try
    again in 644ms": the call's own wait, where the reset headers tell when the
    whole bucket is full again), else the rate-limit reset headers."""
    wait = _header_wait(headers, now)
    if wait is None and message:
        wait = try_again_in(message)
    return _reset_wait(headers, now) if wait is None else wait


# -- error bodies -----------------------------------------------------------------

def _error_fields(body: bytes) -> tuple[str, str, str]:
    """(message, type, code) from an OpenAI-, Anthropic- or vLLM-shaped error
    body; falls back to the raw text."""
    try:
        data: object = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:_MAX_MESSAGE * 2].decode("utf-8", "replace"), "", ""
    error = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(error, str):  # {"error": "message"} (Ollama, llama.cpp)
        return error, "", ""
    if not isinstance(error, dict):
        return str(error), "", ""
    message = error.get("message") or error.get("detail") or ""
    code = error.get("code")
    return str(message), str(error.get("type") or ""), "" if code is None else str(code)


class ServerDecided(ProviderError):
    """An error whose retrying the server decided with `x-should-retry`,
    whatever its kind alone would say (a 400 it asks to retry, a 429 or 503
    it asks not to)."""

    def __init__(self, error: ProviderError, *, should_retry: bool):
        super().__init__(error.kind, error.message, status=error.status, retry_after=error.retry_after,
                         request_id=error.request_id, rate_limits=error.rate_limits)
        self.should_retry = should_retry

    @property
    def retryable(self) -> bool:
        return self.should_retry


def _kind_of(status: int, lowered: set[str], message: str) -> ErrorKind:
    """The error kind of a status, refined by the body's code / type / message."""
    if status == 429:  # insufficient_quota: billing, not pacing: retrying cannot help
        return AUTH if "insufficient_quota" in lowered else RATE_LIMITED
    if status in (401, 402, 403):  # 402: Anthropic's billing_error
        return AUTH
    if status == 413:  # Anthropic request_too_large
        return PROMPT_TOO_LONG
    if status == 408:
        return TIMEOUT
    if status >= 500:  # 500/502/503/504 and Anthropic's 529 overloaded
        return OVERLOADED
    if lowered & _CONTEXT_CODES or _CONTEXT_PHRASES.search(message):
        return PROMPT_TOO_LONG
    if lowered & _FILTER_CODES:
        return CONTENT_FILTER
    return BAD_REQUEST


def status_error(status: int, body: bytes, headers: Mapping[str, str], *, endpoint: str,
                 secret: str | None, request_id: str | None = None) -> ProviderError:
    """Classify a non-2xx HTTP reply."""
    message, etype, code = _error_fields(body)
    detail = message or f"HTTP {status}"
    if code and code not in detail and not code.isdigit():
        detail = f"{detail} [{code}]"
    elif etype and etype not in detail:
        detail = f"{detail} [{etype}]"
    lowered = {code.lower(), etype.lower()}
    kind = _kind_of(status, lowered, message)
    if status == 404 and ("model_not_found" in lowered or ("not_found_error" in lowered
                                                           and message.startswith("model:"))):
        # a retired or unknown model: final, with what to use instead
        detail = f"{detail} -- {not_found_hint(model_in_message(message))}"
    wait = retry_after(headers, message=message) if kind in (RATE_LIMITED, OVERLOADED) else None
    # The server's word on retrying wins, exactly as the openai and anthropic
    # SDKs' `_should_retry` (openai 3.57 / anthropic 2.14 _base_client.py):
    # "true" retries any status, "false" none; other values are ignored.
    said = headers.get("x-should-retry")
    should = None if said not in ("true", "false") else said == "true"
    if should is not None and should != (kind in RETRYABLE):
        detail += f" (the server says {'to retry' if should else 'not to retry'}: x-should-retry {said})"
    else:
        should = None
    error = ProviderError(kind, redact(f"{endpoint}: {detail}", secret), status=status, retry_after=wait,
                          request_id=request_id, rate_limits=rate_limit_info(headers))  # a 429 still says where they stand
    return error if should is None else ServerDecided(error, should_retry=should)


# An error event inside a 2xx stream has no status of its own: its type names
# the status the API replies with when the same error comes before the stream.
STATUS_OF_ERROR_TYPE = {"rate_limit_error": 429, "rate_limit_exceeded": 429, "overloaded_error": 529,
                        "api_error": 500, "server_error": 500, "timeout_error": 504,
                        "invalid_request_error": 400, "authentication_error": 401, "billing_error": 402,
                        "permission_error": 403, "not_found_error": 404, "request_too_large": 413}


def stream_error(data: bytes, *, endpoint: str, secret: str | None, request_id: str | None = None) -> ProviderError:
    """Classify an error event in the middle of a stream (Anthropic's
    `event: error`, OpenAI's `data: {"error": ...}`) as `status_error` would
    the same error as a reply; one of an unknown type is the server's
    (overloaded, retryable)."""
    _, etype, code = _error_fields(data)
    status = STATUS_OF_ERROR_TYPE.get(etype) or STATUS_OF_ERROR_TYPE.get(code) or 500
    error = status_error(status, data, {}, endpoint=f"{endpoint}: error event mid-stream", secret=secret,
                         request_id=request_id)
    error.status = None
    return error


def exception_error(exc: BaseException, *, endpoint: str, timeout: float, secret: str | None) -> ProviderError:
    """Classify an exception raised while sending or reading a call."""
    if isinstance(exc, TimeoutError):  # asyncio.TimeoutError is TimeoutError since Python 3.11
        # The pool's own limits say which one ran out (connect_timeout, ...).
        detail = str(exc) or f"no complete reply within {timeout:g} s"
        return ProviderError(TIMEOUT, redact(f"{endpoint}: {detail}", secret))
    # aiohttp's errors can only come from aiohttp once it is loaded: importing it
    # here for isinstance would cost every command that never calls (`tulving --help`).
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(exc, (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError)):
        return ProviderError(CONFIG, redact(f"{endpoint}: invalid URL {exc}", secret))
    if aiohttp is not None and isinstance(exc, aiohttp.ClientPayloadError):
        return ProviderError(CONNECTION, redact(f"{endpoint}: reply body cut short ({exc})", secret))
    if isinstance(exc, OSError) or aiohttp is not None and isinstance(exc, aiohttp.ClientError):
        what = type(exc).__name__
        return ProviderError(CONNECTION, redact(f"{endpoint}: {what}: {exc}", secret))
    return ProviderError(BAD_REPLY, redact(f"{endpoint}: {type(exc).__name__}: {exc}", secret))


def bad_reply(endpoint: str, what: str, *, secret: str | None, request_id: str | None = None,
              status: int | None = None) -> ProviderError:
    """A 2xx reply whose body is not what the API promises."""
    return ProviderError(BAD_REPLY, redact(f"{endpoint}: {what}", secret), status=status, request_id=request_id)


def token_count(usage: object, name: str) -> int | None:
    """A reply's `usage[name]`: a non-negative integer, or None when absent.
    Raises ValueError for anything else (a string, a float, a negative number):
    the caller turns it into a bad reply."""
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise ValueError(f"usage is {type(usage).__name__}, not an object")
    value = usage.get(name)
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise ValueError(f"usage.{name} is {value!r}, not a token count")
    return value
