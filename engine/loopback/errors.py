"""Error replies of the loopback server, in each API's shape.

Contract:
- `openai_error(status, message, type=, code=, param=, headers=)`:
  `{"error": {"message", "type", "param", "code"}}` (type "server_error"
  for 5xx unless given); `anthropic_error(status, message, headers=)`:
  `{"type": "error", "error": {"type", "message"}}` with the API's error type
  for the status (402: billing_error, 504: timeout_error, 529:
  overloaded_error) unless `type=` names another.
- `error_response(api, ...)` picks one by API ("openai" | "anthropic"); `error_body(api, ...)`
  is its body as a JSON object (a batch result line's error);
- `file_reply(request, api, body, offered)`: a file's bytes (a batch's JSONL)
  as the first of the `offered` content types the request's Accept allows,
  or 406 when it allows none (`Accept: application/json` for JSONL: the body
  is not one JSON document), as a strict server does;
  `_Reject` carries an error out of request handling; `_json` is the JSON reply.
"""
from __future__ import annotations

from collections.abc import Mapping

import orjson
from aiohttp import web

from providers.base import JSONObject

# Anthropic's error types by status (its errors page; the anthropic SDK's
# ErrorObject, 2.14; checked 2026-11-26): 402 billing_error, 504 timeout_error.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "api_error",
                    504: "timeout_error", 529: "overloaded_error"}


def _json(data: object, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, headers=headers, content_type="application/json")


def _openai_body(status: int, message: str, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None) -> JSONObject:
    if status >= 500 and type == "invalid_request_error":
        type = "server_error"
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _anthropic_body(status: int, message: str, type: str | None = None) -> JSONObject:
    kind = type or _ANTHROPIC_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def openai_error(status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, headers: Mapping[str, str] | None = None) -> web.Response:
    return _json(_openai_body(status, message, type, code, param), status, headers)


def anthropic_error(status: int, message: str, headers: Mapping[str, str] | None = None, *,
                    type: str | None = None) -> web.Response:
    return _json(_anthropic_body(status, message, type), status, headers)


def error_body(api: str, status: int, message: str, code: str | None = None, param: str | None = None) -> JSONObject:
    """An error in the API's shape ("openai" | "anthropic"), as a JSON object (the body of its error reply)."""
    if api == "openai":
        return _openai_body(status, message, code=code, param=param)
    return _anthropic_body(status, message)


def error_response(api: str, status: int, message: str, code: str | None = None,
                   param: str | None = None) -> web.Response:
    return _json(error_body(api, status, message, code, param), status)


class _Reject(Exception):
    """Raised inside a handler to send an error reply in the API's shape."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None):
        self.status, self.message, self.code, self.param = status, message, code, param


def _accepted(accept: str) -> list[str]:
    """The media ranges an Accept header allows (q > 0)."""
    ranges = []
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        q = next((p[2:] for p in params if p.startswith("q=")), "1")
        try:
            allowed = float(q) > 0
        except ValueError:
            allowed = True
        if media and allowed:
            ranges.append(media.lower())
    return ranges


def file_reply(request: web.Request, api: str, body: bytes, offered: tuple[str, ...]) -> web.Response:
    """`body` as the first `offered` type the Accept header allows; 406 when none."""
    accept = request.headers.get("Accept")
    if not accept:
        return web.Response(body=body, content_type=offered[0])
    ranges = _accepted(accept)
    for media in offered:
        if "*/*" in ranges or media in ranges or f"{media.split('/')[0]}/*" in ranges:
            return web.Response(body=body, content_type=media)
    message = f"Not acceptable: this file is served as {', '.join(offered)}, the request accepts {accept}"
    return error_response(api, 406, message)
