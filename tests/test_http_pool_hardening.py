"""The hand-written pool's hardening checklist (../shared/spec/provider-apis.md),
one behaviour per test, each over real sockets on loopback with a raw server
sending the exact bytes that matter: stale keep-alive connections, idle
eviction and the server's Keep-Alive hint, framing, size limits, timeouts,
and the endpoint options that set them."""
from __future__ import annotations

import asyncio
import ssl
import zlib

import pytest
import trustme

from providers.base import CONNECTION, TIMEOUT, EndpointSpec, ProviderError
from providers.http_pool import (
    BodyTooLarge,
    HeadersTooLarge,
    HttpPool,
    MalformedReply,
    ReplyCutShort,
    keep_alive_hint,
)
from providers.openai_http import OpenAIProvider
from tests.test_http_pool import RawServer, open_pool, reply, reset, wait_for

USER = [{"role": "user", "content": "Where did Maya meet Sam on March 3?"}]


# -- stale keep-alive connections ----------------------------------------------------------------

def closes_when_the_second_request_arrives(how: str):
    """Connection 1 answers one request, then reads the next and closes
    (FIN, or a reset) without a byte: what a server that timed the connection
    out does when the request crosses its close. Later connections answer all."""
    async def handler(server: RawServer, reader, writer, n):
        while (request := await server.read(reader, n)) is not None:
            if n == 1 and len(server.requests) > 1:
                if how == "reset":
                    reset(writer)
                return
            writer.write(reply(b"conn %d: %s" % (n, request[1])))
            await writer.drain()
    return handler


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_request_on_a_reused_connection_closed_without_a_byte_is_resent_once(how):
    async with RawServer(closes_when_the_second_request_arrives(how)) as server, open_pool() as pool:
        assert (await pool.post(server.url, b"a", timeout=5))[2] == b"conn 1: a"
        assert (await pool.post(server.url, b"b", timeout=5))[2] == b"conn 2: b"
        assert (await pool.post(server.url, b"c", timeout=5))[2] == b"conn 2: c"
        assert pool.connections_opened == 2 and pool.resent == 1
    assert [(n, body) for n, _, body in server.requests] == [(1, b"a"), (1, b"b"), (2, b"b"), (2, b"c")]


async def test_no_resend_once_a_reply_byte_arrived():
    async def handler(server, reader, writer, n):
        while (request := await server.read(reader, n)) is not None:
            if request[1] == b"partial":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Le")
                await writer.drain()
                return
            writer.write(reply(b"ok"))
            await writer.drain()

    async with RawServer(handler) as server, open_pool() as pool:
        await pool.post(server.url, b"first", timeout=5)
        with pytest.raises(ReplyCutShort):
            await pool.post(server.url, b"partial", timeout=5)
        assert pool.resent == 0
    assert [body for _, _, body in server.requests] == [b"first", b"partial"]


async def test_no_resend_on_a_fresh_connection():
    async def handler(server, reader, writer, n):
        await server.read(reader, n)  # and closes without a byte

    async with RawServer(handler) as server, open_pool() as pool:
        with pytest.raises(ReplyCutShort, match="before replying"):
            await pool.post(server.url, b"once", timeout=5)
        assert pool.connections_opened == 1 and pool.resent == 0
    assert [body for _, _, body in server.requests] == [b"once"]


# -- idle connections ---------------------------------------------------------------------------

def keep_alive_server(extra: tuple[str, ...] = ()):
    async def handler(server, reader, writer, n):
        while (request := await server.read(reader, n)) is not None:
            writer.write(reply(request[1], headers=extra))
            await writer.drain()
    return handler


async def test_idle_connections_are_closed_when_their_time_is_up_without_another_call():
    async with RawServer(keep_alive_server()) as server, open_pool(keepalive_timeout=0.2) as pool:
        await asyncio.gather(*(pool.post(server.url, b"%d" % i, timeout=5) for i in range(3)))
        assert server.connections == 3
        await wait_for(lambda: sorted(server.eofs) == [1, 2, 3])  # the pool closed them, unasked
        assert not any(pool._idle.values())


async def test_the_servers_keep_alive_timeout_shortens_the_idle_time():
    async with RawServer(keep_alive_server(("Keep-Alive: timeout=1, max=100",))) as server, \
            open_pool() as pool:  # 30 s of its own
        assert (await pool.post(server.url, b"x", timeout=5))[2] == b"x"
        [conn] = [c for conns in pool._idle.values() for c in conns]
        assert conn.keepalive == keep_alive_hint("timeout=1, max=100") == 0.5  # the server's 1 s, less a margin
        await wait_for(lambda: server.eofs == [1])  # then the pool closes it, unasked (the server never does)
        assert (await pool.post(server.url, b"y", timeout=5))[2] == b"y"
        assert pool.connections_opened == 2


def test_keep_alive_hints_are_read_with_a_margin():
    assert keep_alive_hint("timeout=5, max=1000") == 4.0
    assert keep_alive_hint("max=10, Timeout = 10") == 9.0
    assert keep_alive_hint("timeout=1") == 0.5
    assert keep_alive_hint("max=3") is None
    assert keep_alive_hint("timeout=soon") is None


# -- framing ------------------------------------------------------------------------------------

async def test_not_modified_and_no_content_replies_have_no_body_whatever_their_length_says():
    async def handler(server, reader, writer, n):
        while (request := await server.read(reader, n)) is not None:
            status = request[1].decode()
            # RFC 9110: a 304's Content-Length is the length the body would have had.
            writer.write(b"HTTP/1.1 %s\r\nContent-Length: 100\r\nETag: \"x\"\r\n\r\n" % status.encode()
                         if status.startswith("304") else b"HTTP/1.1 %s\r\n\r\n" % status.encode())
            writer.write(reply(b"next"))  # a second reply, right behind: the server pipelines nothing else
            await writer.drain()

    async with RawServer(handler) as server, open_pool(limit=1) as pool:
        status, headers, body = await pool.post(server.url, b"304 Not Modified", timeout=5)
        assert (status, body, headers["etag"]) == (304, b"", '"x"')
        # The reply right behind it was not taken for a body, nor for the next
        # call's reply: it was unasked, so the connection was dropped.
        status, _, body = await pool.post(server.url, b"204 No Content", timeout=5)
        assert (status, body) == (204, b"")
        assert pool.connections_opened == 2


async def test_one_request_at_a_time_per_connection_and_at_most_limit_connections():
    open_now = most_open = 0
    pipelined = []

    async def handler(server, reader, writer, n):
        nonlocal open_now, most_open
        open_now += 1
        most_open = max(most_open, open_now)
        try:
            while (request := await server.read(reader, n)) is not None:
                try:  # a pipelining client would have sent its next request by now
                    pipelined.append(await asyncio.wait_for(reader.read(1), 0.05))
                except TimeoutError:
                    pass
                writer.write(reply(request[1]))
                await writer.drain()
        finally:
            open_now -= 1

    async with RawServer(handler) as server, open_pool(limit=3) as pool:
        for burst in range(3):
            bodies = [b"%d-%d" % (burst, i) for i in range(10)]
            replies = await asyncio.gather(*(pool.post(server.url, body, timeout=10) for body in bodies))
            assert [r[2] for r in replies] == bodies
    assert pipelined == []
    assert most_open <= 3 and server.connections <= 3


# -- size limits --------------------------------------------------------------------------------

async def test_headers_over_the_limit_fail_clearly_even_before_they_end():
    async def handler(server, reader, writer, n):
        _, body = await server.read(reader, n)
        writer.write(b"HTTP/1.1 200 OK\r\n")
        if body == b"one-big":
            writer.write(b"X-Big: " + b"a" * 100_000 + b"\r\nContent-Length: 2\r\n\r\nok")
        else:  # endless header lines, never the blank line
            for i in range(1000):
                writer.write(b"X-%d: %s\r\n" % (i, b"b" * 200))
                await writer.drain()
                await asyncio.sleep(0)
        await writer.drain()
        await reader.read()

    async with RawServer(handler) as server, open_pool(max_header_size=16 * 1024) as pool:
        for body in (b"one-big", b"endless"):
            with pytest.raises(HeadersTooLarge, match="max_header_size") as info:
                await pool.post(server.url, body, timeout=10)
            assert isinstance(info.value, MalformedReply) and isinstance(info.value, OSError)
        assert pool.connections_opened == 2


async def test_bodies_over_the_limit_fail_clearly_as_sent_or_as_decoded():
    bomb = zlib.compress(b"\0" * 5_000_000, wbits=16 + zlib.MAX_WBITS)  # ~5 KB on the wire

    async def handler(server, reader, writer, n):
        while (request := await server.read(reader, n)) is not None:
            kind = request[1]
            if kind == b"length":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\nstart")
            elif kind == b"chunked":
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + b"1000\r\n" + b"c" * 4096 + b"\r\n" + b"1000\r\n" + b"c" * 4096 + b"\r\n")
            elif kind == b"bomb":
                writer.write(reply(bomb, headers=("Content-Encoding: gzip",)))
            else:
                writer.write(reply(b"small"))
            await writer.drain()

    async with RawServer(handler) as server, open_pool(limit=1, max_body_size=6000) as pool:
        for kind in (b"length", b"chunked", b"bomb"):
            with pytest.raises(BodyTooLarge, match="max_body_size"):
                await pool.post(server.url, kind, timeout=5)
            assert (await pool.post(server.url, b"ok", timeout=5))[2] == b"small"
        for kind in (b"chunked", b"bomb"):
            async with await pool.post_stream(server.url, kind, timeout=5) as stream:
                with pytest.raises(BodyTooLarge, match="max_body_size"):
                    await stream.read()
        assert (await pool.post(server.url, b"ok", timeout=5))[2] == b"small"


async def test_a_reply_over_the_limits_is_a_connection_error_through_the_provider():
    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000000\r\n\r\n{")
        await writer.drain()
        await reader.read()

    async with RawServer(handler) as server:
        provider = OpenAIProvider(EndpointSpec(name="big", kind="openai",
                                               base_url=f"http://127.0.0.1:{server.port}/v1"), "sk-secret-key-1")
        try:
            with pytest.raises(ProviderError) as info:
                await provider.chat("m", USER, params={}, timeout=5)
        finally:
            await provider.aclose()
    assert info.value.kind == CONNECTION
    assert "BodyTooLarge" in str(info.value) and "max_body_size" in str(info.value)
    assert "sk-secret" not in str(info.value) and "\n" not in str(info.value)


# -- timeouts -----------------------------------------------------------------------------------

async def test_connect_timeout_bounds_a_tls_handshake_that_never_ends():
    async def silent(server, reader, writer, n):
        await reader.read()  # accepts the TCP connection, never answers the TLS hello

    ca = trustme.CA()
    context = ssl.create_default_context()
    ca.configure_trust(context)
    async with RawServer(silent) as server, open_pool(ssl_context=context, connect_timeout=0.2) as pool:
        with pytest.raises(TimeoutError, match="connect_timeout"):
            await pool.post(f"https://127.0.0.1:{server.port}/v1", b"", timeout=30)


def stalls(after: bytes):
    """Reads a request, sends `after` and then nothing."""
    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        writer.write(after)
        await writer.drain()
        await asyncio.sleep(30)
    return handler


async def test_first_byte_timeout_and_read_timeout_fire_before_the_total():
    async with RawServer(stalls(b"")) as server, open_pool(first_byte_timeout=0.2) as pool:
        with pytest.raises(TimeoutError, match="first_byte_timeout"):  # the limit that fired, not the call's 30 s
            await pool.post(server.url, b"", timeout=30)
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart of it"
    async with RawServer(stalls(head)) as server, open_pool(read_timeout=0.2) as pool:
        with pytest.raises(TimeoutError, match="read_timeout"):
            await pool.post(server.url, b"", timeout=30)
    async with RawServer(stalls(head)) as server, open_pool(first_byte_timeout=0.2, read_timeout=0.2) as pool:
        with pytest.raises(TimeoutError, match="read_timeout"):
            await pool.post(server.url, b"", timeout=30)
        stream = await pool.post_stream(server.url, b"", timeout=30)  # the head came: the stream begins
        assert await stream.__anext__() == b"part of it"
        with pytest.raises(TimeoutError, match="read_timeout"):
            await stream.__anext__()
        assert pool.connections_opened == 2


async def test_read_timeout_is_between_reads_not_for_the_whole_reply():
    pieces = [b"data: %d\n\n" % i for i in range(8)]

    async def trickle(server, reader, writer, n):
        while await server.read(reader, n) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for piece in pieces:
                await asyncio.sleep(0.05)
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async with RawServer(trickle) as server, open_pool(first_byte_timeout=0.3, read_timeout=0.3) as pool:
        # 0.4 s in all, more than either limit, but never 0.3 s without a byte.
        assert (await pool.post(server.url, b"", timeout=10))[2] == b"".join(pieces)
        async with await pool.post_stream(server.url, b"", timeout=10) as stream:
            assert await stream.read() == b"".join(pieces)
        assert pool.connections_opened == 1


async def test_a_consumer_that_lags_is_not_a_read_timeout_but_a_server_that_stalls_after_is():
    size = 4 * 1024 * 1024

    async def handler(server, reader, writer, n):
        await server.read(reader, n)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (2 * size) + b"z" * size)
        await writer.drain()
        await asyncio.sleep(30)  # half the body, then nothing

    async with RawServer(handler) as server, open_pool(read_timeout=0.2) as pool:
        async with await pool.post_stream(server.url, b"", timeout=30) as stream:
            conn = stream._conn
            await wait_for(lambda: conn.paused)
            await asyncio.sleep(0.5)  # the pool stopped reading, on our behalf: not the server's delay
            assert conn.error is None
            received = 0
            with pytest.raises(TimeoutError, match="read_timeout"):
                async for piece in stream:
                    received += len(piece)
            assert received == size  # and the error names the between-reads limit, not the call's 30 s


# -- the endpoint options -----------------------------------------------------------------------

async def test_endpoint_timeout_options_reach_the_pool_and_name_the_limit_in_the_error():
    async with RawServer(stalls(b"")) as server:
        spec = EndpointSpec(name="slow", kind="openai", base_url=f"http://127.0.0.1:{server.port}/v1",
                            options={"first_byte_timeout": 0.2, "read_timeout": 7, "connect_timeout": 3,
                                     "keepalive_timeout": 9})
        provider = OpenAIProvider(spec, "sk-x")
        try:
            with pytest.raises(ProviderError) as info:
                await provider.chat("m", USER, params={}, timeout=30)
            pool = provider._http._pool
            assert isinstance(pool, HttpPool)
            assert (pool.first_byte_timeout, pool.read_timeout, pool.connect_timeout, pool.keepalive_timeout) \
                == (0.2, 7, 3, 9)
        finally:
            await provider.aclose()
    assert info.value.kind == TIMEOUT
    assert "first_byte_timeout" in str(info.value) and "0.2 s" in str(info.value)


async def test_the_aiohttp_client_takes_connect_and_read_timeouts():
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"
    async with RawServer(stalls(head)) as server:
        spec = EndpointSpec(name="slow", kind="openai", base_url=f"http://127.0.0.1:{server.port}/v1",
                            options={"http_client": "aiohttp", "read_timeout": 0.2})
        provider = OpenAIProvider(spec, "sk-x")
        try:
            with pytest.raises(ProviderError) as info:
                await provider.chat("m", USER, params={}, timeout=30)
        finally:
            await provider.aclose()
    assert info.value.kind == TIMEOUT
    assert "within 30 s" not in str(info.value)  # aiohttp's socket read limit fired, not the call's total


# -- unasked bytes and TLS ----------------------------------------------------------------------

async def test_a_connection_that_says_anything_while_idle_is_not_reused():
    async def handler(server, reader, writer, n):
        while (request := await server.read(reader, n)) is not None:
            writer.write(reply(b"conn %d: %s" % (n, request[1])))
            await writer.drain()
            if n == 1:
                await asyncio.sleep(0.02)
                writer.write(b"HTTP/1.1 200 OK\r\n")  # the start of a reply nobody asked for
                await writer.drain()

    async with RawServer(handler) as server, open_pool() as pool:
        assert (await pool.post(server.url, b"a", timeout=5))[2] == b"conn 1: a"
        await asyncio.sleep(0.1)
        assert (await pool.post(server.url, b"b", timeout=5))[2] == b"conn 2: b"
        assert pool.connections_opened == 2


async def test_the_default_tls_context_uses_ssl_cert_file_sni_and_offers_only_http11(tmp_path, monkeypatch):
    import providers.http_pool as http_pool

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    cert = ca.issue_cert("localhost")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_context)
    server_context.set_alpn_protocols(["h2", "http/1.1"])  # would pick h2 if the client offered it
    seen = []

    async def handler(server, reader, writer, n):
        seen.append(writer.get_extra_info("ssl_object").selected_alpn_protocol())
        while (request := await server.read(reader, n)) is not None:
            writer.write(reply(request[1]))
            await writer.drain()

    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    monkeypatch.setattr(http_pool, "_default_ssl_context", None)  # built afresh, reading SSL_CERT_FILE
    names = []
    server_context.sni_callback = lambda sock, name, context: names.append(name)
    server = RawServer(handler)
    server.server = await asyncio.start_server(server._serve, "127.0.0.1", 0, ssl=server_context)
    port = server.server.sockets[0].getsockname()[1]
    try:
        async with open_pool() as pool:
            assert (await pool.post(f"https://localhost:{port}/v1", b"tls", timeout=5))[2] == b"tls"
    finally:
        await server.__aexit__(None, None, None)
    assert seen == ["http/1.1"]
    assert names == ["localhost"]
