"""providers/http_pool.py over real sockets on loopback: keep-alive, the slot
limit, every way a reply can be framed, encoded, cut short or malformed,
timeouts and cancellation that never leak a stale reply, TLS, and the pool
surviving successive event loops. aiohttp serves where it fits; a raw
asyncio server where the exact bytes on the wire matter."""
from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import socket
import ssl
import struct
import time
import zlib

import pytest
import trustme
from aiohttp import web

from engine.loopback.server import LoopbackServer, default_reply
from providers.base import CONFIG, EndpointSpec, ProviderError
from providers.http_pool import HttpConfigError, HttpPool, MalformedReply, ReplyCutShort
from providers.openai_http import OpenAIProvider

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["m"]

USER = [{"role": "user", "content": "Where did Maya meet Sam on March 3?"}]


# -- servers ----------------------------------------------------------------------------------

@contextlib.asynccontextmanager
async def aiohttp_server(handler, ssl_context: ssl.SSLContext | None = None):
    """An aiohttp app answering every method and path with `handler`; yields its port."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """One request's head (up to and including the blank line) and body; None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


def reply(body: bytes = b"ok", status: str = "200 OK", headers: tuple[str, ...] = (),
          length: bool = True) -> bytes:
    lines = [f"HTTP/1.1 {status}", *headers]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class RawServer:
    """asyncio.start_server on 127.0.0.1:0. `handler(server, reader, writer, n)`
    serves connection number n (from 1); the server counts connections and
    keeps every request read through `self.read`."""

    def __init__(self, handler):
        self.handler = handler
        self.connections = 0
        self.requests: list[tuple[int, bytes, bytes]] = []  # (connection number, head, body)
        self.eofs: list[int] = []  # connections the client closed (seen by `self.read`)
        self.received = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1/chat"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()

    async def read(self, reader: asyncio.StreamReader, n: int) -> tuple[bytes, bytes] | None:
        request = await read_request(reader)
        if request is None:
            self.eofs.append(n)
        else:
            self.requests.append((n, *request))
            self.received.set()
        return request

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._tasks.add(asyncio.current_task())
        try:
            await self.handler(self, reader, writer, self.connections)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # (cancelled: the test is over)
        finally:
            self._tasks.discard(asyncio.current_task())
            writer.close()


def keep_alive_echo(prefix: bytes = b""):
    """A handler answering every request on the connection with its own body."""
    async def handler(server: RawServer, reader, writer, n):
        while (request := await server.read(reader, n)) is not None:
            writer.write(reply(prefix + request[1]))
            await writer.drain()
    return handler


@contextlib.asynccontextmanager
async def open_pool(**options):
    pool = HttpPool(**{"limit": 4, **options})
    try:
        yield pool
    finally:
        await pool.aclose()


# -- keep-alive and the request on the wire -----------------------------------------------------

async def test_keep_alive_reuses_one_connection_and_sends_the_exact_request():
    seen = []

    async def handler(request: web.Request) -> web.Response:
        seen.append((request.method, request.path_qs, request.headers.copy(), await request.read(),
                     request.transport.get_extra_info("peername")))
        return web.Response(body=b'{"n": %d}' % len(seen), content_type="application/json")

    async with aiohttp_server(handler) as port, \
            open_pool(headers={"Authorization": "Bearer sk-1", "X-Custom": "custom value"}) as pool:
        url = f"http://127.0.0.1:{port}/v1/chat/completions?api-version=2024-06-01&x=1"
        bodies = [b'{"i": %d, "bin": "\x00\xff\r\n"}' % i for i in range(20)]
        replies = [await pool.post(url, body, timeout=5) for body in bodies]
        assert pool.connections_opened == 1
    assert [r[0] for r in replies] == [200] * 20
    assert [r[2] for r in replies] == [b'{"n": %d}' % (i + 1) for i in range(20)]
    assert replies[0][1]["content-type"] == "application/json"
    assert len({peer for *_, peer in seen}) == 1  # the server saw a single connection
    for (method, path_qs, headers, body, _), sent in zip(seen, bodies):
        assert method == "POST"
        assert path_qs == "/v1/chat/completions?api-version=2024-06-01&x=1"
        assert headers.getall("Host") == [f"127.0.0.1:{port}"]
        assert headers.getall("Content-Length") == [str(len(sent))]
        assert headers["Authorization"] == "Bearer sk-1"
        assert headers["X-Custom"] == "custom value"
        assert headers["Accept-Encoding"] == "gzip, deflate"
        assert body == sent


async def test_request_bytes_on_the_wire():
    async with RawServer(keep_alive_echo()) as server, open_pool(headers={"X-A": "1"}) as pool:
        await pool.post(f"http://127.0.0.1:{server.port}/p/q?a=b%20c#frag", b"hello", timeout=5)
        await pool.post(f"http://127.0.0.1:{server.port}", b"", timeout=5)
    (_, head1, body1), (_, head2, body2) = server.requests
    lines = head1.split(b"\r\n")
    assert lines[0] == b"POST /p/q?a=b%20c HTTP/1.1"  # the fragment is not sent
    assert lines[1] == b"Host: 127.0.0.1:%d" % server.port
    assert sorted(lines[2:-2]) == [b"Accept-Encoding: gzip, deflate", b"Content-Length: 5", b"X-A: 1"]
    assert head1.endswith(b"\r\n\r\n") and body1 == b"hello"
    assert head2.startswith(b"POST / HTTP/1.1\r\n") and b"Content-Length: 0\r\n" in head2 and body2 == b""


async def test_large_bodies_both_ways():
    big = bytes(range(256)) * 4096  # 1 MiB

    async with RawServer(keep_alive_echo(prefix=b"echo:")) as server, open_pool() as pool:
        status, headers, body = await pool.post(server.url, big, timeout=10)
        assert pool.connections_opened == 1
    assert status == 200 and body == b"echo:" + big
    assert headers["content-length"] == str(len(big) + 5)


async def test_idle_connections_expire_after_keepalive_timeout():
    async with RawServer(keep_alive_echo()) as server, open_pool(keepalive_timeout=0.05) as pool:
        assert (await pool.post(server.url, b"a", timeout=5))[2] == b"a"
        await asyncio.sleep(0.15)
        assert (await pool.post(server.url, b"b", timeout=5))[2] == b"b"
        assert pool.connections_opened == 2
        await asyncio.sleep(0.05)
        assert server.eofs == [1]  # the pool closed the expired connection itself
    assert server.connections == 2


async def test_aclose_closes_idle_connections_and_refuses_new_calls():
    async with RawServer(keep_alive_echo()) as server:
        pool = HttpPool(limit=2)
        await pool.post(server.url, b"x", timeout=5)
        await pool.aclose()
        for _ in range(50):
            if server.eofs:
                break
            await asyncio.sleep(0.01)
        assert server.eofs == [1]
        with pytest.raises(RuntimeError):
            await pool.post(server.url, b"x", timeout=5)
        await pool.aclose()  # twice is fine


# -- the slot limit -----------------------------------------------------------------------------

async def test_at_most_limit_calls_in_flight():
    in_flight = 0
    most = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal in_flight, most
        body = await request.read()
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.05)
        finally:
            in_flight -= 1
        return web.Response(body=b"re:" + body)

    async with aiohttp_server(handler) as port, open_pool(limit=3) as pool:
        url = f"http://127.0.0.1:{port}/x"
        replies = await asyncio.gather(*(pool.post(url, b"%d" % i, timeout=5) for i in range(15)))
        assert pool.connections_opened <= 3
    assert most == 3
    assert [(status, body) for status, _, body in replies] == [(200, b"re:%d" % i) for i in range(15)]


class Gate:
    """A raw handler holding every request until `open` is set; counts calls in flight."""

    def __init__(self):
        self.open = asyncio.Event()
        self.in_flight = 0
        self.most = 0

    async def __call__(self, server: RawServer, reader, writer, n):
        while (request := await server.read(reader, n)) is not None:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            try:
                await self.open.wait()
            finally:
                self.in_flight -= 1
            writer.write(reply(request[1]))
            await writer.drain()


async def wait_for(predicate, seconds: float = 60.0) -> None:
    """Until `predicate()` holds; the deadline only stops a test that hangs."""
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "timed out waiting"
        await asyncio.sleep(0.005)


async def test_slots_are_not_leaked_by_calls_cancelled_or_timed_out_while_waiting():
    gate = Gate()
    async with RawServer(gate) as server, open_pool(limit=2) as pool:
        holders = [asyncio.create_task(pool.post(server.url, b"h%d" % i, timeout=5)) for i in range(2)]
        await wait_for(lambda: gate.in_flight == 2)
        queued = asyncio.create_task(pool.post(server.url, b"cancelled", timeout=5))
        await asyncio.sleep(0.02)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        start = time.monotonic()
        with pytest.raises(TimeoutError):  # the wait for a slot counts against the timeout
            await pool.post(server.url, b"too-late", timeout=0.1)
        assert time.monotonic() - start > 0.05  # not before its time (later under load is fine)
        gate.open.set()
        assert [r[2] for r in await asyncio.gather(*holders)] == [b"h0", b"h1"]
        assert gate.most == 2
        # Both slots are free again, and no more than two exist.
        gate.open.clear()
        gate.most = 0
        again = [asyncio.create_task(pool.post(server.url, b"a%d" % i, timeout=5)) for i in range(3)]
        await wait_for(lambda: gate.in_flight == 2)
        await asyncio.sleep(0.05)
        assert gate.in_flight == 2
        gate.open.set()
        assert [r[2] for r in await asyncio.gather(*again)] == [b"a0", b"a1", b"a2"]
        assert gate.most == 2
    assert b"cancelled" not in [body for _, _, body in server.requests]
    assert b"too-late" not in [body for _, _, body in server.requests]


# -- how replies are framed ----------------------------------------------------------------------

async def test_chunked_reply_is_read_whole():
    parts = [b"first chunk;", b"x" * 5000, b";third", b"", b";last"]

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(status=207, headers={"X-Kind": "stream"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in parts:
            if part:
                await resp.write(part)
                await asyncio.sleep(0.005)
        await resp.write_eof()
        return resp

    async with aiohttp_server(handler) as port, open_pool() as pool:
        url = f"http://127.0.0.1:{port}/stream"
        status, headers, body = await pool.post(url, b"{}", timeout=5)
        again = await pool.post(url, b"{}", timeout=5)
        assert pool.connections_opened == 1  # a chunked reply ends without a close
    assert status == 207 and headers["transfer-encoding"] == "chunked" and headers["x-kind"] == "stream"
    assert "content-length" not in headers
    assert body == b"".join(parts) == again[2]


async def test_raw_chunked_reply_with_extensions_and_trailer():
    wire = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n")

    async def handler(server, reader, writer, n):
        while await server.read(reader, n) is not None:
            for i in range(0, len(wire), 7):  # in small pieces
                writer.write(wire[i:i + 7])
                await writer.drain()
                await asyncio.sleep(0)

    async with RawServer(handler) as server, open_pool() as pool:
        assert (await pool.post(server.url, b"", timeout=5))[2] == b"hello world"
        assert (await pool.post(server.url, b"", timeout=5))[2] == b"hello world"
        assert pool.connections_opened == 1


async def test_close_delimited_reply_is_read_to_the_close():
    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\npart one, ")
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"part two #%d" % n)
        await writer.drain()
        writer.close()  # no length, no chunks: the close ends the body

    async with RawServer(handler) as server, open_pool() as pool:
        first = await pool.post(server.url, b"1", timeout=5)
        second = await pool.post(server.url, b"2", timeout=5)
        assert pool.connections_opened == 2
    assert first == (200, {"content-type": "text/plain"}, b"part one, part two #1")
    assert second[2] == b"part one, part two #2"
    assert server.connections == 2


async def test_http10_reply_without_length_is_read_to_the_close():
    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nold server")
        writer.close()

    async with RawServer(handler) as server, open_pool() as pool:
        assert await pool.post(server.url, b"", timeout=5) == (200, {}, b"old server")
        assert await pool.post(server.url, b"", timeout=5) == (200, {}, b"old server")
    assert server.connections == 2


async def test_connection_close_reply_is_not_reused():
    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        writer.write(reply(b"bye %d" % n, headers=("Connection: close",)))
        await writer.drain()
        # The server leaves the socket open: the client must close it, and
        # must not send the next request on it (it would never be answered).
        assert await reader.read() == b""
        server.eofs.append(n)

    async with RawServer(handler) as server, open_pool() as pool:
        first = await pool.post(server.url, b"1", timeout=2)
        second = await pool.post(server.url, b"2", timeout=2)
        assert pool.connections_opened == 2
        await wait_for(lambda: len(server.eofs) == 2)
    assert (first[0], first[1]["connection"], first[2]) == (200, "close", b"bye 1")
    assert second[2] == b"bye 2"
    assert [(n, body) for n, _, body in server.requests] == [(1, b"1"), (2, b"2")]


async def test_server_closing_an_idle_connection_is_survived():
    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        writer.write(reply(b"conn %d" % n))  # keep-alive by default ...
        await writer.drain()
        writer.close()  # ... but the server drops it once idle

    async with RawServer(handler) as server, open_pool() as pool:
        assert (await pool.post(server.url, b"", timeout=5))[2] == b"conn 1"
        await asyncio.sleep(0.1)  # the close reaches the client
        assert (await pool.post(server.url, b"", timeout=5))[2] == b"conn 2"
        assert pool.connections_opened == 2


async def test_no_content_reply_keeps_the_connection():
    async def handler(server, reader, writer, n):
        while await server.read(reader, n) is not None:
            writer.write(b"HTTP/1.1 204 No Content\r\nX-N: %d\r\n\r\n" % n)
            await writer.drain()

    async with RawServer(handler) as server, open_pool() as pool:
        for _ in range(3):
            assert await pool.post(server.url, b"", timeout=5) == (204, {"x-n": "1"}, b"")
        assert pool.connections_opened == 1


async def test_interim_replies_are_skipped():
    async def handler(server, reader, writer, n):
        while await server.read(reader, n) is not None:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
                         + reply(b"the real reply", status="201 Created", headers=("X-Real: yes",)))
            await writer.drain()

    async with RawServer(handler) as server, open_pool() as pool:
        status, headers, body = await pool.post(server.url, b"{}", timeout=5)
        again = await pool.post(server.url, b"{}", timeout=5)
        assert pool.connections_opened == 1
    assert (status, body) == (201, b"the real reply")
    assert headers == {"x-real": "yes", "content-length": "14"}  # none of the interim replies' headers
    assert again == (status, headers, body)


async def test_duplicate_headers_are_joined_and_names_lower_cased():
    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        writer.write(reply(b"{}", headers=("X-Dup: one", "Set-Cookie: a=1", "x-DUP: two", "SET-COOKIE: b=2",
                                            "X-UPPER-Case: Value", "X-Empty:", "X-Dup: three")))
        await writer.drain()
        await reader.read()

    async with RawServer(handler) as server, open_pool() as pool:
        status, headers, body = await pool.post(server.url, b"", timeout=5)
    assert headers == {"x-dup": "one, two, three", "set-cookie": "a=1, b=2", "x-upper-case": "Value",
                       "x-empty": "", "content-length": "2"}


# -- encodings ----------------------------------------------------------------------------------

TEXT = b'{"choices": [{"message": {"content": "' + b"Maya met Sam in Paris. " * 200 + b'"}}]}'


async def test_gzip_and_deflate_replies_from_aiohttp_are_decoded():
    async def handler(request: web.Request) -> web.Response:
        resp = web.Response(body=TEXT, content_type="application/json")
        coding = {"/gzip": web.ContentCoding.gzip, "/deflate": web.ContentCoding.deflate}[request.path]
        resp.enable_compression(coding)
        return resp

    async with aiohttp_server(handler) as port, open_pool() as pool:
        for coding in ("gzip", "deflate"):
            status, headers, body = await pool.post(f"http://127.0.0.1:{port}/{coding}", b"{}", timeout=5)
            assert headers["content-encoding"] == coding
            assert (status, body) == (200, TEXT)
        assert pool.connections_opened == 1


async def test_raw_encoded_bodies_are_decoded_and_unknown_ones_refused():
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    raw_deflate = raw_deflate.compress(TEXT) + raw_deflate.flush()
    bodies = {
        b"gzip": ("gzip", gzip.compress(TEXT)),
        b"x-gzip": ("x-gzip", gzip.compress(TEXT)),
        b"zlib-deflate": ("deflate", zlib.compress(TEXT)),
        b"raw-deflate": ("deflate", raw_deflate),
        b"upper": ("GZIP", gzip.compress(TEXT)),
        b"identity": ("identity", TEXT),
        b"br": ("br", b"\x1b\x03\x00\xf8\xa5\x02\x00"),
        b"broken-gzip": ("gzip", gzip.compress(TEXT)[:-20] + b"\x00" * 20),
        b"broken-deflate": ("deflate", b"not compressed at all"),
    }

    async def handler(server, reader, writer, n):
        while (request := await server.read(reader, n)) is not None:
            coding, body = bodies[request[1]]
            writer.write(reply(body, headers=(f"Content-Encoding: {coding}",)))
            await writer.drain()

    async with RawServer(handler) as server, open_pool() as pool:
        for name in (b"gzip", b"x-gzip", b"zlib-deflate", b"raw-deflate", b"upper", b"identity"):
            status, _, body = await pool.post(server.url, name, timeout=5)
            assert (name, status, body) == (name, 200, TEXT)
        assert pool.connections_opened == 1
        for name in (b"br", b"broken-gzip", b"broken-deflate"):
            with pytest.raises(MalformedReply):
                await pool.post(server.url, name, timeout=5)
        # Each refusal dropped its connection; the pool still works.
        assert (await pool.post(server.url, b"gzip", timeout=5))[2] == TEXT
        assert pool.connections_opened == 4  # the first refusal dropped the kept-alive one
    assert [n for n, _, _ in server.requests][-4:] == [1, 2, 3, 4]


async def test_gzip_close_delimited_reply():
    packed = gzip.compress(TEXT)

    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n" + packed[:100])
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(packed[100:])
        writer.close()

    async with RawServer(handler) as server, open_pool() as pool:
        assert (await pool.post(server.url, b"", timeout=5))[2] == TEXT


# -- failures -----------------------------------------------------------------------------------

async def test_cut_short_and_malformed_replies_fail_and_the_pool_recovers():
    wires = {
        b"mid-body": reply(b"0123456789", headers=("Content-Length: 100",), length=False),
        b"mid-chunks": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n10\r\nabc",
        b"mid-headers": b"HTTP/1.1 200 OK\r\nContent-Le",
        b"nothing": b"",
        b"garbage": b"this is not HTTP at all\r\n\r\n",
        b"bad-status": b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n",
        b"bad-length": b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n0123456789",
    }

    async def handler(server, reader, writer, n):
        while (request := await server.read(reader, n)) is not None:
            if request[1] == b"ok":
                writer.write(reply(b"fine"))
                await writer.drain()
                continue
            writer.write(wires[request[1]])
            await writer.drain()
            if request[1] in (b"garbage", b"bad-status", b"bad-length"):
                await reader.read()  # stays open: the client must give up by itself
            return  # closes the connection

    async with RawServer(handler) as server, open_pool(limit=1) as pool:
        assert (await pool.post(server.url, b"ok", timeout=5))[2] == b"fine"
        for name, error in [(b"mid-body", ReplyCutShort), (b"mid-chunks", ReplyCutShort),
                            (b"mid-headers", ReplyCutShort), (b"nothing", ReplyCutShort),
                            (b"garbage", MalformedReply), (b"bad-status", MalformedReply),
                            (b"bad-length", MalformedReply)]:
            with pytest.raises(error) as info:
                await pool.post(server.url, name, timeout=2)
            assert isinstance(info.value, ConnectionError) and isinstance(info.value, OSError)
            assert (await pool.post(server.url, b"ok", timeout=2))[2] == b"fine", name
        # "nothing" went out on a reused connection and no byte came back: it
        # was sent once more on a fresh connection (which failed the same way).
        assert pool.connections_opened == 9 and pool.resent == 1
    assert [body for _, _, body in server.requests].count(b"nothing") == 2


def reset(writer: asyncio.StreamWriter) -> None:
    """Drop the connection with a TCP reset rather than a clean close."""
    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def test_reset_in_the_middle_of_a_reply_is_an_error():
    heads = {b"length": b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",
             b"close-delimited": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"}

    async def handler(server, reader, writer, n):
        _, body = await server.read(reader, n)
        writer.write(heads[body] + b"the first part of a longer body")
        await writer.drain()
        await asyncio.sleep(0.05)
        reset(writer)

    async with RawServer(handler) as server, open_pool() as pool:
        with pytest.raises(ReplyCutShort):
            await pool.post(server.url, b"length", timeout=5)
        # No length and no chunks: a clean close ends the body, but a reset
        # means the server failed mid-reply, and the body may be incomplete.
        with pytest.raises(ConnectionError):
            await pool.post(server.url, b"close-delimited", timeout=5)


async def test_garbage_on_an_idle_connection_drops_it():
    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        writer.write(reply(b"conn %d" % n))
        await writer.drain()
        await asyncio.sleep(0.02)
        writer.write(b"\x00\x01 not a reply")  # unasked, while the connection is idle
        await writer.drain()
        while await server.read(reader, n) is not None:  # would answer on it again
            writer.write(reply(b"reused conn %d" % n))
            await writer.drain()

    async with RawServer(handler) as server, open_pool() as pool:
        assert (await pool.post(server.url, b"", timeout=5))[2] == b"conn 1"
        await asyncio.sleep(0.1)
        assert (await pool.post(server.url, b"", timeout=5))[2] == b"conn 2"
        assert pool.connections_opened == 2


async def test_connection_refused_is_an_oserror():
    async with RawServer(keep_alive_echo()) as server:
        url = server.url
    async with open_pool() as pool:  # the server is gone: nothing listens on its port
        with pytest.raises(OSError):
            await pool.post(url, b"", timeout=2)
        assert pool.connections_opened == 0


async def test_timeout_then_the_next_call_gets_its_own_reply():
    async def handler(server, reader, writer, n):
        while (request := await server.read(reader, n)) is not None:
            _, body = request
            if body == b"slow":
                await asyncio.sleep(0.4)  # answers long after the client gave up
                writer.write(reply(b"late"))
            else:
                await asyncio.sleep(0.3)  # the late reply above is sent while this call waits
                writer.write(reply(b"reply to " + body))
            await writer.drain()

    async with RawServer(handler) as server, open_pool(limit=1) as pool:
        assert (await pool.post(server.url, b"warm", timeout=5))[2] == b"reply to warm"
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            await pool.post(server.url, b"slow", timeout=0.2)
        assert time.monotonic() - start > 0.15  # the call's own timeout, not the server's late reply
        status, _, body = await pool.post(server.url, b"next", timeout=5)
        assert (status, body) == (200, b"reply to next")
        assert (await pool.post(server.url, b"last", timeout=5))[2] == b"reply to last"
    assert [body for _, _, body in server.requests] == [b"warm", b"slow", b"next", b"last"]
    # The timed-out connection was dropped; the one after it was kept alive.
    assert [n for n, _, _ in server.requests] == [1, 1, 2, 2]


async def test_a_server_that_never_answers_times_out():
    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        await asyncio.sleep(10)

    async with RawServer(handler) as server, open_pool() as pool:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            await pool.post(server.url, b"", timeout=0.3)
        assert time.monotonic() - start > 0.25  # the server never answers: only the timeout ends it


async def test_cancelled_call_does_not_leak_its_reply_to_the_next():
    async def handler(server, reader, writer, n):
        while (request := await server.read(reader, n)) is not None:
            _, body = request
            await asyncio.sleep(0.3 if body == b"first" else 0.5)
            writer.write(reply(b"reply to " + body))
            await writer.drain()

    async with RawServer(handler) as server, open_pool(limit=1) as pool:
        assert (await pool.post(server.url, b"warm", timeout=5))[2] == b"reply to warm"
        server.received.clear()
        task = asyncio.create_task(pool.post(server.url, b"first", timeout=5))
        await asyncio.wait_for(server.received.wait(), 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        status, _, body = await pool.post(server.url, b"second", timeout=5)
        assert (status, body) == (200, b"reply to second")
    assert [(n, body) for n, _, body in server.requests] == [(1, b"warm"), (1, b"first"), (2, b"second")]


# -- TLS ----------------------------------------------------------------------------------------

async def test_tls_with_a_trusted_ca_and_refused_without():
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    peers = []

    async def handler(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername"))
        return web.Response(body=b"secure " + await request.read() + b" " + request.host.encode())

    async with aiohttp_server(handler, ssl_context=server_context) as port:
        async with open_pool(ssl_context=client_context) as pool:
            for host in ("localhost", "127.0.0.1"):
                status, _, body = await pool.post(f"https://{host}:{port}/v1", b"hi", timeout=5)
                assert (status, body) == (200, f"secure hi {host}:{port}".encode())
                assert (await pool.post(f"https://{host}:{port}/v1", b"again", timeout=5))[0] == 200
            assert pool.connections_opened == 2  # one per origin, each kept alive
        assert len(set(peers)) == 2
        async with open_pool() as untrusting:  # the system's trust store does not know this CA
            with pytest.raises(OSError) as info:
                await untrusting.post(f"https://localhost:{port}/v1", b"hi", timeout=5)
            assert isinstance(info.value, ssl.SSLCertVerificationError)
            assert untrusting.connections_opened == 0
        async with open_pool(ssl_context=client_context) as pool:  # plain HTTP to a TLS port
            with pytest.raises(OSError):
                await pool.post(f"http://127.0.0.1:{port}/v1", b"hi", timeout=5)
    assert len(peers) == 4


# -- configuration errors -----------------------------------------------------------------------

async def test_bad_urls_and_headers_raise_config_errors_before_sending():
    async with RawServer(keep_alive_echo()) as server:
        async with open_pool(limit=1) as pool:
            for url in ("ftp://127.0.0.1/file", "http:///v1/chat", "127.0.0.1:80/v1",
                        f"http://user:pw@127.0.0.1:{server.port}/v1", f"http://127.0.0.1:{server.port}/a b",
                        "http://127.0.0.1:99999/v1", f"http://127.0.0.1:{server.port}/caf\u00e9"):
                with pytest.raises(HttpConfigError):
                    await pool.post(url, b"{}", timeout=2)
            # No slot was kept by the refused calls.
            assert (await pool.post(server.url, b"fine", timeout=2))[2] == b"fine"
        for headers in ({"X-Evil": "a\r\nX-Injected: 1"}, {"X-Evil": "a\nb"}, {"X-Bad\r\nName": "v"},
                        {"X-Wide": "\u20ac"}):
            async with open_pool(headers=headers) as pool:
                for _ in range(2):
                    with pytest.raises(HttpConfigError):
                        await pool.post(server.url, b"{}", timeout=2)
                assert pool.connections_opened == 0
    assert server.connections == 1  # only the good call reached the server
    assert [body for _, _, body in server.requests] == [b"fine"]
    assert issubclass(HttpConfigError, ValueError)


async def test_given_headers_replace_defaults_whatever_their_case_and_framing_is_the_clients():
    seen = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.copy())
        return web.Response(body=b"{}")

    async with aiohttp_server(handler) as port:
        url = f"http://127.0.0.1:{port}/v1"
        async with open_pool(headers={"accept-encoding": "identity", "X-One": "1"}) as pool:
            await pool.post(url, b"{}", timeout=5)
        for name in ("Host", "content-length", "Transfer-Encoding", "Connection"):
            async with open_pool(headers={name: "x"}) as pool:
                with pytest.raises(HttpConfigError, match="set by the HTTP client"):
                    await pool.post(url, b"{}", timeout=5)
    assert len(seen) == 1
    assert seen[0].getall("Accept-Encoding") == ["identity"] and seen[0]["X-One"] == "1"


# -- event loops --------------------------------------------------------------------------------

async def test_a_pool_survives_successive_event_loops():
    async with RawServer(keep_alive_echo()) as server:
        pool = HttpPool(limit=2)

        async def calls(tag: bytes) -> list[bytes]:
            return [(await pool.post(server.url, tag + b"%d" % i, timeout=5))[2] for i in range(3)]

        def successive_runs():  # e.g. two asyncio.run() calls in one program
            first = asyncio.run(calls(b"a"))
            second = asyncio.run(calls(b"b"))
            asyncio.run(pool.aclose())
            return first, second

        # (in a thread: the server keeps running in this test's loop meanwhile)
        first, second = await asyncio.to_thread(successive_runs)
    assert first == [b"a0", b"a1", b"a2"] and second == [b"b0", b"b1", b"b2"]
    assert pool.connections_opened == 2  # one per loop, kept alive within each
    assert [n for n, _, _ in server.requests] == [1, 1, 1, 2, 2, 2]


async def test_connections_of_a_finished_event_loop_are_closed():
    """Idle connections left by a finished asyncio.run are closed when the pool
    moves to the next loop, and by an aclose() from another loop: not left
    open (to the server) until a garbage collection happens to find them."""
    async with RawServer(keep_alive_echo()) as server:
        pool = HttpPool(limit=2)

        def successive_runs() -> None:
            asyncio.run(pool.post(server.url, b"a", timeout=5))
            asyncio.run(pool.post(server.url, b"b", timeout=5))
            asyncio.run(pool.aclose())

        gc.disable()  # the connections sit in reference cycles: only their closing counts here
        try:
            await asyncio.to_thread(successive_runs)
            await wait_for(lambda: sorted(server.eofs) == [1, 2])  # with gc off, only the pool closes them
        finally:
            gc.enable()
        assert [n for n, _, _ in server.requests] == [1, 2]


# -- through the provider -----------------------------------------------------------------------

async def test_provider_with_the_aiohttp_client_and_an_unknown_client():
    async with LoopbackServer(models=SERVED) as server:
        spec = EndpointSpec(name="o", kind="openai", base_url=server.openai_base_url,
                            options={"http_client": "aiohttp"})
        provider = OpenAIProvider(spec, "sk-x")
        try:
            assert provider._http.uses_aiohttp
            result = await provider.chat("m", USER, params={}, timeout=5)
        finally:
            await provider.aclose()
        pooled = OpenAIProvider(EndpointSpec(name="p", kind="openai", base_url=server.openai_base_url), "sk-x")
        try:
            assert not pooled._http.uses_aiohttp
            pooled_result = await pooled.chat("m", USER, params={}, timeout=5)
        finally:
            await pooled.aclose()
    assert result.text == pooled_result.text == default_reply("openai", {"messages": USER}) != ""
    with pytest.raises(ProviderError) as info:
        OpenAIProvider(EndpointSpec(name="o", kind="openai", base_url="http://127.0.0.1:1/v1",
                                    options={"http_client": "curl"}))
    assert info.value.kind == CONFIG
    assert "curl" in str(info.value)
