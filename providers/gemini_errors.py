"""Classifying the Gemini API's error replies (kind "gemini").

Google's APIs answer an error with a google.rpc.Status in a JSON envelope
(checked 2026-11-26 in ai.google.dev/gemini-api/docs/troubleshooting and the
google-genai SDK's errors.APIError, which reads the same fields):

    {"error": {"code": 429, "message": "...", "status": "RESOURCE_EXHAUSTED",
               "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}, ...]}}

`status_error` classifies it by HTTP status as for the other wires; here the
google.rpc `status` refines it and a RetryInfo's `retryDelay` is the wait of a
429 (the API sends no retry-after header):
- RESOURCE_EXHAUSTED (429) -> rate_limited, waiting `retryDelay`;
- UNAVAILABLE / INTERNAL / DEADLINE_EXCEEDED (503/500/504) -> overloaded (retried);
- INVALID_ARGUMENT (400) -> bad request, or prompt_too_long when the message
  says the input token count exceeds the model's maximum;
- PERMISSION_DENIED (403) / UNAUTHENTICATED (401) -> auth; NOT_FOUND (404) ->
  bad request (final).
"""
from __future__ import annotations

import re
from collections.abc import Mapping

import orjson

from providers.base import AUTH, BAD_REQUEST, OVERLOADED, PROMPT_TOO_LONG, RATE_LIMITED, ProviderError
from providers.http_errors import status_error

RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")  # a protobuf Duration in JSON: "30s", "1.5s"
_TOO_LONG = re.compile(r"input token count.*exceeds the maximum", re.IGNORECASE)
_KIND_OF_STATUS = {"RESOURCE_EXHAUSTED": RATE_LIMITED, "UNAVAILABLE": OVERLOADED, "INTERNAL": OVERLOADED,
                   "DEADLINE_EXCEEDED": OVERLOADED, "PERMISSION_DENIED": AUTH, "UNAUTHENTICATED": AUTH,
                   "NOT_FOUND": BAD_REQUEST}
# The HTTP status each google.rpc status comes with (for an error inside a 2xx stream).
HTTP_OF_STATUS = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "OUT_OF_RANGE": 400,
                  "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "NOT_FOUND": 404,
                  "RESOURCE_EXHAUSTED": 429, "CANCELLED": 499, "INTERNAL": 500, "UNAVAILABLE": 503,
                  "DEADLINE_EXCEEDED": 504}


def _error_object(body: bytes) -> dict[str, object]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    if isinstance(data, list) and data and isinstance(data[0], dict):  # a stream's array form
        data = data[0]
    error = data.get("error") if isinstance(data, dict) else None
    return error if isinstance(error, dict) else {}


def retry_delay(error: Mapping[str, object]) -> float | None:
    """The seconds a google.rpc.RetryInfo among `details` asks to wait, if any."""
    details = error.get("details")
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict) and detail.get("@type") == RETRY_INFO:
            found = _DURATION.match(str(detail.get("retryDelay", "")))
            if found:
                return float(found.group(1))
    return None


def _reason(error: Mapping[str, object]) -> str:
    """The reason of a google.rpc.ErrorInfo among `details`, or ""."""
    details = error.get("details")
    for detail in details if isinstance(details, list) else []:
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("google.rpc.ErrorInfo"):
            return str(detail.get("reason") or "")
    return ""


def gemini_status_error(status: int, body: bytes, headers: Mapping[str, str], *, endpoint: str,
                        secret: str | None, request_id: str | None = None) -> ProviderError:
    """A non-2xx Gemini reply as a classified ProviderError (one line, key scrubbed)."""
    error = status_error(status, body, headers, endpoint=endpoint, secret=secret, request_id=request_id)
    fields = _error_object(body)
    rpc_status = str(fields.get("status") or "")
    if rpc_status and rpc_status not in error.message:
        error.message = f"{error.message} [{rpc_status}]"
        error.args = (error.message,)
    kind = _KIND_OF_STATUS.get(rpc_status)
    if kind is not None and error.kind != kind:
        error.kind = kind
    if _reason(fields) == "API_KEY_INVALID":  # Google answers a wrong key with 400
        error.kind = AUTH
    if rpc_status == "INVALID_ARGUMENT" and _TOO_LONG.search(str(fields.get("message") or "")):
        error.kind = PROMPT_TOO_LONG
    if error.kind == RATE_LIMITED and error.retry_after is None:
        error.retry_after = retry_delay(fields)
    return error


def gemini_stream_error(payload: Mapping[str, object], *, endpoint: str, secret: str | None,
                        request_id: str | None = None) -> ProviderError:
    """An `{"error": ...}` event inside a 2xx stream, classified as the same
    error would be as a reply (no status of its own)."""
    error_obj = payload.get("error")
    fields = error_obj if isinstance(error_obj, dict) else {}
    code = fields.get("code")
    status = code if type(code) is int and code >= 400 else HTTP_OF_STATUS.get(str(fields.get("status")), 500)
    error = gemini_status_error(status, orjson.dumps(payload), {}, endpoint=f"{endpoint}: error event mid-stream",
                                secret=secret, request_id=request_id)
    error.status = None
    return error
