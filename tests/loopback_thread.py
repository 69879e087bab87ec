"""The loopback server as `python -m engine.loopback ARGS...` makes it (the
same options, engine/loopback/cli.py), served over TCP from a thread of the
test's own process instead of a process of its own: a command run as a
subprocess reaches it as before, and the test reads its statistics directly.

    with ThreadedLoopback("--ttft-ms", "40", "--models", "m-model") as server:
        server.url                     # the OpenAI base URL, http://127.0.0.1:PORT/v1
        server.stats()                 # as GET /loopback/stats answers
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

from engine.loopback import cli as loopback_cli
from engine.loopback.server import LoopbackServer


class ThreadedLoopback:
    def __init__(self, *args: str):
        self.server: LoopbackServer = loopback_cli._server_from_args(
            loopback_cli._parse_args(["--port", "0", *args], "loopback"))
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        started: Future[None] = Future()
        self._thread = threading.Thread(target=self._serve, args=(started,), name="loopback", daemon=True)
        self._thread.start()
        started.result(timeout=120)
        self.url = self.server.openai_base_url

    def _serve(self, started: Future[None]) -> None:
        async def serve() -> None:
            self._stop = asyncio.Event()
            try:
                await self.server.start()
            except BaseException as exc:
                started.set_exception(exc)
                raise
            started.set_result(None)
            try:
                await self._stop.wait()
            finally:
                await self.server.close()
        self._loop.run_until_complete(serve())
        self._loop.close()

    def stats(self) -> dict[str, object]:
        """The server's statistics, read on its own loop."""
        async def read() -> dict[str, object]:
            return self.server.stats.to_dict()
        return asyncio.run_coroutine_threadsafe(read(), self._loop).result(timeout=60)

    def stop(self) -> None:
        if self._thread.is_alive() and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(timeout=60)

    def __enter__(self) -> ThreadedLoopback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
