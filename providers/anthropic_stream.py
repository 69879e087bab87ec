"""Assembling an Anthropic Messages stream (server-sent events) into the
`message` the same call would have returned without streaming.

message_start carries the message and its input usage (prompt-cache counts
included); content_block_start / content_block_delta the blocks and their
text (or thinking) pieces; message_delta the stop reason and the final,
cumulative usage; message_stop the end. Events after message_stop are ignored.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from providers.base import JSONObject, JSONValue, ProviderError

_TEXT_FIELDS = {"text_delta": "text", "thinking_delta": "thinking"}


@dataclass(slots=True)
class MessageAssembler:
    """The state of one stream. `malformed(what)` builds the error of a
    stream that breaks the format."""

    malformed: Callable[[str], ProviderError]
    message: JSONObject | None = None
    blocks: dict[int, JSONObject] = field(default_factory=dict)   # content blocks by index
    parts: dict[int, list[str]] = field(default_factory=dict)     # their text (or thinking) pieces
    usage: JSONObject = field(default_factory=dict)
    stop_reason: JSONValue = None
    final_usage: bool = False
    done: bool = False
    times: list[float] = field(default_factory=list)  # when each text piece arrived, seconds after the send

    def feed(self, payload: JSONObject, arrived: float) -> None:
        """One event's JSON payload, received `arrived` seconds after the send."""
        kind = payload.get("type")
        if kind == "content_block_delta":
            self._delta(payload, arrived)
        elif kind == "content_block_start":
            block, index = payload.get("content_block"), payload.get("index")
            if not isinstance(block, dict) or type(index) is not int:
                raise self.malformed("content_block_start has no block")
            self.blocks[index] = dict(block)
            self.parts[index] = []
        elif kind == "message_start":
            self._start(payload)
        elif kind == "message_delta":
            self._message_delta(payload)
        elif kind == "message_stop":
            self.done = True

    def _start(self, payload: JSONObject) -> None:
        message = payload.get("message")
        if not isinstance(message, dict):
            raise self.malformed("message_start has no message")
        self.message = message
        usage = message.get("usage")
        if isinstance(usage, dict):
            self.usage.update(usage)

    def _delta(self, payload: JSONObject, arrived: float) -> None:
        delta, index = payload.get("delta"), payload.get("index")
        if not isinstance(delta, dict) or type(index) is not int or index not in self.blocks:
            raise self.malformed("content_block_delta names no started block")
        dtype = delta.get("type")
        name = _TEXT_FIELDS.get(dtype) if isinstance(dtype, str) else None
        if name is None:
            return
        text = delta.get(name)
        if not isinstance(text, str):
            raise self.malformed(f"{dtype} is not a string")
        self.parts[index].append(text)
        if text and name == "text":
            self.times.append(arrived)

    def _message_delta(self, payload: JSONObject) -> None:
        delta = payload.get("delta")
        if isinstance(delta, dict) and "stop_reason" in delta:
            self.stop_reason = delta["stop_reason"]
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.final_usage = True  # cumulative counts: they replace message_start's
            self.usage.update((k, v) for k, v in usage.items() if v is not None)

    def missing(self) -> str | None:
        """What a stream that ended lacks for a whole message: None when nothing."""
        if self.message is None:
            return "message_start"
        return None if self.final_usage else "usage in message_delta"

    def assembled(self) -> JSONObject:
        """The message, its blocks holding their joined pieces (after `missing()` said None)."""
        for index, block in self.blocks.items():
            name = block.get("type")
            if name in ("text", "thinking"):
                key = str(name)
                block[key] = str(block.get(key) or "") + "".join(self.parts[index])
        return {**(self.message or {}), "content": [self.blocks[i] for i in sorted(self.blocks)],
                "stop_reason": self.stop_reason, "usage": self.usage}
