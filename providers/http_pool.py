"""A lean HTTP/1.1 client for the providers' hot path: POST a body, read the reply.

Why not `aiohttp.ClientSession` here: per call it builds a request object,
merges header multidicts, filters cookies, runs a timer context and wraps the
reply in a stream reader. On this 2-core machine that costs more than twice
the CPU of this module for the same call (`python benchmarks/overhead_bench.py`
prints both, side by side), and the client's CPU is what capped a zero-latency
run. The hard part, parsing replies, stays in a library: httptools, the Python
binding of llhttp (Node.js's parser). This module frames requests, keeps
connections alive, bounds how many calls are in flight, and decodes gzip/deflate.

Scope: http and https (TLS through the system's trust store; `SSL_CERT_FILE`
points it elsewhere, as for every OpenSSL program), keep-alive, replies framed
by Content-Length, chunked or a closed connection, gzip and deflate bodies.
Not here: proxies, redirects (a 3xx is returned as it is), HTTP/2. Endpoints
behind a proxy use aiohttp instead (`trust_env = true`, providers/http_client.py).

    pool = HttpPool(limit=64, headers={"Authorization": "Bearer ..."})
    status, headers, body = await pool.post(url, b'{"model": ...}', timeout=60)
    await pool.aclose()

`headers` in the reply is a dict with lower-case names (repeated headers joined
by ", "); `body` is decoded from its Content-Encoding. Failures raise
`TimeoutError` (the whole call, waiting for a slot and connecting included,
took longer than `timeout`), `OSError` (connecting, TLS, a reset, a reply cut
short: `ReplyCutShort`, a reply that is not HTTP: `MalformedReply`) or
`HttpConfigError` (a bad URL or header value: nothing was sent).
"""
from __future__ import annotations

import asyncio
import socket
import ssl
import zlib
from collections import deque
from collections.abc import Mapping
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

_Origin = tuple[str, str, int]  # scheme, host, port
_Reply = tuple[int, dict[str, str], bytes]  # status, lower-cased headers, decoded body

_default_ssl_context: ssl.SSLContext | None = None


def default_ssl_context() -> ssl.SSLContext:
    """The system's trust store, hostname checks on (what aiohttp uses too);
    built once per process: loading the store takes milliseconds."""
    global _default_ssl_context
    if _default_ssl_context is None:
        _default_ssl_context = ssl.create_default_context()
    return _default_ssl_context


class HttpConfigError(ValueError):
    """A URL or header this client cannot send (nothing was sent)."""


class MalformedReply(ConnectionError):
    """The server's bytes are not an HTTP/1.x reply."""


class ReplyCutShort(ConnectionError):
    """The connection closed before the reply was complete."""


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def _decode_body(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    try:
        if encoding in ("gzip", "x-gzip"):
            return zlib.decompress(body, 16 + zlib.MAX_WBITS)
        if encoding == "deflate":  # zlib-wrapped as the RFC says, or raw as some servers send it
            try:
                return zlib.decompress(body)
            except zlib.error:
                return zlib.decompress(body, -zlib.MAX_WBITS)
    except zlib.error as exc:
        raise MalformedReply(f"cannot decode the {encoding} reply body: {exc}") from None
    if encoding in ("", "identity"):
        return body
    raise MalformedReply(f"reply body in content-encoding {encoding!r}, which was not asked for")


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time (no pipelining)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: HttpPool, origin: _Origin):
        self.loop = loop
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[_Reply] | None = None
        self.closed = False
        self.reusable = False  # the last reply ended and the server keeps the connection open
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}  # lower-case names; a repeated header's values joined by ", "
        self.body: list[bytes] = []
        self.headers_done = False
        self.framed = False  # Content-Length or chunked: the reply's end is known without a close

    def send(self, parts: list[bytes]) -> asyncio.Future[_Reply]:
        self.reusable = False
        self._reset()
        self.waiter = waiter = self.loop.create_future()
        assert self.transport is not None  # sent only on a connected connection
        self.transport.writelines(parts)
        return waiter

    def abort(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.abort()

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP connection's transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # HttpParserError, or an upgrade (101) this client never asks for
            self._fail(MalformedReply(f"the server's reply is not valid HTTP ({type(exc).__name__}: {exc})"))
            self.abort()

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if exc is None and self.headers_done and not self.framed and self.status >= 200:
            self._finish(keep_alive=False)  # a reply without length or chunks ends with the connection
        elif self.headers_done:
            self._fail(ReplyCutShort(f"the server closed the connection in the middle of the reply body"
                                     f" (HTTP {self.status}, {sum(map(len, self.body))} bytes received)"))
        else:
            why = f": {exc}" if exc else ""
            self._fail(ReplyCutShort(f"the server closed the connection before replying{why}"))

    # -- httptools callbacks ------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self.headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        headers = self.headers
        self.framed = "content-length" in headers or "chunked" in headers.get("transfer-encoding", "").lower()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.status < 200:  # an interim 1xx reply: the real one follows
            self._reset()
            return
        self._finish(keep_alive=self.parser.should_keep_alive())

    # -- ending a reply -----------------------------------------------------------------
    def _finish(self, keep_alive: bool) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():  # a reply nobody waits for (timed out, or unasked): drop the connection
            self.abort()
            return
        headers = self.headers
        body = b"".join(self.body) if len(self.body) != 1 else self.body[0]
        encoding = headers.get("content-encoding")
        if encoding:
            try:
                body = _decode_body(body, encoding)
            except MalformedReply as exc:
                self._fail(exc)
                self.abort()
                return
        self.reusable = keep_alive and not self.closed
        self.body = []
        waiter.set_result((self.status, headers, body))

    def _fail(self, exc: BaseException) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class _Target:
    """What a URL's calls share: where to connect and the request's first bytes."""

    __slots__ = ("origin", "host", "port", "tls", "head")

    def __init__(self, url: str, header_block: bytes):
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise HttpConfigError(f"invalid URL {url!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpConfigError(f"invalid URL {url!r}: expected http:// or https:// and a host")
        if parts.username is not None or parts.password is not None:
            raise HttpConfigError(f"invalid URL {url!r}: credentials in URLs are not sent; use headers")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = port or (443 if self.tls else 80)
        self.origin = (parts.scheme, self.host, self.port)
        host_header = parts.netloc.encode("idna") if not parts.netloc.isascii() else parts.netloc.encode()
        path = parts.path or "/"
        if parts.query:
            path = f"{path}?{parts.query}"
        if not path.isascii() or any(c in path for c in " \t\r\n"):
            raise HttpConfigError(f"invalid URL {url!r}: the path must be ASCII without spaces (percent-encode it)")
        request_line = f"POST {path} HTTP/1.1\r\n".encode("ascii")
        self.head = request_line + b"Host: " + host_header + b"\r\n" + header_block + b"Content-Length: "


_FRAMING = {"host", "content-length", "transfer-encoding", "connection"}


def merged_headers(defaults: Mapping[str, str], given: Mapping[str, str]) -> dict[str, str]:
    """`given` over `defaults`, names compared case-insensitively."""
    names = {name.lower() for name in given}
    return {**{k: v for k, v in defaults.items() if k.lower() not in names}, **given}


def _header_block(headers: Mapping[str, str]) -> bytes:
    lines = []
    for name, value in headers.items():
        if name.lower() in _FRAMING:
            raise HttpConfigError(f"the {name!r} header is set by the HTTP client, not by configuration")
        text = f"{name}: {value}"
        if "\r" in text or "\n" in text:
            raise HttpConfigError(f"the {name!r} header contains a line break")
        try:
            lines.append(text.encode("latin-1") + b"\r\n")
        except UnicodeEncodeError:
            raise HttpConfigError(f"the {name!r} header is not Latin-1 text") from None
    return b"".join(lines)


class HttpPool:
    """Keep-alive connections for POSTs, at most `limit` calls in flight."""

    def __init__(self, *, limit: int, headers: Mapping[str, str] | None = None,
                 keepalive_timeout: float = 30.0, ssl_context: ssl.SSLContext | None = None):
        self.limit = max(1, int(limit))
        self.keepalive_timeout = keepalive_timeout
        self._ssl_context = ssl_context
        self._headers = merged_headers({"Accept-Encoding": "gzip, deflate"}, headers or {})
        self._header_block: bytes | None = None
        self._targets: dict[str, _Target] = {}
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._active = 0  # calls holding a slot
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.connections_opened = 0
        self.closed = False

    # -- the call -------------------------------------------------------------------------
    async def post(self, url: str, body: bytes, timeout: float) -> tuple[int, dict[str, str], bytes]:
        """POST `body` to `url`; (status, lower-cased headers, decoded body)."""
        if self.closed:
            raise RuntimeError("HttpPool is closed")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._adopt(loop)
        target = self._targets.get(url) or self._target(url)
        deadline = loop.time() + timeout
        if self._active < self.limit and not self._slot_waiters:
            self._active += 1
        else:
            async with asyncio.timeout_at(deadline):
                await self._wait_for_slot(loop)
        try:
            conn = self._idle_connection(target.origin, loop.time())
            if conn is None:
                async with asyncio.timeout_at(deadline):
                    conn = await self._connect(loop, target)
            ok = False
            try:
                waiter = conn.send([target.head, b"%d\r\n\r\n" % len(body), body])
                timer = loop.call_at(deadline, _expire, waiter)
                try:
                    reply = await waiter
                finally:
                    timer.cancel()
                ok = True
                return reply
            finally:
                self._put_back(conn, ok, loop)
        finally:
            self._free_slot()

    # -- targets and connections ------------------------------------------------------------
    def _target(self, url: str) -> _Target:
        if self._header_block is None:
            self._header_block = _header_block(self._headers)
        target = _Target(url, self._header_block)
        if len(self._targets) < 64:
            self._targets[url] = target
        return target

    def _idle_connection(self, origin: _Origin, now: float) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have been dropped
            assert conn.transport is not None  # idle connections are connected
            if conn.closed or conn.transport.is_closing():
                continue
            if now - conn.idle_since > self.keepalive_timeout:
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, target: _Target) -> _Connection:
        context = None
        if target.tls:
            context = self._ssl_context or default_ssl_context()
        _, conn = await loop.create_connection(
            lambda: _Connection(loop, self, target.origin), target.host, target.port,
            ssl=context, server_hostname=target.host if context is not None else None)
        self.connections_opened += 1
        return conn

    def _put_back(self, conn: _Connection, ok: bool, loop: asyncio.AbstractEventLoop) -> None:
        if ok and conn.reusable and not conn.closed and not self.closed:
            conn.idle_since = loop.time()
            self._idle.setdefault(conn.origin, []).append(conn)
        else:  # failed, timed out, cancelled or not kept alive: a late reply must not reach the next call
            conn.abort()

    def _forget(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)

    # -- slots (at most `limit` calls in flight) -----------------------------------------------
    async def _wait_for_slot(self, loop: asyncio.AbstractEventLoop) -> None:
        waiter = loop.create_future()
        self._slot_waiters.append(waiter)
        try:
            await waiter  # the call that freed a slot handed it over
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._free_slot()  # handed over, but this call gives up: pass it on
            else:
                try:
                    self._slot_waiters.remove(waiter)
                except ValueError:
                    pass
            raise

    def _free_slot(self) -> None:
        waiters = self._slot_waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._active -= 1

    # -- lifecycle ------------------------------------------------------------------------
    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Connections belong to the loop that opened them: called from another
        loop (successive asyncio.run calls), drop them and start afresh."""
        if self._loop is not None:
            self._drop_idle()
            self._active = 0
            self._slot_waiters.clear()
        self._loop = loop

    def _drop_idle(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                try:
                    conn.abort()
                except RuntimeError:  # its loop is closed: end the TCP connection by hand
                    assert conn.transport is not None  # idle connections are connected
                    sock = conn.transport.get_extra_info("socket")
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except (AttributeError, OSError):
                        pass

    async def aclose(self) -> None:
        """Close the idle connections; calls still running close theirs when they end."""
        if self.closed:
            return
        self.closed = True
        current = asyncio.get_running_loop()
        if self._loop is current:
            idle = [conn for conns in self._idle.values() for conn in conns]
            self._idle = {}
            for conn in idle:
                conn.closed = True
                assert conn.transport is not None  # idle connections are connected
                conn.transport.close()
            # Let the transports closed here and those aborted by the last
            # calls report connection_lost (and close their sockets) before
            # the caller may close the loop.
            await asyncio.sleep(0)
        else:
            self._drop_idle()
