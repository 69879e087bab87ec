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
by Content-Length, chunked or a closed connection, gzip and deflate bodies,
whole or streamed. Not here: proxies, redirects (a 3xx is returned as it is),
HTTP/2, pipelining (one request at a time per connection). Endpoints behind a
proxy use aiohttp instead (`trust_env = true`, providers/http_client.py).

    pool = HttpPool(limit=64, headers={"Authorization": "Bearer ..."})
    status, headers, body = await pool.post(url, b'{"model": ...}', timeout=60)
    async with await pool.post_stream(url, b'{"stream": true, ...}', timeout=60) as stream:
        async for piece in stream:  # decoded body bytes as they arrive
            ...
    await pool.aclose()

`headers` in the reply is a dict with lower-case names (repeated headers joined
by ", "); `body` is decoded from its Content-Encoding. Failures raise
`TimeoutError` (the whole call, waiting for a slot and connecting included,
took longer than `timeout`; or one of the pool's own limits, with a message:
`connect_timeout`, `first_byte_timeout`, `read_timeout`), `OSError`
(connecting, TLS, a reset, a reply cut short: `ReplyCutShort`, a reply that is
not HTTP: `MalformedReply`, a reply over the size limits: `HeadersTooLarge`,
`BodyTooLarge`) or `HttpConfigError` (a bad URL or header value: nothing was
sent).

Keep-alive: an idle connection is closed after `keepalive_timeout` (or sooner
when the server's `Keep-Alive: timeout=N` says so), never reused after a
`Connection: close`; a request sent on a reused connection that the server had
closed meanwhile (it ends with no reply byte) is sent again, once, on a fresh
connection.
"""
from __future__ import annotations

import asyncio
import re
import socket
import ssl
import zlib
from collections import deque
from collections.abc import Mapping
from time import perf_counter
from types import TracebackType
from typing import cast
from urllib.parse import urlsplit

import httptools

from providers import transport

_Origin = tuple[str, str, int]  # scheme, host, port
_Reply = tuple[int, dict[str, str], bytes]  # status, lower-cased headers, decoded body

_default_ssl_context: ssl.SSLContext | None = None

# Defaults of the pool's limits (HttpPool's keyword arguments).
KEEPALIVE_TIMEOUT = 30.0  # s an idle connection is kept
CONNECT_TIMEOUT = 30.0  # s to open a connection (TCP and TLS)
MAX_HEADER_SIZE = 64 * 1024  # bytes of a reply's status line and headers
MAX_BODY_SIZE = 256 * 1024 * 1024  # bytes of a reply body, as sent and once decoded
# Endpoint options (engine/config.py checks them) passed to HttpPool as they are.
TIMEOUT_OPTIONS = ("connect_timeout", "first_byte_timeout", "read_timeout", "keepalive_timeout")
# A streamed body's bytes buffered before reading from the socket pauses
# (the consumer lags); reading resumes when it takes them.
STREAM_HIGH_WATER = 256 * 1024


def default_ssl_context() -> ssl.SSLContext:
    """The system's trust store (or `SSL_CERT_FILE`), hostname checks on (what
    aiohttp uses too), ALPN offering http/1.1 only; built once per process:
    loading the store takes milliseconds."""
    global _default_ssl_context
    if _default_ssl_context is None:
        context = ssl.create_default_context()
        context.set_alpn_protocols(["http/1.1"])  # a server that would pick h2 by ALPN must not
        _default_ssl_context = context
    return _default_ssl_context


class HttpConfigError(ValueError):
    """A URL or header this client cannot send (nothing was sent)."""


class MalformedReply(ConnectionError):
    """The server's bytes are not an HTTP/1.x reply."""


class HeadersTooLarge(MalformedReply):
    """The reply's status line and headers exceed the pool's `max_header_size`."""


class BodyTooLarge(MalformedReply):
    """The reply body (as sent or decoded) exceeds the pool's `max_body_size`."""


class ReplyCutShort(ConnectionError):
    """The connection closed before the reply was complete."""


class _Decoder:
    """Incremental gzip / deflate decoding with a bound on the output."""

    def __init__(self, encoding: str, limit: int):
        encoding = encoding.strip().lower()
        self.encoding = encoding
        self.limit = limit
        self.size = 0
        self._zlib: zlib._Decompress | None = None  # zlib's Decompress object once the format is known
        self._pending = b""  # deflate: the first byte, until the second tells zlib from raw
        if encoding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding != "deflate":
            raise MalformedReply(f"reply body in content-encoding {encoding!r}, which was not asked for")

    def feed(self, data: bytes) -> bytes:
        if self._zlib is None:  # deflate, zlib-wrapped as the RFC says, or raw as some servers send it
            data = self._pending + data
            if len(data) < 2:
                self._pending = data
                return b""
            self._pending = b""
            wrapped = data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        try:
            out: bytes = self._zlib.decompress(data, self.limit - self.size + 1)
        except zlib.error as exc:
            raise MalformedReply(f"cannot decode the {self.encoding} reply body: {exc}") from None
        self.size += len(out)
        if self.size > self.limit or self._zlib.unconsumed_tail:
            raise BodyTooLarge(f"the reply body decodes to more than {self.limit} bytes (max_body_size)")
        return out

    def end(self) -> None:
        if self._zlib is None or not self._zlib.eof:
            raise MalformedReply(f"cannot decode the {self.encoding} reply body: it is truncated")


def _decode_body(body: bytes, encoding: str, limit: int) -> bytes:
    if encoding.strip().lower() in ("", "identity"):
        return body
    decoder = _Decoder(encoding, limit)
    out = decoder.feed(body)
    decoder.end()
    return out


_KEEP_ALIVE_TIMEOUT = re.compile(r"(?:^|[,;\s])timeout\s*=\s*(\d+(?:\.\d*)?)", re.IGNORECASE)


def keep_alive_hint(value: str) -> float | None:
    """The seconds a server keeps an idle connection, from its `Keep-Alive:
    timeout=N, max=M` header, less a margin for the next request to reach it."""
    match = _KEEP_ALIVE_TIMEOUT.search(value)
    if match is None:
        return None
    seconds = float(match.group(1))
    return seconds - 1.0 if seconds >= 2.0 else seconds / 2


# What fired a call's watchdog timer (_Connection._check).
_TOTAL, _FIRST_BYTE, _READ = 0, 1, 2


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time (no pipelining).

    A call's reply goes to `waiter`: the whole reply for `post`, the status
    and headers only for a stream, whose body pieces then collect in `body`
    for `PooledStream` to take (`wakeup` tells it more arrived)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: HttpPool, origin: _Origin):
        self.loop = loop
        self.pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[_Reply] | None = None
        self.closed = False
        self.reusable = False  # the last reply ended and the server keeps the connection open
        self.idle_until = 0.0  # loop time after which an idle connection is closed
        self.keepalive = pool.keepalive_timeout  # this connection's idle time (the server may shorten it)
        self.max_header = pool.max_header_size
        self.max_body = pool.max_body_size
        self.max_body_digits = len(str(pool.max_body_size))  # a shorter Content-Length is within it
        self.timed_reads = pool.first_byte_timeout is not None or pool.read_timeout is not None
        self.first_byte = 0.0  # perf_counter() when the current reply's first byte arrived
        self.last_read = 0.0  # loop time of the last bytes read
        self.timer: asyncio.TimerHandle | None = None
        self.deadline = 0.0
        self.sent_at = 0.0
        self.watched = 0.0  # last_read when the between-reads check was armed
        self.streaming = False
        self.body_done = False  # a stream's body has ended
        self.error: BaseException | None = None  # a stream's failure after its head
        self.wakeup: asyncio.Future[None] | None = None
        self.buffered = 0  # a stream's bytes waiting in `body`
        self.paused = False
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}  # lower-case names; a repeated header's values joined by ", "
        self.body: list[bytes] = []
        self.body_size = 0
        self.head_size = 0  # bytes read while the head was incomplete (may include body bytes)
        self.headers_done = False
        self.framed = False  # Content-Length or chunked: the reply's end is known without a close

    def send(self, parts: list[bytes], deadline: float, streaming: bool) -> asyncio.Future[_Reply]:
        self.reusable = False
        self._reset()
        self.first_byte = 0.0
        if streaming or self.streaming:
            self.streaming = streaming
            self.body_done = False
            self.error = None
        self.waiter = waiter = self.loop.create_future()
        transport = self.transport
        if self.closed or transport is None or transport.is_closing():  # (uvloop raises on writing to it)
            waiter.set_exception(ReplyCutShort("the connection closed before the request was sent"))
            return waiter
        transport.writelines(parts)
        self.deadline = deadline
        if self.timed_reads:
            self.sent_at = self.loop.time()
            self._arm()
        else:  # only the call's own timeout
            self.timer = self.loop.call_at(deadline, self._check, _TOTAL)
        return waiter

    def abort(self) -> None:
        self.disarm()
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.abort()

    # -- the watchdog: total, first-byte and between-reads timeouts ---------------------
    def _arm(self) -> None:
        if not self.timed_reads:  # only the call's own timeout
            self.timer = self.loop.call_at(self.deadline, self._check, _TOTAL)
            return
        pool = self.pool
        when, why = self.deadline, _TOTAL
        if not self.first_byte:
            if pool.first_byte_timeout is not None and self.sent_at + pool.first_byte_timeout < when:
                when, why = self.sent_at + pool.first_byte_timeout, _FIRST_BYTE
        elif pool.read_timeout is not None and not self.paused and self.last_read + pool.read_timeout < when:
            when, why = self.last_read + pool.read_timeout, _READ
            self.watched = self.last_read
        self.timer = self.loop.call_at(when, self._check, why)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _check(self, why: int) -> None:
        self.timer = None
        if why == _FIRST_BYTE and self.first_byte or why == _READ and (self.last_read != self.watched or self.paused):
            self._arm()  # bytes came in time: watch what comes next
            return
        pool = self.pool
        if why == _FIRST_BYTE:
            exc = TimeoutError(f"no reply byte within {pool.first_byte_timeout:g} s of sending the request"
                               " (first_byte_timeout)")
        elif why == _READ:
            exc = TimeoutError(f"no reply byte for {pool.read_timeout:g} s in the middle of the reply"
                               " (read_timeout)")
        else:
            exc = TimeoutError()  # the call's own timeout: the caller knows it
        self._fail(exc)
        self.abort()  # a late reply must not reach the next call

    # -- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a TCP connection's transport

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or (self.body_done if self.streaming else waiter.done()):
            self.abort()  # bytes nobody asked for (an idle connection): it cannot carry the next reply
            return
        if self.timed_reads:
            self.last_read = self.loop.time()
            if not self.first_byte and self.timer is not None:
                self.first_byte = perf_counter()
                self.timer.cancel()
                self._arm()  # the reply has begun: from now on, the gaps between reads
        if not self.first_byte:
            self.first_byte = perf_counter()
        try:
            if self.headers_done:
                self.parser.feed_data(data)
            else:
                self.head_size += len(data)
                self.parser.feed_data(data)
                if not self.headers_done and self.head_size > self.max_header:
                    raise HeadersTooLarge(f"the reply's headers exceed {self.max_header} bytes"
                                          " (max_header_size)")
        except MalformedReply as exc:
            self._fail(exc)
            self.abort()
        except httptools.HttpParserCallbackError as exc:
            # A callback's own error is the parser error's context: a limit
            # (MalformedReply) goes to the caller; anything else would be a
            # bug here, and goes to the caller as it is (not hidden as a bad reply).
            self._fail(exc.__context__ or exc)
            self.abort()
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:  # (a 101 is never asked for)
            self._fail(MalformedReply(f"the server's reply is not valid HTTP ({type(exc).__name__}: {exc})"))
            self.abort()

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.disarm()
        self.pool._forget(self)
        waiter = self.waiter
        if waiter is None or (self.body_done if self.streaming else waiter.done()):
            return  # no reply in progress
        if exc is None and self.headers_done and not self.framed and self.status >= 200:
            self._finish(keep_alive=False)  # a reply without length or chunks ends with the connection
        elif self.headers_done:
            self._fail(ReplyCutShort(f"the server closed the connection in the middle of the reply body"
                                     f" (HTTP {self.status}, {self.body_size} bytes received)"))
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
        if self.head_size > self.max_header and \
                sum(len(k) + len(v) + 4 for k, v in headers.items()) > self.max_header:
            raise HeadersTooLarge(f"the reply's headers exceed {self.max_header} bytes (max_header_size)")
        length = headers.get("content-length")
        self.framed = length is not None or "chunked" in headers.get("transfer-encoding", "").lower()
        if length is not None and len(length) >= self.max_body_digits and length.isdigit() \
                and int(length) > self.max_body:
            raise BodyTooLarge(f"the reply body of {length} bytes exceeds {self.max_body} bytes"
                               " (max_body_size)")
        if self.streaming and self.status >= 200:
            waiter = self.waiter
            if waiter is None or waiter.done():  # a reply nobody asked for
                self.abort()
            else:
                waiter.set_result((self.status, headers, b""))

    def on_body(self, body: bytes) -> None:
        self.body_size += len(body)
        if self.body_size > self.max_body:
            raise BodyTooLarge(f"the reply body exceeds {self.max_body} bytes (max_body_size)")
        if self.streaming:
            if self.closed or self.body_done:
                return  # an unasked reply after the stream's end: the connection is dropped
            self.body.append(body)
            self.buffered += len(body)
            if self.buffered > STREAM_HIGH_WATER and not self.paused:
                self.paused = True  # the consumer lags: let the server's sends block
                assert self.transport is not None
                self.transport.pause_reading()
            self._wake()
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.status < 200:  # an interim 1xx reply: the real one follows
            self._reset()
            return
        self._finish(keep_alive=self.parser.should_keep_alive())

    # -- a stream's consumer --------------------------------------------------------------
    def _wake(self) -> None:
        wakeup = self.wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    def take(self) -> list[bytes]:
        """The stream's buffered body pieces (reading resumes if it was paused)."""
        pieces, self.body, self.buffered = self.body, [], 0
        if self.paused:
            self.paused = False
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()
                if self.timed_reads and self.timer is not None:
                    self.last_read = self.loop.time()  # the pause was ours: the between-reads clock restarts
                    self.timer.cancel()
                    self._arm()
        return pieces

    # -- ending a reply -----------------------------------------------------------------
    def _finish(self, keep_alive: bool) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        headers = self.headers
        hint = headers.get("keep-alive")
        if hint is not None:
            seconds = keep_alive_hint(hint)
            if seconds is not None:
                self.keepalive = min(self.pool.keepalive_timeout, seconds)
        if self.streaming:
            self.body_done = True
            self.reusable = keep_alive and not self.closed
            self._wake()
            return
        waiter = self.waiter
        if waiter is None or waiter.done():  # a reply nobody waits for (timed out, or unasked): drop the connection
            self.abort()
            return
        body = b"".join(self.body) if len(self.body) != 1 else self.body[0]
        encoding = headers.get("content-encoding")
        if encoding:
            try:
                body = _decode_body(body, encoding, self.max_body)
            except MalformedReply as exc:
                self._fail(exc)
                self.abort()
                return
        self.reusable = keep_alive and not self.closed
        self.body = []
        waiter.set_result((self.status, headers, body))

    def _fail(self, exc: BaseException) -> None:
        self.disarm()
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        elif self.streaming and not self.body_done and self.error is None:
            self.error = exc
            self._wake()


class PooledStream:
    """A reply whose body is read as it arrives (`HttpPool.post_stream`).

    `status`, `headers` (lower-case names) and `first_byte` (perf_counter()
    when the reply's first byte arrived) are known at once; iterate for the
    decoded body pieces, or `read()` the rest. The call's slot and connection
    are held until the body ends or `aclose()` (`async with` calls it): a
    reply whose body has all arrived gives the connection back to the pool;
    any other end (aclose before the body's end, an error, a timeout, a task
    cancelled while iterating) drops the connection, so that no rest of that
    reply can reach the next call."""

    def __init__(self, pool: HttpPool, conn: _Connection, status: int, headers: dict[str, str]):
        self.status = status
        self.headers = headers
        self.first_byte = conn.first_byte
        self._pool = pool
        self._conn: _Connection | None = conn
        encoding = headers.get("content-encoding", "").strip().lower()
        self._decoder: _Decoder | None = None
        self._ended = False
        if encoding not in ("", "identity"):
            try:
                self._decoder = _Decoder(encoding, pool.max_body_size)
            except MalformedReply:
                self._release(reuse=False)
                raise

    def __aiter__(self) -> PooledStream:
        return self

    async def __anext__(self) -> bytes:
        conn = self._conn
        if conn is None:
            if self._ended:
                raise StopAsyncIteration
            raise RuntimeError("the stream was closed before its end")
        try:
            while True:
                if conn.body:
                    pieces = conn.take()
                    data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
                    if self._decoder is not None:
                        data = self._decoder.feed(data)
                        if not data:
                            continue
                    return data
                if conn.error is not None:
                    raise conn.error
                if conn.body_done:
                    if self._decoder is not None:
                        self._decoder.end()
                    self._ended = True
                    self._release(reuse=True)
                    raise StopAsyncIteration
                wakeup = conn.wakeup = conn.loop.create_future()
                try:
                    await wakeup
                finally:
                    conn.wakeup = None
        except StopAsyncIteration:
            raise
        except BaseException:  # an error, or the task was cancelled: the connection cannot be reused
            self._release(reuse=False)
            raise

    async def read(self) -> bytes:
        """The rest of the body (decoded), at once."""
        return b"".join([piece async for piece in self])

    async def aclose(self) -> None:
        """Give the connection back if the whole body has arrived, else drop it."""
        self._release(reuse=True)

    async def __aenter__(self) -> PooledStream:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._release(reuse=True)

    def _release(self, reuse: bool) -> None:
        """Free the call's slot; its connection goes back to the pool when
        `reuse` and the reply has ended (pieces not taken are dropped), else it is dropped."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.disarm()
        if conn.paused:
            conn.take()
        self._pool._put_back(conn, reuse and conn.body_done and conn.error is None, conn.loop)
        self._pool._free_slot()

    def __del__(self) -> None:
        # Never closed nor read to its end: free the slot (the connection is dropped).
        if self._conn is not None and not self._conn.loop.is_closed():
            self._release(reuse=False)


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
    """Keep-alive connections for POSTs, at most `limit` calls in flight (so
    at most `limit` connections open to one origin at a time, idle ones aside).

    Limits (None: only the call's own `timeout` bounds it): `connect_timeout`
    (TCP and TLS), `first_byte_timeout` (from sending the request to the
    reply's first byte), `read_timeout` (between two reads once the reply has
    begun), `keepalive_timeout` (idle connections are closed after it),
    `max_header_size` and `max_body_size` (bytes; the body as sent and decoded)."""

    def __init__(self, *, limit: int, headers: Mapping[str, str] | None = None,
                 keepalive_timeout: float = KEEPALIVE_TIMEOUT, ssl_context: ssl.SSLContext | None = None,
                 connect_timeout: float | None = CONNECT_TIMEOUT, first_byte_timeout: float | None = None,
                 read_timeout: float | None = None, max_header_size: int = MAX_HEADER_SIZE,
                 max_body_size: int = MAX_BODY_SIZE):
        self.limit = max(1, int(limit))
        self.keepalive_timeout = keepalive_timeout
        self.connect_timeout = connect_timeout
        self.first_byte_timeout = first_byte_timeout
        self.read_timeout = read_timeout
        self.max_header_size = max_header_size
        self.max_body_size = max_body_size
        self._ssl_context = ssl_context
        self._headers = merged_headers({"Accept-Encoding": "gzip, deflate"}, headers or {})
        self._header_block: bytes | None = None
        self._targets: dict[str, _Target] = {}
        self._idle: dict[_Origin, list[_Connection]] = {}
        self._sweeper: asyncio.TimerHandle | None = None  # closes idle connections when their time is up
        self._sweep_at = 0.0
        self._active = 0  # calls holding a slot
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.connections_opened = 0
        self.resent = 0  # requests sent again after a reused connection turned out closed
        self.closed = False

    # -- the calls ------------------------------------------------------------------------
    async def post(self, url: str, body: bytes, timeout: float) -> tuple[int, dict[str, str], bytes]:
        """POST `body` to `url`; (status, lower-cased headers, decoded body)."""
        loop, target, deadline = self._prepare(url, timeout)
        if not self._try_slot():
            await self._wait_for_slot(loop, deadline)
        try:
            conn, reply = await self._exchange(loop, target, body, deadline, False)
            self._put_back(conn, True, loop)
            return reply
        finally:
            self._free_slot()

    async def post_stream(self, url: str, body: bytes, timeout: float) -> PooledStream:
        """POST `body` to `url`; the reply's head, its body to be read as it
        arrives. `timeout` bounds the whole call, reading the body included.
        Close the stream (`aclose`, or `async with`) unless read to its end."""
        loop, target, deadline = self._prepare(url, timeout)
        if not self._try_slot():
            await self._wait_for_slot(loop, deadline)
        try:
            conn, (status, headers, _) = await self._exchange(loop, target, body, deadline, True)
        except BaseException:
            self._free_slot()
            raise
        return PooledStream(self, conn, status, headers)

    def _prepare(self, url: str, timeout: float) -> tuple[asyncio.AbstractEventLoop, _Target, float]:
        """A call's loop, target and deadline."""
        if self.closed:
            raise RuntimeError("HttpPool is closed")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._adopt(loop)
        return loop, self._targets.get(url) or self._target(url), loop.time() + timeout

    async def _exchange(self, loop: asyncio.AbstractEventLoop, target: _Target, body: bytes, deadline: float,
                        streaming: bool) -> tuple[_Connection, _Reply]:
        """Send the request and wait for its reply (a stream: its head); the
        connection is the caller's to put back. On a failure the connection
        is dropped; a reused one that ended with no reply byte (the server had
        closed it while idle) is replaced once by a fresh one."""
        parts = [target.head, b"%d\r\n\r\n" % len(body), body]
        conn = self._idle_connection(target.origin, loop.time())
        reused = conn is not None
        while True:
            if conn is None:
                conn = await self._connect(loop, target, deadline)
            try:
                return conn, await conn.send(parts, deadline, streaming)
            except ReplyCutShort:
                conn.abort()
                if not reused or conn.first_byte or self.closed:
                    raise
                # Not a byte back on a reused connection: the server had
                # closed it while idle (the request crossed its close).
                reused, conn = False, None
                self.resent += 1
            except BaseException:  # failed, timed out or cancelled: a late reply must not reach the next call
                conn.abort()
                raise

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
            if now >= conn.idle_until:
                conn.abort()
                continue
            return conn
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, target: _Target, deadline: float) -> _Connection:
        if transport.mounted(target.origin):  # a server in this process (providers/transport.py)
            conn = _Connection(loop, self, target.origin)
            transport.connect(target.origin, conn)
            self.connections_opened += 1
            return conn
        context = None
        if target.tls:
            context = self._ssl_context or default_ssl_context()
        limit = deadline
        if self.connect_timeout is not None:
            limit = min(deadline, loop.time() + self.connect_timeout)
        try:
            async with asyncio.timeout_at(limit):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop, self, target.origin), target.host, target.port,
                    ssl=context, server_hostname=target.host if context is not None else None)
        except TimeoutError:
            if limit < deadline:
                raise TimeoutError(f"connecting to {target.host}:{target.port} took more than"
                                   f" {self.connect_timeout:g} s (connect_timeout)") from None
            raise
        self.connections_opened += 1
        return conn

    def _put_back(self, conn: _Connection, ok: bool, loop: asyncio.AbstractEventLoop) -> None:
        if ok and conn.reusable and not conn.closed and not self.closed and conn.keepalive > 0:
            until = conn.idle_until = loop.time() + conn.keepalive
            self._idle.setdefault(conn.origin, []).append(conn)
            if (self._sweeper is None or until < self._sweep_at) and until != float("inf"):
                self._schedule_sweep(loop, until)
        else:  # failed, timed out, cancelled or not kept alive: a late reply must not reach the next call
            conn.abort()

    def _schedule_sweep(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        self._sweep_at = when
        self._sweeper = loop.call_at(when, self._sweep)

    def _sweep(self) -> None:
        """Close the idle connections whose idle time is up; come back for the next."""
        self._sweeper = None
        loop = self._loop
        if loop is None or self.closed:
            return
        now = loop.time()
        soonest = None
        for conns in self._idle.values():
            for conn in list(conns):
                if now >= conn.idle_until:
                    conns.remove(conn)
                    conn.abort()
                elif soonest is None or conn.idle_until < soonest:
                    soonest = conn.idle_until
        if soonest is not None:
            self._schedule_sweep(loop, soonest)

    def _forget(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.origin)
        if idle and conn in idle:
            idle.remove(conn)

    # -- slots (at most `limit` calls in flight) -----------------------------------------------
    def _try_slot(self) -> bool:
        """Take a free slot now (nobody queued before us), without awaiting."""
        if self._active < self.limit and not self._slot_waiters:
            self._active += 1
            return True
        return False

    async def _wait_for_slot(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        async with asyncio.timeout_at(deadline):
            await self._slot_handed_over(loop)

    async def _slot_handed_over(self, loop: asyncio.AbstractEventLoop) -> None:
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
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
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
            if self._sweeper is not None:
                self._sweeper.cancel()
                self._sweeper = None
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
