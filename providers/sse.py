"""An incremental parser of server-sent events (the `text/event-stream` format).

Bytes go in as they arrive from the socket, split anywhere; complete events
come out. It follows the WHATWG parsing rules the providers' streams need:
lines end in `\\n`, `\\r\\n` or `\\r` (a `\\r` at the end of a read waits for
the next one, which may start with `\\n`); a line starting with `:` is a
comment; `field: value` loses one space after the colon; several `data:`
lines of one event join with `\\n`; a blank line ends the event, which is
dropped when it holds no data. `id:` and `retry:` are read and ignored (no
reconnection here). An event cut off by the end of the stream is never
returned: the caller sees the stream end without it.

    parser = SSEParser()
    for event in parser.feed(piece):    # bytes -> [SSEEvent(event, data)]
        ...
"""
from __future__ import annotations

from typing import NamedTuple


class SSEEvent(NamedTuple):
    event: str  # the `event:` field, "message" when absent
    data: str   # the `data:` lines, joined by "\n"


class SSEParser:
    __slots__ = ("_rest", "_event", "_data")

    def __init__(self) -> None:
        self._rest = b""            # an unfinished line from the previous reads
        self._event = ""
        self._data: list[str] = []

    def feed(self, piece: bytes) -> list[SSEEvent]:
        """The events that `piece` completes, in order."""
        buffer = self._rest + piece if self._rest else piece
        if b"\r" in buffer:  # rare: make every line end a \n (a final \r may pair with the next read's \n)
            held = b"\r" if buffer.endswith(b"\r") else b""
            buffer = (buffer[:-1] if held else buffer).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        else:
            held = b""
        lines = buffer.split(b"\n")
        self._rest = lines.pop() + held  # after the last line end: an unfinished line (or nothing)
        events: list[SSEEvent] = []
        data = self._data
        for line in lines:
            if not line:  # a blank line ends the event
                if data:
                    events.append(SSEEvent(self._event or "message", "\n".join(data)))
                    data = self._data = []
                self._event = ""
            elif line[0] == 0x3A:  # ":" a comment (keep-alive)
                continue
            else:
                name, colon, value = line.partition(b":")
                if colon and value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    data.append(value.decode("utf-8", "replace"))
                elif name == b"event":
                    self._event = value.decode("utf-8", "replace")
        return events
