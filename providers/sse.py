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
        lines = buffer.splitlines(keepends=True)  # bytes split on \n, \r\n and \r only
        if lines and (not lines[-1].endswith((b"\n", b"\r")) or lines[-1].endswith(b"\r")):
            self._rest = lines.pop()  # unfinished, or a \r whose \n may be in the next read
        else:
            self._rest = b""
        events: list[SSEEvent] = []
        for raw in lines:
            line = raw.rstrip(b"\r\n")
            if not line:
                if self._data:
                    events.append(SSEEvent(self._event or "message", "\n".join(self._data)))
                    self._data = []
                self._event = ""
                continue
            if line[0] == 0x3A:  # ":" a comment (keep-alive)
                continue
            name, colon, value = line.partition(b":")
            if colon and value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                self._data.append(value.decode("utf-8", "replace"))
            elif name == b"event":
                self._event = value.decode("utf-8", "replace")
        return events
