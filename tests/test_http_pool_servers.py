"""The hand-written pool against HTTP servers nobody here wrote, on loopback:
uvicorn (with its h11 and its httptools protocol), hypercorn (h11) and
aiohttp.web, all serving the same tiny app: echo, a streamed chunked reply,
gzip, `Connection: close`, and their own keep-alive timeouts closing idle
connections."""
from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
from collections.abc import AsyncIterator

import hypercorn.asyncio
import hypercorn.config
import pytest
import uvicorn
from aiohttp import web

from providers.http_pool import HttpPool

KEEP_ALIVE = 0.3  # s the servers keep an idle connection
PIECES = [b"data: {\"n\": %d}\n\n" % i for i in range(5)]
GZIPPED = b"compressed reply " * 100


class App:
    """The ASGI app. /stream sends its first piece, then waits for `gate` (set
    by the test once it has read that piece) before sending the rest."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        path = scope["path"]
        if path == "/stream":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for i, piece in enumerate(PIECES):
                if i == 1:
                    await self.gate.wait()
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        headers = [(b"content-type", b"application/json")]
        if path == "/gzip":
            body = gzip.compress(GZIPPED)
            headers.append((b"content-encoding", b"gzip"))
        elif path == "/close":
            headers.append((b"connection", b"close"))
        else:
            body = b"echo:" + body
        headers.append((b"content-length", b"%d" % len(body)))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def aiohttp_app(app: App, request: web.Request) -> web.StreamResponse:
    """The same app in aiohttp.web's terms."""
    body = await request.read()
    if request.path == "/stream":
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, piece in enumerate(PIECES):
            if i == 1:
                await app.gate.wait()
            await response.write(piece)
        await response.write_eof()
        return response
    if request.path == "/gzip":
        return web.Response(body=gzip.compress(GZIPPED), headers={"Content-Encoding": "gzip"},
                            content_type="application/json")
    if request.path == "/close":
        response = web.Response(body=body, content_type="application/json")
        response.force_close()
        return response
    return web.Response(body=b"echo:" + body, content_type="application/json")


def bound_socket() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    sock.setblocking(False)
    return sock


@contextlib.asynccontextmanager
async def serving(kind: str, app: App) -> AsyncIterator[str]:
    """Serve `app` with server `kind` on loopback; yields the base URL."""
    sock = bound_socket()
    port = sock.getsockname()[1]
    if kind.startswith("uvicorn"):
        config = uvicorn.Config(app, http=kind.split("-")[1], lifespan="off", log_level="warning",
                                timeout_keep_alive=KEEP_ALIVE)  # type: ignore[arg-type]
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            assert not task.done(), task.exception()
            await asyncio.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            await task
    elif kind == "hypercorn":
        config = hypercorn.config.Config()
        config.bind = [f"fd://{sock.fileno()}"]
        config.keep_alive_timeout = KEEP_ALIVE
        config.accesslog = None
        config.errorlog = None
        stop = asyncio.Event()
        task = asyncio.create_task(hypercorn.asyncio.serve(app, config, shutdown_trigger=stop.wait))
        try:
            await wait_listening(port)
            yield f"http://127.0.0.1:{port}"
        finally:
            stop.set()
            await task
            sock.detach()  # hypercorn took the descriptor over and closed it
    else:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await aiohttp_app(app, request)

        web_app = web.Application()
        web_app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(web_app, access_log=None, keepalive_timeout=KEEP_ALIVE)
        await runner.setup()
        site = web.SockSite(runner, sock)
        await site.start()
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


async def wait_listening(port: int) -> None:
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.01)
            continue
        writer.close()
        return
    raise AssertionError(f"nothing listens on port {port}")


SERVERS = ["uvicorn-h11", "uvicorn-httptools", "hypercorn", "aiohttp"]


@pytest.mark.parametrize("kind", SERVERS)
async def test_keep_alive_and_many_calls_at_once(kind):
    app = App()
    async with serving(kind, app) as base:
        pool = HttpPool(limit=8)
        try:
            for i in range(10):
                status, _, body = await pool.post(f"{base}/echo", b"%d" % i, timeout=5)
                assert (status, body) == (200, b"echo:%d" % i)
            assert pool.connections_opened == 1
            replies = await asyncio.gather(*(pool.post(f"{base}/echo", b"c%d" % i, timeout=10) for i in range(40)))
            assert [r[2] for r in replies] == [b"echo:c%d" % i for i in range(40)]
            assert all(r[0] == 200 and r[1]["content-type"].startswith("application/json") for r in replies)
            assert pool.connections_opened <= 8
        finally:
            await pool.aclose()


@pytest.mark.parametrize("kind", SERVERS)
async def test_a_streamed_chunked_reply_arrives_piece_by_piece(kind):
    app = App()
    async with serving(kind, app) as base:
        pool = HttpPool(limit=2)
        try:
            async with await pool.post_stream(f"{base}/stream", b"{}", timeout=10) as stream:
                assert stream.status == 200 and stream.headers["content-type"].startswith("text/event-stream")
                first = await stream.__anext__()
                assert first == PIECES[0]  # the server holds the rest until the test has it
                app.gate.set()
                assert first + await stream.read() == b"".join(PIECES)
            # read to its end: the connection serves the next call
            assert (await pool.post(f"{base}/echo", b"after", timeout=5))[2] == b"echo:after"
            assert pool.connections_opened == 1
            # a stream given up in the middle drops its connection; the server copes
            app.gate.clear()
            stream = await pool.post_stream(f"{base}/stream", b"{}", timeout=10)
            assert await stream.__anext__() == PIECES[0]
            await stream.aclose()
            app.gate.set()
            assert (await pool.post(f"{base}/echo", b"again", timeout=5))[2] == b"echo:again"
            assert pool.connections_opened == 2
        finally:
            await pool.aclose()


@pytest.mark.parametrize("kind", SERVERS)
async def test_gzip_connection_close_and_the_servers_keep_alive_timeout(kind):
    app = App()
    async with serving(kind, app) as base:
        pool = HttpPool(limit=2)
        try:
            status, headers, body = await pool.post(f"{base}/gzip", b"", timeout=5)
            assert (status, headers["content-encoding"], body) == (200, "gzip", GZIPPED)
            async with await pool.post_stream(f"{base}/gzip", b"", timeout=5) as stream:
                assert await stream.read() == GZIPPED
            assert pool.connections_opened == 1
            status, headers, _ = await pool.post(f"{base}/close", b"bye", timeout=5)
            assert headers["connection"] == "close"
            assert (await pool.post(f"{base}/echo", b"x", timeout=5))[2] == b"echo:x"
            assert pool.connections_opened == 2  # not sent on the closed one
            await asyncio.sleep(KEEP_ALIVE * 3)  # the server closes the idle connection
            assert (await pool.post(f"{base}/echo", b"y", timeout=5))[2] == b"echo:y"
            assert pool.connections_opened == 3
        finally:
            await pool.aclose()
