"""The in-process transport (providers/transport.py): the providers' HTTP
clients reach a server of this process through memory pipes, with the bytes
the server writes, and everything that happens to a TCP connection (a reset,
a close mid-body, a client that gives up) happens to a pipe the same way."""
from __future__ import annotations

import asyncio
import socket
import threading

import pytest
from aiohttp import web

from engine.loopback.server import Faults, LoopbackServer
from providers import transport
from providers.base import CONNECTION, TIMEOUT, ProviderError
from providers.http_client import JsonHttpClient
from providers.http_pool import HttpPool, ReplyCutShort

BODY = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}


def client(**options) -> JsonHttpClient:
    return JsonHttpClient(endpoint="e", max_concurrency=4, headers={}, secret=None,
                          request_id_header="x-request-id", **options)


async def test_the_pool_and_the_aiohttp_session_reach_the_loopback_without_a_socket():
    async with LoopbackServer(in_process=True, models=["m"]) as server:
        assert server.openai_base_url.startswith("http://127.0.0.1:")  # a loopback port held for it
        with pytest.raises(ConnectionRefusedError):  # bound, never listening: another process is refused
            socket.create_connection(("127.0.0.1", server.port), timeout=10).close()
        http = client()
        url = server.openai_base_url + "/chat/completions"
        replies = await asyncio.gather(*[http.post(url, BODY, 10) for _ in range(6)])
        assert {r[0]["choices"][0]["message"]["content"] for r in replies} == {"Reply 22e2d63d: hello there"}
        assert replies[0][1]["content-type"].startswith("application/json")  # the loopback's own headers
        async with http.stream(url, {**BODY, "stream": True}, 10) as reply:
            events = b"".join([piece async for piece in reply])
        assert events.startswith(b"data: {") and events.rstrip().endswith(b"data: [DONE]")
        raw, _ = await http.request_bytes("GET", server.openai_base_url + "/models")  # aiohttp's session
        assert b'"m"' in raw
        await http.aclose()
        assert server.stats.by_status[200] == 7  # six calls and the stream


async def test_keep_alive_reuses_one_pipe_and_a_reset_ends_it_as_over_tcp():
    """A reset met on a reused connection with no reply byte is sent again
    once (the pool's rule for a server that closed it while idle); on a fresh
    connection it is the call's error."""
    async with LoopbackServer(in_process=True, models=["m"], faults=Faults(schedule=[None, None, "reset", "reset"])
                              ) as server:
        pool = HttpPool(limit=1, headers={"Content-Type": "application/json"})
        url = server.openai_base_url + "/chat/completions"
        body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
        for _ in range(2):
            status, _, _ = await pool.post(url, body, 10)
            assert status == 200
        assert pool.connections_opened == 1
        with pytest.raises(ReplyCutShort, match="reset"):
            await pool.post(url, body, 10)
        assert (pool.resent, pool.connections_opened) == (1, 2)
        await pool.aclose()


async def test_a_truncated_body_and_a_client_timeout_end_as_over_tcp():
    faults = Faults(schedule=["truncate", "stall"], stall_seconds=60)
    async with LoopbackServer(in_process=True, models=["m"], faults=faults) as server:
        http = client()
        url = server.openai_base_url + "/chat/completions"
        with pytest.raises(ProviderError) as cut:
            await http.post(url, BODY, 10)
        assert cut.value.kind == CONNECTION and "in the middle of the reply body" in str(cut.value)
        with pytest.raises(ProviderError) as late:
            await http.post(url, BODY, 0.2)  # the stall outlasts the call's timeout
        assert late.value.kind == TIMEOUT
        await http.aclose()
        for _ in range(100):  # the server sees its client leave (its handler is cancelled)
            if server.stats.by_status.get("client_gone"):
                break
            await asyncio.sleep(0.01)
        assert server.stats.by_status["client_gone"] == 1


async def test_any_handler_can_be_mounted_and_a_client_in_another_thread_reaches_it():
    """As httpx's MockTransport: a plain aiohttp handler, mounted at a URL of
    its own, served on this loop to a client running in another thread's loop."""
    seen = []

    async def handler(request: web.BaseRequest) -> web.Response:
        seen.append((request.method, request.path, await request.json()))
        return web.json_response({"echo": request.headers["Authorization"]})

    base = transport.fresh_base_url()
    unmount = transport.mount(base, web.Server(handler))
    try:
        def elsewhere() -> dict:
            async def call() -> dict:
                http = JsonHttpClient(endpoint="e", max_concurrency=1, headers={"Authorization": "Bearer k"},
                                      secret="k", request_id_header="x")
                try:
                    return (await http.post(base + "/v1/x", {"a": 1}, 10))[0]
                finally:
                    await http.aclose()
            return asyncio.run(call())

        result: list[dict] = []
        thread = threading.Thread(target=lambda: result.append(elsewhere()))
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.01)
        assert result == [{"echo": "Bearer k"}] and seen == [("POST", "/v1/x", {"a": 1})]
    finally:
        unmount()
    assert not transport.mounted(transport.origin_of(base))


async def test_an_origin_nobody_mounted_is_not_in_process_and_a_mount_is_exclusive():
    assert not transport.mounted(("http", "127.0.0.1", 9))
    base = transport.fresh_base_url()
    unmount = transport.mount(base, web.Server(lambda request: web.Response()))
    with pytest.raises(ValueError, match="already mounted"):
        transport.mount(base + "/other/path", web.Server(lambda request: web.Response()))
    unmount()
    with pytest.raises(ConnectionRefusedError):
        transport.connect(transport.origin_of(base), asyncio.Protocol())
