"""HttpPool.post_stream over real sockets on loopback: body pieces as they
arrive (chunked, content-length, close-delimited, gzip decoded incrementally),
the connection given back after a body read to its end and dropped otherwise
(aclose, a cancelled task, a timeout), back-pressure on a consumer that lags."""
from __future__ import annotations

import asyncio
import time
import zlib

import pytest
from aiohttp import web

from providers.http_pool import STREAM_HIGH_WATER, MalformedReply, PooledStream, ReplyCutShort
from tests.test_http_pool import RawServer, aiohttp_server, keep_alive_echo, open_pool, read_request, wait_for


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Stepper:
    """A raw handler streaming a chunked reply one piece per `step()` on its
    first connection (the test decides when each piece leaves the server), at
    once on later ones."""

    def __init__(self, pieces: list[bytes], headers: bytes = b"", encode=None):
        self.pieces = pieces
        self.headers = headers
        self.encode = encode  # e.g. a compressor: piece -> bytes on the wire
        self.steps = asyncio.Semaphore(0)
        self.sent = 0

    def step(self) -> None:
        self.steps.release()

    async def __call__(self, server: RawServer, reader, writer, n):
        while await server.read(reader, n) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n" + self.headers
                         + b"Transfer-Encoding: chunked\r\n\r\n")
            await writer.drain()
            for piece in self.pieces:
                if n == 1:
                    await self.steps.acquire()
                writer.write(chunk(self.encode(piece) if self.encode else piece))
                await writer.drain()
                self.sent += 1
            tail = self.encode(None) if self.encode else b""
            writer.write((chunk(tail) if tail else b"") + b"0\r\n\r\n")
            await writer.drain()


async def test_pieces_arrive_as_the_server_sends_them_and_the_connection_is_reused():
    pieces = [b"data: one\n\n", b"data: two\n\n", b"data: three\n\n"]
    stepper = Stepper(pieces)
    async with RawServer(stepper) as server, open_pool() as pool:
        before = time.perf_counter()
        stream = await pool.post_stream(server.url, b'{"stream": true}', timeout=5)
        assert isinstance(stream, PooledStream)
        assert stream.status == 200 and stream.headers["content-type"] == "text/event-stream"
        assert before < stream.first_byte <= time.perf_counter()
        got = []
        for _ in pieces:
            stepper.step()  # the server sends the next piece only now
            got.append(await stream.__anext__())
            assert stepper.sent == len(got)  # no piece is held back until the body ends
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
        assert got == pieces
        await stream.aclose()  # read to its end: the connection goes back to the pool
        for _ in pieces:
            stepper.step()
        async with await pool.post_stream(server.url, b"again", timeout=5) as again:
            assert await again.read() == b"".join(pieces)
        assert pool.connections_opened == 1
    assert [n for n, _, _ in server.requests] == [1, 1]


async def test_gzip_stream_is_decoded_piece_by_piece():
    compressor = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)

    def encode(piece: bytes | None) -> bytes:
        if piece is None:
            return compressor.flush()
        return compressor.compress(piece) + compressor.flush(zlib.Z_SYNC_FLUSH)

    pieces = [b"data: %d\n\n" % i * 50 for i in range(4)]
    stepper = Stepper(pieces, headers=b"Content-Encoding: gzip\r\n", encode=encode)
    async with RawServer(stepper) as server, open_pool() as pool:
        async with await pool.post_stream(server.url, b"", timeout=5) as stream:
            stepper.step()
            assert await stream.__anext__() == pieces[0]  # decoded before the rest was sent
            for _ in pieces[1:]:
                stepper.step()
            assert await stream.read() == b"".join(pieces[1:])
        assert pool.connections_opened == 1


async def test_deflate_both_ways_and_a_truncated_gzip_stream_fail_clearly():
    body = b"event: x\ndata: {}\n\n" * 200
    wires = {b"zlib": (b"deflate", zlib.compress(body)),
             b"raw": (b"deflate", zlib.compress(body)[2:-4]),
             b"cut": (b"gzip", zlib.compress(body, wbits=16 + zlib.MAX_WBITS)[:-30]),
             b"bad": (b"gzip", b"not gzip at all")}

    async def handler(server, reader, writer, n):
        while (request := await server.read(reader, n)) is not None:
            encoding, data = wires[request[1]]
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
                         % encoding + chunk(data[:7]) + chunk(data[7:]) + b"0\r\n\r\n")
            await writer.drain()

    async with RawServer(handler) as server, open_pool(limit=1) as pool:
        for name in (b"zlib", b"raw"):
            async with await pool.post_stream(server.url, name, timeout=5) as stream:
                assert await stream.read() == body
        for name in (b"cut", b"bad"):
            async with await pool.post_stream(server.url, name, timeout=5) as stream:
                with pytest.raises(MalformedReply, match="cannot decode the gzip reply body"):
                    await stream.read()
        async with await pool.post_stream(server.url, b"zlib", timeout=5) as stream:
            assert await stream.read() == body  # the slot came back after each failure
        assert pool.connections_opened == 3  # each failed stream dropped its connection


async def test_error_reply_read_at_once_and_content_length_and_connection_close_bodies():
    async def handler(request: web.Request) -> web.StreamResponse:
        kind = await request.read()
        if kind == b"error":
            return web.json_response({"error": {"message": "overloaded"}}, status=529)
        response = web.StreamResponse()
        if kind == b"length":
            response.content_length = 12
        else:  # chunked, and the server closes the connection after it
            response.force_close()
        await response.prepare(request)
        await response.write(b"hello ")
        await response.write(b"world!")
        await response.write_eof()
        return response

    async with aiohttp_server(handler) as port, open_pool() as pool:
        url = f"http://127.0.0.1:{port}/v1/messages"
        async with await pool.post_stream(url, b"error", timeout=5) as stream:
            assert stream.status == 529 and stream.headers["content-type"].startswith("application/json")
            assert await stream.read() == b'{"error": {"message": "overloaded"}}'
        async with await pool.post_stream(url, b"length", timeout=5) as stream:
            assert stream.headers["content-length"] == "12"
            assert await stream.read() == b"hello world!"
        assert pool.connections_opened == 1
        async with await pool.post_stream(url, b"close", timeout=5) as stream:
            assert stream.headers["connection"] == "close"
            assert await stream.read() == b"hello world!"
        async with await pool.post_stream(url, b"length", timeout=5) as stream:
            assert await stream.read() == b"hello world!"
        assert pool.connections_opened == 2  # Connection: close took the connection with it


async def test_closing_a_stream_before_its_end_drops_the_connection():
    stepper = Stepper([b"data: 1\n\n", b"data: 2\n\n"])
    async with RawServer(stepper) as server, open_pool(limit=1) as pool:
        stream = await pool.post_stream(server.url, b"", timeout=5)
        stepper.step()
        assert await stream.__anext__() == b"data: 1\n\n"
        conn = stream._conn
        await stream.aclose()
        assert conn is not None and conn.closed and conn.transport.is_closing()
        with pytest.raises(RuntimeError, match="closed before its end"):
            await stream.__anext__()
        async with await pool.post_stream(server.url, b"", timeout=5) as again:  # the slot is free
            assert await again.read() == b"data: 1\n\ndata: 2\n\n"
        assert pool.connections_opened == 2
    assert [n for n, _, _ in server.requests] == [1, 2]


async def test_a_task_cancelled_while_iterating_drops_the_connection_and_frees_its_slot():
    stepper = Stepper([b"data: 1\n\n", b"data: 2\n\n"])
    async with RawServer(stepper) as server, open_pool(limit=1) as pool:
        got: list[bytes] = []
        streams: list[PooledStream] = []  # held here: no garbage collection does the work for it

        async def consume() -> None:
            streams.append(await pool.post_stream(server.url, b"", timeout=5))
            async for piece in streams[0]:
                got.append(piece)

        task = asyncio.create_task(consume())
        stepper.step()
        await wait_for(lambda: got == [b"data: 1\n\n"])
        conn = next(iter(pool._idle.values()), None) if pool._idle else None
        assert conn is None  # the stream's connection is in use, not idle
        conn = streams[0]._conn
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert conn is not None and conn.closed and streams[0]._conn is None
        assert not any(pool._idle.values())  # dropped, not given back
        async with await pool.post_stream(server.url, b"", timeout=2) as again:  # limit=1: the slot is free
            assert await again.read() == b"data: 1\n\ndata: 2\n\n"
        assert pool.connections_opened == 2
    assert [n for n, _, _ in server.requests] == [1, 2]


async def test_a_stream_that_stalls_times_out_and_frees_its_slot():
    async def handler(server, reader, writer, n):
        while await server.read(reader, n) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"data: 1\n\n"))
            await writer.drain()
            if n == 1:
                await asyncio.sleep(10)  # stalls mid-body
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async with RawServer(handler) as server, open_pool(limit=1) as pool:
        stream = await pool.post_stream(server.url, b"", timeout=0.3)
        assert await stream.__anext__() == b"data: 1\n\n"
        with pytest.raises(TimeoutError):  # not the body's end, 10 s later: the call's timeout bounds it too
            await stream.__anext__()
        async with await pool.post_stream(server.url, b"", timeout=5) as again:
            assert await again.read() == b"data: 1\n\n"
        assert pool.connections_opened == 2


async def test_a_consumer_that_lags_pauses_reading_and_misses_nothing():
    size = 24 * 1024 * 1024
    body = bytes(range(256)) * (size // 256)
    done_sending = asyncio.Event()

    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for start in range(0, size, 1 << 20):
            writer.write(body[start:start + (1 << 20)])
            await writer.drain()
        done_sending.set()

    async with RawServer(handler) as server, open_pool() as pool:
        async with await pool.post_stream(server.url, b"", timeout=30) as stream:
            conn = stream._conn
            assert conn is not None
            await wait_for(lambda: conn.paused)
            await asyncio.sleep(0.2)  # the server keeps trying to send; the client does not read
            assert conn.paused and conn.buffered <= 2 * STREAM_HIGH_WATER
            assert not done_sending.is_set()  # the server is held back by TCP flow control
            received = bytearray()
            async for piece in stream:
                received += piece
        assert done_sending.is_set()
        assert len(received) == size and bytes(received) == body
        assert pool.connections_opened == 1 and pool._idle  # read to its end: kept alive


async def test_a_cut_short_stream_raises_after_the_pieces_that_came():
    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk(b"data: 1\n\n"))
        await writer.drain()

    async with RawServer(handler) as server, open_pool() as pool:
        got = []
        with pytest.raises(ReplyCutShort):
            async with await pool.post_stream(server.url, b"", timeout=5) as stream:
                async for piece in stream:
                    got.append(piece)
        assert got == [b"data: 1\n\n"]


async def test_a_stream_on_a_stale_reused_connection_is_resent_once():
    async def handler(server, reader, writer, n):
        request = await server.read(reader, n)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\nfirst " + b"%d" % n)
        await writer.drain()
        if await read_request(reader) is not None:  # the next request on this connection ...
            return  # ... finds it closed without a byte in reply
        del request

    async with RawServer(handler) as server, open_pool() as pool:
        async with await pool.post_stream(server.url, b"", timeout=5) as stream:
            assert await stream.read() == b"first 1"
        async with await pool.post_stream(server.url, b"", timeout=5) as stream:
            assert await stream.read() == b"first 2"
        assert pool.connections_opened == 2 and pool.resent == 1


async def test_post_still_works_between_streams_on_one_connection():
    async with RawServer(keep_alive_echo(b"echo:")) as server, open_pool(limit=1) as pool:
        for i in range(3):
            async with await pool.post_stream(server.url, b"s%d" % i, timeout=5) as stream:
                assert await stream.read() == b"echo:s%d" % i
            assert (await pool.post(server.url, b"p%d" % i, timeout=5))[2] == b"echo:p%d" % i
        assert pool.connections_opened == 1


async def test_a_close_delimited_stream_ends_with_the_connection():
    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: 1\n\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"data: 2\n\n")
        await writer.drain()

    async with RawServer(handler) as server, open_pool() as pool:
        async with await pool.post_stream(server.url, b"", timeout=5) as stream:
            assert [piece async for piece in stream] == [b"data: 1\n\n", b"data: 2\n\n"]
        assert not any(pool._idle.values())


async def test_closing_a_stream_whose_body_has_all_arrived_keeps_the_connection():
    async with RawServer(keep_alive_echo(b"whole:")) as server, open_pool(limit=1) as pool:
        stream = await pool.post_stream(server.url, b"body", timeout=5)
        assert await stream.__anext__() == b"whole:body"  # all of it, though the iteration has not ended
        await stream.aclose()
        async with await pool.post_stream(server.url, b"unread", timeout=5):
            await wait_for(lambda: len(server.requests) == 2)
            await asyncio.sleep(0.05)  # its reply has arrived, untaken
        assert (await pool.post(server.url, b"next", timeout=5))[2] == b"whole:next"
        assert pool.connections_opened == 1
