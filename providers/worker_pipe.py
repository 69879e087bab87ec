"""The wire between a provider and its worker process: framed messages.

A frame is a 4-byte big-endian length, then that many bytes of pickle (the two
ends are the same program, so pickle's types round-trip exactly; nothing else
reads these pipes). Messages are dicts. The worker side reads and writes with
blocking file objects; the parent side reads with asyncio (`read_frame`) and
writes with `encode` + its transport.
"""
from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any, BinaryIO, cast

_HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30  # a corrupt header must not make us allocate more


def encode(message: dict[str, Any]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def write_frame(stream: BinaryIO, message: dict[str, Any]) -> None:
    stream.write(encode(message))
    stream.flush()


def read_frame_blocking(stream: BinaryIO) -> dict[str, Any] | None:
    """The next message, or None at end of stream (also mid-frame)."""
    header = _read_exactly(stream, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes")
    body = _read_exactly(stream, size)
    return None if body is None else pickle.loads(body)


def _read_exactly(stream: BinaryIO, n: int) -> bytes | None:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None when the other end closed (also mid-frame)."""
    try:
        (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
        if size > MAX_FRAME:
            raise ValueError(f"frame of {size} bytes")
        return cast(dict[str, Any], pickle.loads(await reader.readexactly(size)))
    except asyncio.IncompleteReadError:
        return None
