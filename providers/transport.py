"""In-process servers: the HTTP clients' seam for talking to a server in the
same process without a socket.

`mount(base_url, server)` makes every connection the providers' HTTP clients
open to that URL's origin (scheme, host, port) a pair of in-memory pipe ends,
one handed to the client's protocol, the other to a fresh protocol from
`server()`: any asyncio server protocol factory, such as an aiohttp
`web.Server` (the loopback server's request handling: engine/loopback/, or a
test's own handler, as httpx's MockTransport takes one). The bytes are the
real ones, request and reply: the client parses what the server wrote, and
the server's aborts, closes and stalls reach the client as they would over
TCP (a reset is a `ConnectionResetError`). Nothing else changes: the pool's
slots, keep-alive and timeouts, the aiohttp session of the control-plane
calls, the error classification. TLS is not spoken in process.

    unmount = mount("http://in-process-1.invalid/v1", web_server)
    ...                       # clients configured with that base URL reach web_server
    unmount()
    base_url, unmount = mount_on_loopback(web_server)   # at http://127.0.0.1:PORT, PORT held for it

Each pipe end delivers on its own protocol's event loop, so a server mounted
from one loop serves clients running in another thread's loop (a CLI run
through `asyncio.run` in a worker thread). Used by the tests and benchmarks;
an origin nobody mounted is connected to as usual.
"""
from __future__ import annotations

import asyncio
import itertools
import socket
import threading
from collections.abc import Callable, Iterable
from typing import TypeVarTuple
from urllib.parse import urlsplit

Origin = tuple[str, str, int]  # scheme, host, port
Ts = TypeVarTuple("Ts")
ServerFactory = Callable[[], asyncio.BaseProtocol]

_mounted: dict[Origin, tuple[ServerFactory, asyncio.AbstractEventLoop]] = {}
_names = itertools.count(1)
_lock = threading.Lock()


def origin_of(url: str) -> Origin:
    """The (scheme, host, port) a URL connects to."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or (443 if scheme == "https" else 80)


def fresh_base_url() -> str:
    """An origin no real server answers (`.invalid` is reserved: a process
    that has not mounted it fails to resolve it at once)."""
    return f"http://in-process-{next(_names)}.invalid"


def mount(base_url: str, server: ServerFactory, loop: asyncio.AbstractEventLoop | None = None
          ) -> Callable[[], None]:
    """Route connections to `base_url`'s origin to `server()`'s protocols,
    which run on `loop` (default: the running loop). Returns the unmount."""
    origin = origin_of(base_url)
    owner = loop or asyncio.get_running_loop()
    with _lock:
        if origin in _mounted:
            raise ValueError(f"{base_url} is already mounted")
        _mounted[origin] = (server, owner)

    def unmount() -> None:
        with _lock:
            if _mounted.get(origin, (None,))[0] is server:
                del _mounted[origin]
    return unmount


def mount_on_loopback(server: ServerFactory, loop: asyncio.AbstractEventLoop | None = None
                      ) -> tuple[str, Callable[[], None]]:
    """Mount `server` at `http://127.0.0.1:PORT`, a port of this machine's
    loopback that a bound socket holds (never listening) until the unmount:
    no real server can take it, a client in another process is refused, and
    the origin is a loopback one, as a server on this machine would have
    (the config treats such endpoints as free). Returns (base URL, unmount)."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.bind(("127.0.0.1", 0))
        base_url = f"http://127.0.0.1:{holder.getsockname()[1]}"
        unmount = mount(base_url, server, loop)
    except BaseException:
        holder.close()
        raise

    def release() -> None:
        unmount()
        holder.close()
    return base_url, release


def mounted(origin: Origin) -> bool:
    """Whether connections to `origin` go to an in-process server."""
    return bool(_mounted) and origin in _mounted


def connect(origin: Origin, protocol: asyncio.BaseProtocol) -> asyncio.Transport:
    """Connect the client `protocol` (on the running loop) to a fresh server
    protocol of `origin`'s mount: `protocol.connection_made` is called with
    the client's pipe end, which is returned."""
    with _lock:
        found = _mounted.get(origin)
    if found is None:
        raise ConnectionRefusedError(f"nothing is mounted at {origin[0]}://{origin[1]}:{origin[2]}")
    factory, server_loop = found
    if server_loop.is_closed():
        raise ConnectionRefusedError(f"the in-process server of {origin[1]} has stopped")
    client = _PipeEnd(asyncio.get_running_loop(), protocol)
    server = _PipeEnd(server_loop, None)
    client.peer, server.peer = server, client
    server.on_loop(server.start, factory)
    protocol.connection_made(client)
    return client


class _PipeEnd(asyncio.Transport):
    """One end of an in-memory byte pipe: what is written here is received
    by the peer's protocol, on the peer's loop, in order."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol: asyncio.BaseProtocol | None):
        super().__init__()
        self.loop = loop
        self.protocol = protocol
        self.peer: _PipeEnd | None = None
        self.closing = False
        self.lost = False
        self.paused = False
        self.held: list[bytes] = []  # received, not yet handed to the protocol (reading paused)
        self.eof_pending = False
        self._extra: dict[str, object] = {"peername": ("127.0.0.1", 0), "sockname": ("127.0.0.1", 0), "socket": None,
                       "sslcontext": None}

    # -- delivery on this end's loop --------------------------------------------------
    def on_loop(self, fn: Callable[[*Ts], object], *args: *Ts) -> None:
        if self.loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            self.loop.call_soon(fn, *args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def start(self, factory: ServerFactory) -> None:
        self.protocol = factory()
        self.protocol.connection_made(self)

    def receive(self, data: bytes) -> None:
        if not self.lost:
            self.held.append(data)
            self.drain()

    def receive_eof(self) -> None:
        if not self.lost:
            self.eof_pending = True
            self.drain()

    def drain(self) -> None:
        """Hand what arrived to the protocol, in order, unless reading is paused."""
        protocol = self.protocol
        assert isinstance(protocol, asyncio.Protocol)
        held = self.held
        while held and not self.paused and not self.lost:
            protocol.data_received(held.pop(0))
        if self.eof_pending and not held and not self.paused and not self.lost:
            self.eof_pending = False
            if not protocol.eof_received():
                self.lose(None)

    def lose(self, exc: Exception | None) -> None:
        if self.lost or self.protocol is None:
            return
        self.lost = self.closing = True
        self.held.clear()
        self.protocol.connection_lost(exc)

    # -- asyncio.Transport --------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closing or not data or self.peer is None:
            return
        self.peer.on_loop(self.peer.receive, bytes(data))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(list_of_data))

    def write_eof(self) -> None:
        if self.peer is not None and not self.closing:
            self.peer.on_loop(self.peer.receive_eof)

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        """Close after what was written: the peer reads it, then the end of the stream."""
        if self.closing:
            return
        self.closing = True
        if self.peer is not None:
            self.peer.on_loop(self.peer.receive_eof)
        self.on_loop(self.lose, None)

    def abort(self) -> None:
        """A reset: the peer's connection is lost with ConnectionResetError."""
        if self.lost:
            return
        self.closing = True
        if self.peer is not None:
            self.peer.on_loop(self.peer.lose, ConnectionResetError("connection reset by peer (in process)"))
        self.on_loop(self.lose, None)

    def is_closing(self) -> bool:
        return self.closing

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        if self.paused:
            self.paused = False
            self.on_loop(self.drain)

    def is_reading(self) -> bool:
        return not self.paused and not self.closing

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return 0, 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._extra.get(name, default)
