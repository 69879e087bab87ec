"""Server-sent event streams for the loopback server, in each API's format.

Contract:
- `openai_frames(data, include_usage)` and `anthropic_frames(data)` turn the
  complete (non-streamed) reply the server built into the event frames the
  real API would send for `"stream": true`, so streamed text and usage equal
  the non-streamed reply byte for byte. Each frame is `(bytes, kind)`, kind
  "head" (before the text), "token" (one piece of the text) or "tail".
  - OpenAI: `data: {chat.completion.chunk}` frames: the role delta (empty
    content), one content delta per piece, the finish_reason chunk (empty
    delta), with `stream_options.include_usage` a last chunk with empty
    `choices` and the usage (earlier chunks then carry `"usage": null`), and
    `data: [DONE]`.
  - Anthropic: `event:` + `data:` frames: message_start (usage with the
    input and cache fields, output_tokens 1), content_block_start, ping,
    content_block_delta (text_delta) per piece, content_block_stop,
    message_delta (stop_reason, stop_sequence, final usage), message_stop.
- `split_text(text, n)`: the text in `n` pieces of near-equal length (the
  server passes the reply's output token count, so one delta is one token,
  as on the real APIs); the pieces join back to the text.
- `write_stream(request, headers, frames, first_wait, gap, cut)` sends the
  frames as `text/event-stream`: headers at once, frames up to the first
  token frame straight away, then `first_wait()` seconds before the first
  token (time to first token) and `gap()` before each later one. With `cut`
  ("reset" | "truncate" | "stream_error") the stream breaks once half the
  token frames are out: a TCP RST, a clean close with the stream unfinished,
  or the API's in-stream error event (`error_frame(api)`: Anthropic's
  `event: error` with an overloaded_error, OpenAI's `data: {"error": ...}`)
  and then the end of the body, as the providers do under load. The token
  frames written are counted in `progress`; a client that goes away raises
  ConnectionResetError (or cancels the handler), which the server counts.
"""
from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from aiohttp import web

Frame = tuple[bytes, str]  # (bytes, "head" | "token" | "tail")


def split_text(text: str, n: int) -> list[str]:
    if not text:
        return []
    n = max(1, min(n, len(text)))
    bounds = [len(text) * i // n for i in range(n + 1)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def _data(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def _event(name: str, payload: object) -> bytes:
    return b"event: " + name.encode() + b"\n" + _data(payload)


def error_frame(api: str) -> bytes:
    if api == "openai":
        return _data({"error": {"message": "The server had an error while processing your request. Sorry about "
                                           "that!", "type": "server_error", "param": None, "code": None}})
    return _event("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})


def openai_frames(data: Mapping[str, Any], include_usage: bool) -> list[Frame]:
    choice = data["choices"][0]
    head = {k: data[k] for k in ("id", "created", "model", "system_fingerprint", "service_tier")}
    head["object"] = "chat.completion.chunk"
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, object], finish: str | None = None) -> bytes:
        return _data({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                      **extra})

    frames: list[Frame] = [(chunk({"role": "assistant", "content": "", "refusal": None}), "head")]
    for piece in split_text(choice["message"]["content"] or "", data["usage"]["completion_tokens"]):
        frames.append((chunk({"content": piece}), "token"))
    frames.append((chunk({}, choice["finish_reason"]), "tail"))
    if include_usage:
        frames.append((_data({**head, "choices": [], "usage": data["usage"]}), "tail"))
    frames.append((b"data: [DONE]\n\n", "tail"))
    return frames


def anthropic_frames(data: Mapping[str, Any]) -> list[Frame]:
    usage = data["usage"]
    start = {**data, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**usage, "output_tokens": min(1, usage["output_tokens"])}}
    frames: list[Frame] = [
        (_event("message_start", {"type": "message_start", "message": start}), "head"),
        (_event("content_block_start", {"type": "content_block_start", "index": 0,
                                        "content_block": {"type": "text", "text": ""}}), "head"),
        (_event("ping", {"type": "ping"}), "head"),
    ]
    for piece in split_text(data["content"][0]["text"], usage["output_tokens"]):
        frames.append((_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                      "delta": {"type": "text_delta", "text": piece}}), "token"))
    final = {k: usage[k] for k in ("input_tokens", "output_tokens", "cache_creation_input_tokens",
                                   "cache_read_input_tokens")}
    frames += [
        (_event("content_block_stop", {"type": "content_block_stop", "index": 0}), "tail"),
        (_event("message_delta", {"type": "message_delta", "usage": final,
                                  "delta": {"stop_reason": data["stop_reason"],
                                            "stop_sequence": data["stop_sequence"]}}), "tail"),
        (_event("message_stop", {"type": "message_stop"}), "tail"),
    ]
    return frames


class Progress:
    """Token frames written so far (read by the caller when the stream breaks)."""
    sent: int = 0


async def write_stream(request: web.Request, headers: Mapping[str, str], frames: Sequence[Frame],
                       first_wait: Callable[[], float] | None, gap: Callable[[], float] | None,
                       cut: str | None = None, progress: Progress | None = None,
                       api: str = "openai") -> web.StreamResponse:
    """Send `frames`, counting token frames in `progress`. See the module docstring."""
    progress = progress if progress is not None else Progress()
    response = web.StreamResponse(status=200, headers={**headers, "Cache-Control": "no-cache"})
    response.content_type = "text/event-stream"
    response.charset = "utf-8"
    await response.prepare(request)
    total_tokens = sum(1 for _, kind in frames if kind == "token")
    cut_at = total_tokens // 2 if cut else None
    waited = False
    for frame, kind in frames:
        if kind != "head":
            if kind == "token" and progress.sent == cut_at:
                if cut == "stream_error":
                    await response.write(error_frame(api))
                    await response.write_eof()
                    return response
                _drop(request, cut)
                raise ConnectionResetError(f"loopback: stream cut ({cut})")
            if kind == "token" or not waited:  # an empty reply still waits its time to first token
                delay = gap if waited else first_wait
                wait = delay() if delay is not None else 0.0
                if wait > 0:
                    await asyncio.sleep(wait)
                waited = True
        await response.write(frame)
        progress.sent += kind == "token"
    await response.write_eof()
    return response


def _drop(request: web.Request, how: str | None) -> None:
    transport = request.transport
    if transport is None:
        return
    if how == "reset":
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    else:
        transport.close()
