"""A loopback server speaking the OpenAI and Anthropic HTTP APIs, for tests and
benchmarks (no real LLM API is needed, and none is called).

One aiohttp server, one port:
- OpenAI (base URL `http://HOST:PORT/v1`): POST /v1/chat/completions (also
  streamed), POST /v1/embeddings, POST /v1/files (multipart; purposes
  "fine-tune", "batch"), GET /v1/files/{id}, GET /v1/files/{id}/content,
  POST /v1/fine_tuning/jobs, GET /v1/fine_tuning/jobs/{id}, the Batch API
  (POST/GET /v1/batches, GET /v1/batches/{id}, POST /v1/batches/{id}/cancel);
- Anthropic (base URL `http://HOST:PORT`): POST /v1/messages (also streamed),
  Message Batches (/v1/messages/batches: create, list, retrieve, cancel,
  delete, results);
- GET /loopback/stats.
Replies are close enough to the real ones that the official `openai` and
`anthropic` SDK clients accept them (tests/test_sdk_compat.py and
tests/test_loopback_{stream,cache,batches}.py).

Behaviour, all configurable:
- reply text: `reply(api, body) -> str` ("openai" | "anthropic"; may return
  `(text, finish_reason)` to force a finish reason such as "content_filter";
  for Anthropic any of the API's stop reasons too, e.g. "refusal",
  "pause_turn", "model_context_window_exceeded", with or without text);
  the default derives a short deterministic text from the last user message.
  `max_tokens` and `stop` are honoured (finish "length" / stop sequence).
- streaming (loopback_stream): `"stream": true` gets server-sent events in the
  API's format (OpenAI chunks, `stream_options.include_usage`, `[DONE]`;
  Anthropic message_start ... message_stop with `event:` lines and a ping)
  carrying the same text and usage as the non-streamed reply, one delta per
  output token.
- embeddings: hashed bag of words, L2-normalised, `embed_dim` wide (or the
  request's `dimensions`), so texts sharing words are close; float or base64.
- usage tokens: `tokens="cheap"` (ceil(len/4)), "cl100k" (engine.tokens) or a
  callable; `context_tokens` rejects longer prompts the way each API does.
- latency: callables returning seconds (`constant`, `uniform`, `lognormal`
  below). `latency`: the wait of a whole reply (and, without `ttft`, a
  stream's wait before its first token). `ttft` and `token_delay`: time to
  first token and the gap between tokens of a stream; without `latency`, a
  non-streamed reply waits ttft plus its tokens' gaps (the same generation).
- provider prompt caching (loopback_cache): Anthropic `cache_control` prefixes
  are written, then read within their TTL (usage `cache_creation_input_tokens`
  / `cache_read_input_tokens`, `input_tokens` the uncached rest); OpenAI
  caches prompts of >= 1024 tokens automatically and reports
  `prompt_tokens_details.cached_tokens` in 128-token steps. `cache_min_tokens`
  (both; default 1024) and `cache_ttl` (default 300 s). A cache is warm only
  once the reply that wrote it has finished.
- batches (loopback_batches, knobs in `BatchKnobs`): a batch ends on its
  `polls`-th status poll; `fail_share` of the lines fail with a 500,
  `expire_after` makes batches expire part-done, results come out of order
  unless `shuffle=False`; `fail_status` / `fail_type` make the failing lines
  e.g. Anthropic's 402 billing_error. Results and output files are refused
  (406) to an Accept that excludes JSONL (`application/json`). Lines are answered exactly as the direct endpoint
  would, without limits, faults or latency.
- rate limits (loopback_limits), enforced like the real APIs: token buckets for
  requests (rpm), input tokens (input_tpm), output tokens (output_tpm) and
  prompt + max_tokens (tpm, OpenAI's way of counting) that refill
  continuously, or with `window="sliding"` sliding windows (at most a
  second's share in any 1 s, a minute's in any 60 s); `limit_headers=False`
  sends no rate-limit headers. Both OpenAI and Anthropic document that a per-minute
  limit is enforced over shorter intervals ("60 RPM may be enforced as 1
  request per second"), so each bucket holds `burst_seconds` worth of its rate
  (default 1 s, at least one request). A call whose input exceeds the bucket is
  admitted when the bucket is full and leaves it in debt (so big prompts can
  pass, at the average rate); Anthropic cache reads are not charged. The output
  bucket must be positive to admit a call and is charged with the tokens
  actually generated (Anthropic estimates at start and corrects; the average is
  the same). Over a limit -> 429 with `retry-after` (integer seconds, rounded
  up, as the real APIs send) plus `retry-after-ms`. Every reply of a limited
  endpoint, streamed or not, carries its API's rate-limit headers
  (`x-ratelimit-{limit,remaining,reset}-{requests,tokens}` with Go-duration
  resets / `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-*`
  with RFC 3339 resets) reporting the minute's budget as the APIs do:
  "remaining" is what is left of the per-minute limit, "reset" the time until
  all of it is restored (so a 429 of the short-interval enforcement may come
  with "remaining" > 0, as from the real APIs).
- faults (`Faults`): a deterministic schedule and/or seeded per-request
  probabilities of 429s naming their wait only the way the API does (OpenAI:
  "Please try again in 644ms." in the message), 500/502/503/504/529 errors
  (optionally all with `x-should-retry`), stalls past the client's
  timeout, connection resets, truncated bodies, non-JSON 200s and content
  policy refusals. On a stream, "reset", "truncate" and "stream_error" break
  it once half its tokens are out (a TCP RST / a close without the stream's
  end / the API's in-stream error event; unstreamed, "stream_error" is a 500,
  Anthropic's a 529).
- auth: with `api_keys`, calls without one of them get the API's 401 (echoing
  the presented key in full, on purpose: clients must scrub it).
- TLS: with `ssl_context` (standalone: `--tls-cert`/`--tls-key`) it serves
  HTTPS, as the public APIs do; clients trust its certificate through
  `SSL_CERT_FILE` like any OpenSSL program.
- `stats`: requests, per status (a client gone mid-call: "client_gone"), per
  path, 429s, faults, max in flight, accepted-request timestamps (to check
  limits), token totals, prompt-cache reads and writes, streams started and
  cancelled by their client, batch lines by outcome and their tokens; also
  served as JSON at GET /loopback/stats for benchmarks running the server
  elsewhere.

Standalone, for benchmarks in another process (options: loopback_cli):
    python -m engine.loopback --port 8080 --rpm 3000 --ttft-ms 300 --token-delay-ms 20
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import math
import random
import re
import socket
import ssl
import struct
import sys
import time
from array import array
from bisect import bisect_right
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import TracebackType
from typing import Any, TypedDict

import orjson
from aiohttp import web

from engine.loopback import compat as compat_api
from engine.loopback.batches import JSONL_TYPES, Batches, BatchKnobs, StoredFile
from engine.loopback.errors import _json, _Reject, anthropic_error, error_response, file_reply, openai_error
from engine.loopback.errors import error_body as api_error_body
from engine.loopback.gemini import GeminiApi
from engine.loopback.limits import RateLimits, TokenBucket, go_duration, rfc3339  # noqa: F401 (also the API)
from engine.loopback.model_catalog import ModelCatalog
from engine.loopback.prompt_cache import NO_CACHE, CacheError, CacheLookup, PromptCache
from engine.loopback.stream import Progress, anthropic_frames, openai_frames, write_stream
from engine.tokens import count_tokens
from providers import transport
from providers.base import JSONObject

ReplyFn = Callable[[str, dict[str, Any]], "str | tuple[str, str]"]
Handler = Callable[[web.Request], Awaitable[web.Response]]  # an aiohttp route handler
LatencyFn = Callable[[], float]

FAULT_KINDS = frozenset({"429", "500", "502", "503", "504", "529", "stall", "reset", "truncate", "bad_json",
                         "content_filter", "stream_error"})
_FAULTABLE = frozenset({"/v1/chat/completions", "/v1/embeddings", "/v1/messages"})


# -- latency distributions ----------------------------------------------------------

def constant(seconds: float) -> LatencyFn:
    return lambda: seconds


def uniform(low: float, high: float, seed: int = 0) -> LatencyFn:
    rng = random.Random(seed)
    return lambda: rng.uniform(low, high)


def lognormal(median: float, sigma: float = 0.5, seed: int = 0) -> LatencyFn:
    """Heavy-tailed latency, as real APIs show: median `median` seconds."""
    rng = random.Random(seed)
    mu = math.log(median)
    return lambda: rng.lognormvariate(mu, sigma)


# -- faults ---------------------------------------------------------------------------

@dataclass
class Faults:
    """Which chat/embeddings/messages calls fail, and how.

    `schedule[i]` is the fault of the i-th such call (None: serve normally);
    after the schedule, each call draws from `rates` (fault -> probability)
    with a RNG seeded by `seed`. Kinds: "500" "502" "503" "504" "529" (HTTP
    errors in the API's error shape), "stall" (no reply for `stall_seconds`),
    "reset" (connection reset mid-request), "truncate" (headers promise the
    full body, half is sent, then the connection closes), "bad_json" (a 200
    whose body is not JSON), "content_filter" (OpenAI: 400
    content_policy_violation; Anthropic: a reply with stop_reason "refusal"),
    "stream_error" (a stream ends with the API's in-stream error event; an
    unstreamed call gets a 500, Anthropic a 529). "reset" and "truncate" cut
    a stream once half its tokens are out. "429": a rate-limit error that
    names its wait, `try_again` seconds, the way each API does: OpenAI only in
    its message ("... Please try again in 644ms.", no retry-after header),
    Anthropic in retry-after.

    `should_retry` ("true" / "false"; None: not sent): every fault's error
    reply carries `x-should-retry` with it, the header by which the real APIs
    overrule the status's own retry rule (both official SDKs obey it).
    """

    schedule: Sequence[str | None] = ()
    rates: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0
    stall_seconds: float = 3600.0
    try_again: float = 0.644
    should_retry: str | None = None

    def __post_init__(self) -> None:
        unknown = {k for k in itertools.chain(self.schedule, self.rates) if k is not None} - FAULT_KINDS
        if unknown:
            raise ValueError(f"unknown fault kind(s) {sorted(unknown)} (known: {', '.join(sorted(FAULT_KINDS))})")
        if sum(self.rates.values()) > 1.0 or any(p < 0 for p in self.rates.values()):
            raise ValueError("fault rates must be >= 0 and sum to at most 1")
        if self.should_retry not in (None, "true", "false"):
            raise ValueError(f"should_retry must be 'true' or 'false', got {self.should_retry!r}")
        if not self.try_again >= 0:
            raise ValueError(f"try_again must be a number of seconds >= 0, got {self.try_again!r}")
        self._rng = random.Random(self.seed)
        self._index = 0
        self._cumulative = list(itertools.accumulate(self.rates.values()))
        self._kinds = list(self.rates)

    @classmethod
    def first(cls, n: int, kind: str, **kwargs: Any) -> Faults:
        """Fail the first `n` calls with `kind`, then serve normally."""
        return cls(schedule=[kind] * n, **kwargs)

    def pick(self) -> str | None:
        index, self._index = self._index, self._index + 1
        if index < len(self.schedule):
            return self.schedule[index]
        if not self._kinds:
            return None
        pos = bisect_right(self._cumulative, self._rng.random())  # first kind whose share covers the draw
        return self._kinds[pos] if pos < len(self._kinds) else None


# -- replies, tokens, embeddings -----------------------------------------------------------

def _content_text(content: object) -> str:
    """A message's text: a string, or the text parts of a content-block list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def last_user_text(body: Mapping[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return _content_text(message.get("content"))
    return ""


def default_reply(api: str, body: dict[str, Any]) -> str:
    """Short, deterministic, derived from the last user message."""
    text = last_user_text(body)
    digest = hashlib.blake2b(text.encode(), digest_size=4).hexdigest()
    words = text.split()
    return f"Reply {digest}: " + " ".join(words[:12])


def cheap_tokens(text: str) -> int:
    return (len(text) + 3) // 4


def _token_counter(tokens: str | Callable[[str], int]) -> Callable[[str], int]:
    if callable(tokens):
        return tokens
    if tokens == "cheap":
        return cheap_tokens
    if tokens == "cl100k":
        return count_tokens
    raise ValueError(f"tokens must be 'cheap', 'cl100k' or a callable, not {tokens!r}")


_WORD = re.compile(r"\w+")


@lru_cache(maxsize=65536)
def _word_slot(word: str, dim: int) -> tuple[int, float]:
    value = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
    return value % dim, (1.0 if (value >> 32) & 1 else -1.0)


def hashed_embedding(text: str, dim: int) -> list[float]:
    """Bag of lower-cased words hashed into `dim` signed slots, L2-normalised:
    deterministic, and texts sharing words get a high cosine."""
    vector = [0.0] * dim
    for word in _WORD.findall(text.lower()):
        slot, sign = _word_slot(word, dim)
        vector[slot] += sign
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm else vector


# -- stats ----------------------------------------------------------------------------------

@dataclass
class ServerStats:
    requests: int = 0
    by_status: Counter[int | str] = field(default_factory=Counter)   # HTTP status (or what cut it short) -> count
    by_path: Counter[str] = field(default_factory=Counter)
    rate_limited: int = 0
    faults: Counter[str] = field(default_factory=Counter)      # fault kind -> count injected
    in_flight: int = 0
    max_in_flight: int = 0
    accepted_times: list[float] = field(default_factory=list)  # time.monotonic() of calls past the limits
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0    # prompt tokens served from the provider prompt cache
    cache_write_tokens: int = 0   # ...and written to it (Anthropic)
    streams: int = 0              # streamed replies started
    streams_cancelled: int = 0    # ...whose client left before the end
    batch_requests: Counter[str] = field(default_factory=Counter)  # batch lines by outcome
    batch_input_tokens: int = 0
    batch_output_tokens: int = 0

    def to_dict(self) -> dict[str, object]:
        return {"requests": self.requests, "by_status": {str(k): v for k, v in self.by_status.items()},
                "by_path": dict(self.by_path), "rate_limited": self.rate_limited, "faults": dict(self.faults),
                "in_flight": self.in_flight, "max_in_flight": self.max_in_flight,
                "accepted": len(self.accepted_times), "max_accepted_per_second": self.max_accepted_in(1.0),
                "max_accepted_per_minute": self.max_accepted_in(60.0),
                "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cache_read_tokens": self.cache_read_tokens, "cache_write_tokens": self.cache_write_tokens,
                "streams": self.streams, "streams_cancelled": self.streams_cancelled,
                "batch_requests": dict(self.batch_requests), "batch_input_tokens": self.batch_input_tokens,
                "batch_output_tokens": self.batch_output_tokens}

    def max_accepted_in(self, window: float) -> int:
        """The most accepted calls in any `window`-second interval."""
        times, best, lo = self.accepted_times, 0, 0
        for hi, t in enumerate(times):
            while t - times[lo] >= window:
                lo += 1
            best = max(best, hi - lo + 1)
        return best


def _max_tokens(body: Mapping[str, Any]) -> int:
    """The completion tokens a request reserves (OpenAI's TPM counts them at admission)."""
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    return limit if type(limit) is int and limit > 0 else 0


# -- the server -----------------------------------------------------------------------------

class Prepared(TypedDict, total=False):
    """What `_prepare` learned of a valid request, for the reply builders and the accounting."""
    input_tokens: int
    cache: CacheLookup
    start: float              # time.monotonic() when the request was accepted
    texts: list[str]          # embeddings only: the texts to embed


def _check_anthropic_blocks(body: dict[str, Any]) -> None:
    """The Messages API refuses a text block that is empty or only whitespace."""
    lists: list[object] = [body.get("system")]
    lists += [m.get("content") for m in body.get("messages") or [] if isinstance(m, dict)]
    for blocks in lists:
        for block in blocks if isinstance(blocks, list) else []:
            if isinstance(block, dict) and block.get("type") == "text" and not str(block.get("text", "")).strip():
                raise _Reject(400, "messages: text content blocks must be non-empty" if not block.get("text")
                              else "messages: text content blocks must contain non-whitespace text")


def _embedding_texts(body: dict[str, Any]) -> list[str]:
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise _Reject(400, "'input' must be a string or a non-empty list of strings", param="input")
    return texts


def _prompt_parts(api: str, body: dict[str, Any]) -> list[str]:
    """The texts of a chat request the input tokens are counted on (the API's 400 when malformed)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _Reject(400, "'messages' must be a non-empty list", param="messages")
    parts = [_content_text(m.get("content")) for m in messages if isinstance(m, dict)]
    if api == "anthropic":
        if not isinstance(body.get("max_tokens"), int):
            raise _Reject(400, "max_tokens: Field required")
        if any(isinstance(m, dict) and m.get("role") == "system" for m in messages):
            raise _Reject(400, "messages: Unexpected role \"system\". The Messages API accepts a top-level "
                               "`system` parameter, not \"system\" as an input message role.")
        system = body.get("system")
        parts.append(system if isinstance(system, str) else _content_text(system))
    return parts


class LoopbackServer:
    """Async context manager: `async with LoopbackServer(rpm=600) as server:`."""

    def __init__(self, *, reply: ReplyFn | None = None, latency: LatencyFn | None = None,
                 rpm: float | None = None, input_tpm: float | None = None, output_tpm: float | None = None,
                 burst_seconds: float = 1.0, tpm: float | None = None, window: str = "bucket",
                 limit_headers: bool = True, faults: Faults | None = None, embed_dim: int = 64,
                 tokens: str | Callable[[str], int] = "cheap", context_tokens: int | None = None,
                 api_keys: Sequence[str] | None = None, finetune_polls: int = 2, finetune_min_examples: int = 10,
                 ttft: LatencyFn | None = None, token_delay: LatencyFn | None = None,
                 cache_min_tokens: int = 1024, cache_ttl: float = 300.0,
                 batch: BatchKnobs | None = None, models: Sequence[str] | None = None,
                 compat: str | None = None, in_process: bool = False,
                 host: str = "127.0.0.1", port: int = 0, ssl_context: ssl.SSLContext | None = None):
        if burst_seconds <= 0:
            raise ValueError("burst_seconds must be > 0")
        self.reply = reply or default_reply
        self.latency = latency
        self.ttft, self.token_delay = ttft, token_delay
        self.prompt_cache = PromptCache(cache_min_tokens, cache_ttl)
        self.limits = RateLimits(rpm, input_tpm, output_tpm, burst_seconds, tpm=tpm, window=window,
                                 headers=limit_headers)
        self.faults = faults or Faults()
        self.embed_dim = embed_dim
        self.count_tokens = _token_counter(tokens)
        self.context_tokens = context_tokens
        self.api_keys = frozenset(api_keys) if api_keys else None
        self.finetune_polls = finetune_polls
        self.finetune_min_examples = finetune_min_examples
        self.host, self.port = host, port
        self.in_process = in_process  # served without a socket to this process's clients (providers/transport.py)
        self._unmount: Callable[[], None] | None = None
        self.ssl_context = ssl_context  # serve HTTPS (the base URLs say https)
        self.stats = ServerStats()
        self.files: dict[str, StoredFile] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.batches = Batches(self, batch or BatchKnobs())
        self.catalog = ModelCatalog(models)  # unknown / retired ids and per-model parameter rules
        self.gemini = GeminiApi(self)  # the Gemini API's routes and knobs (engine/loopback/gemini.py)
        compat_api.check_flavour(compat)
        self.compat = compat  # a service's quirks on the OpenAI chat endpoint (engine/loopback/compat.py)
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._closing: asyncio.Event | None = None

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> LoopbackServer:
        app = web.Application(client_max_size=256 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        if self.compat == "azure":
            app.router.add_post(compat_api.AZURE_CHAT_PATH, self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/files", self._control(self._upload))
        app.router.add_post("/v1/fine_tuning/jobs", self._control(self._create_job))
        app.router.add_get("/v1/fine_tuning/jobs/{job_id}", self._control(self._get_job))
        app.router.add_get("/v1/files/{file_id}", self._control(self._get_file))
        app.router.add_get("/v1/files/{file_id}/content", self._control(self._file_content))
        self.batches.add_routes(app.router)
        app.router.add_get("/v1/models", self._list_models)
        self.gemini.add_routes(app.router)
        app.router.add_get("/loopback/stats", self._stats)
        # Cancel a handler when its client goes away (stalled calls end with the client).
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        if self.in_process:
            server = self._runner.server
            assert server is not None  # set up above
            base, self._unmount = transport.mount_on_loopback(server)
            _, self.host, self.port = transport.origin_of(base)
            self.ssl_context = None
        else:
            site = web.TCPSite(self._runner, self.host, self.port, backlog=1024, ssl_context=self.ssl_context)
            await site.start()
            self.port = self._runner.addresses[0][1]
        self._closing = asyncio.Event()
        return self

    async def close(self) -> None:
        if self._closing is not None:
            self._closing.set()
        if self._unmount is not None:
            self._unmount()
            self._unmount = None
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> LoopbackServer:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    @property
    def openai_base_url(self) -> str:
        return f"{self._scheme}://{self.host}:{self.port}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return f"{self._scheme}://{self.host}:{self.port}"

    @property
    def gemini_base_url(self) -> str:
        return f"{self._scheme}://{self.host}:{self.port}/gemini"

    @property
    def _scheme(self) -> str:
        return "http" if self.ssl_context is None else "https"

    def reset_stats(self) -> None:
        """Start counting afresh (e.g. after a benchmark's warm-up)."""
        self.stats = ServerStats()

    def _next_id(self) -> str:
        return f"{next(self._ids):012x}"

    # -- shared request flow ----------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "openai", self._openai_chat)

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "openai", self._openai_embeddings)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "anthropic", self._anthropic_messages)

    async def _serve(self, request: web.Request, api: str, build: Callable[..., Any]) -> web.StreamResponse:
        """Count, authenticate, inject faults, rate-limit, wait, reply."""
        stats = self.stats
        stats.requests += 1
        stats.by_path[request.path] += 1
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        status: int | str = "client_gone"  # cancelled: the client left (e.g. timed out on a stall)
        try:
            response = await self._respond(request, api, build)
            status = response.status
            return response
        except _Aborted as aborted:
            status = aborted.kind
            raise
        finally:
            stats.in_flight -= 1
            stats.by_status[status] += 1

    async def _respond(self, request: web.Request, api: str, build: Callable[..., Any]) -> web.StreamResponse:
        denied = self._check_auth(request, api)
        if denied is not None:
            return denied
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return self._reject(api, _Reject(400, "We could not parse the JSON body of your request."))
        if not isinstance(body, dict):
            return self._reject(api, _Reject(400, "The request body must be a JSON object."))
        streaming = body.get("stream") is True and request.path != "/v1/embeddings"
        fault = self.faults.pick() if request.path in _FAULTABLE or request.path == compat_api.AZURE_CHAT_PATH else None
        if fault is not None:
            self.stats.faults[fault] += 1
            refused = await self._fault_before_reply(api, fault, streaming)
            if refused is not None:
                return refused
        try:
            prepared = self._prepare(api, request.path, body, request.headers.get("anthropic-version"))
            limited = self._admit(api, prepared, _max_tokens(body))
            if limited is not None:
                return limited
            data, output_tokens = build(body, prepared, fault)
        except _Reject as reject:
            return self._reject(api, reject)
        if streaming and fault != "bad_json":
            return await self._stream(request, api, body, prepared, data, output_tokens, fault)
        return await self._plain_reply(request, api, prepared, data, output_tokens, fault)

    async def _fault_before_reply(self, api: str, fault: str, streaming: bool) -> web.Response | None:
        """The reply of a fault that replaces the answer (an error status), None for the others
        (a stall first waits, then lets the request go on)."""
        said = self.faults.should_retry
        headers = {} if said is None else {"x-should-retry": said}
        if fault == "429":
            return self._fault_429(api, headers)
        if fault.isdigit():
            if api == "openai":
                return openai_error(int(fault), _FAULT_MESSAGES.get(fault, "The server had an error."), headers=headers)
            return anthropic_error(int(fault), _FAULT_MESSAGES.get(fault, "The server had an error."), headers)
        if fault == "stall":
            await self._stall()
        elif fault == "stream_error" and not streaming:  # unstreamed: the plain error
            if api == "openai":
                return openai_error(500, _FAULT_MESSAGES["500"], headers=headers)
            return anthropic_error(529, _FAULT_MESSAGES["529"], headers)
        elif fault == "content_filter" and api == "openai":
            return openai_error(400, "Your request was rejected as a result of our safety system.",
                                code="content_policy_violation", param="messages", headers=headers)
        return None

    def _fault_429(self, api: str, headers: dict[str, str]) -> web.Response:
        """A 429 naming its wait as each API does (OpenAI: only in its message)."""
        wait = self.faults.try_again
        if api == "openai":
            return openai_error(429, f"Rate limit reached for gpt-4o in organization org-loopback on tokens per "
                                     f"min (TPM): Limit 30000, Used 29937, Requested 385. Please try again in "
                                     f"{go_duration(wait)}. Visit https://platform.openai.com/account/rate-limits "
                                     f"to learn more.", type="tokens", code="rate_limit_exceeded", headers=headers)
        headers["retry-after"] = str(max(1, math.ceil(wait)))
        return anthropic_error(429, "This request would exceed your organization's rate limit. Please retry "
                                    "after the retry-after header's delay.", headers)

    def _admit(self, api: str, prepared: Prepared, max_tokens: int = 0) -> web.Response | None:
        """Count the request against the rate limits: a 429 when over them, else None."""
        now = time.monotonic()
        if self.limits.active:
            # Anthropic's input-token limit does not count cache reads.
            charged = prepared["input_tokens"] - (prepared["cache"].read if api == "anthropic" else 0)
            wait, which = self.limits.admit(charged, now, max_tokens)
            if wait > 0:
                self.stats.rate_limited += 1
                return self._too_many(api, wait, which, now)
        self.stats.accepted_times.append(now)
        return None

    async def _plain_reply(self, request: web.Request, api: str, prepared: Prepared, data: object,
                           output_tokens: int, fault: str | None) -> web.StreamResponse:
        """An unstreamed reply, after the configured delay, damaged as the fault asks."""
        delay = self._reply_delay(output_tokens)
        if delay > 0:
            await asyncio.sleep(delay)
        headers = self._finish(api, prepared, output_tokens)
        if fault == "truncate":
            return await self._truncated(request, orjson.dumps(data), headers)
        if fault == "reset":
            self._reset(request)
        if fault == "bad_json":
            return web.Response(body=b"<html>502 Bad Gateway</html>", headers=headers, content_type="text/html")
        return _json(data, 200, headers)

    def _reply_delay(self, output_tokens: int) -> float:
        """A whole reply's latency: `latency`, else time to first token plus
        the gaps between tokens (the same generation a stream would show)."""
        if self.latency is not None:
            return self.latency()
        delay = self.ttft() if self.ttft is not None else 0.0
        if self.token_delay is not None:
            delay += sum(self.token_delay() for _ in range(output_tokens - 1))
        return delay

    def _finish(self, api: str, prepared: Prepared, output_tokens: int) -> dict[str, str]:
        """Account a served reply (limits, stats, prompt cache); its headers."""
        now = time.monotonic()
        self.limits.charge_output(output_tokens, now)
        self._account(prepared, output_tokens)
        return self._reply_headers(api, prepared, now)

    def _reply_headers(self, api: str, prepared: Prepared, now: float) -> dict[str, str]:
        headers = self._limit_headers(api, now)
        headers["x-request-id" if api == "openai" else "request-id"] = f"req_{self._next_id()}"
        if api == "openai":
            headers["openai-processing-ms"] = str(int((now - prepared["start"]) * 1000))
        return headers

    def _account(self, prepared: Prepared, output_tokens: int, batch: bool = False) -> None:
        cache = prepared["cache"]
        self.prompt_cache.commit(cache)
        stats = self.stats
        stats.cache_read_tokens += cache.read
        stats.cache_write_tokens += cache.write
        if batch:
            stats.batch_input_tokens += prepared["input_tokens"]
            stats.batch_output_tokens += output_tokens
        else:
            stats.input_tokens += prepared["input_tokens"]
            stats.output_tokens += output_tokens

    async def _stream(self, request: web.Request, api: str, body: dict[str, Any], prepared: Prepared, data: dict[str, Any],
                      output_tokens: int, fault: str | None) -> web.StreamResponse:
        """Send the reply as server-sent events (loopback_stream)."""
        if api == "openai":
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            frames = openai_frames(data, include_usage)
        else:
            frames = anthropic_frames(data)
        headers = self._reply_headers(api, prepared, time.monotonic())
        self.stats.streams += 1
        cut = fault if fault in ("reset", "truncate", "stream_error") else None
        progress, finished = Progress(), False
        try:
            response = await write_stream(request, headers, frames, self.ttft or self.latency, self.token_delay,
                                          cut, progress, api)
            finished = cut != "stream_error"
            return response
        except ConnectionResetError:
            if cut:
                raise _Aborted(cut) from None
            self.stats.streams_cancelled += 1
            raise _Aborted("client_gone") from None
        except asyncio.CancelledError:  # the client left while we waited (handler cancellation)
            self.stats.streams_cancelled += 1
            raise
        finally:
            # What was generated is charged; the cache is written only by a finished reply.
            charged = output_tokens if finished else min(progress.sent, output_tokens)
            self.limits.charge_output(charged, time.monotonic())
            if finished:
                self._account(prepared, charged)
            else:
                self.stats.input_tokens += prepared["input_tokens"]
                self.stats.output_tokens += charged

    def _limit_headers(self, api: str, now: float) -> dict[str, str]:
        if not self.limits.active:
            return {}
        return self.limits.openai_headers(now) if api == "openai" else self.limits.anthropic_headers(now)

    def _reject(self, api: str, reject: _Reject) -> web.Response:
        return error_response(api, reject.status, reject.message, reject.code, reject.param)

    def _too_many(self, api: str, wait: float, which: str, now: float) -> web.Response:
        headers = self._limit_headers(api, now)
        headers["retry-after"] = str(max(1, math.ceil(wait)))
        headers["retry-after-ms"] = str(int(math.ceil(wait * 1000)))
        if api == "openai":
            return openai_error(429, f"Rate limit reached for {which} per min. Please try again in "
                                     f"{go_duration(wait)}.", type="requests" if which == "requests" else "tokens", code="rate_limit_exceeded",
                                headers=headers)
        return anthropic_error(429, f"This request would exceed your organization's rate limit of "
                                    f"{which} per minute. Please retry after the retry-after header's delay.",
                               headers=headers)

    def _check_auth(self, request: web.Request, api: str) -> web.Response | None:
        if self.api_keys is None:
            return None
        authorization = request.headers.get("Authorization", "")
        presented = request.headers.get("x-api-key") if api == "anthropic" else None
        presented = presented or compat_api.presented_key(self.compat, request.headers)
        if presented in self.api_keys:
            return None
        # Echo the key in full (real APIs mask it) so tests prove clients scrub it.
        if api == "openai":
            return openai_error(401, f"Incorrect API key provided: {presented}. Header was "
                                     f"'Authorization: {authorization}'.", code="invalid_api_key")
        return anthropic_error(401, f"invalid x-api-key: {presented}")

    async def _stall(self) -> None:
        assert self._closing is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.faults.stall_seconds):
                await self._closing.wait()

    @staticmethod
    def _reset(request: web.Request) -> None:
        """Abort the connection with a TCP RST instead of replying."""
        transport = request.transport
        if transport is not None:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            transport.abort()
        raise _Aborted("reset")

    @staticmethod
    async def _truncated(request: web.Request, body: bytes, headers: Mapping[str, str]) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers=headers)
        response.content_type = "application/json"
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[: len(body) // 2])
        if request.transport is not None:
            request.transport.close()
        raise _Aborted("truncate")

    async def _list_models(self, request: web.Request) -> web.Response:
        """GET /v1/models in the shape of the API the headers name (Anthropic's
        carries anthropic-version)."""
        api = "anthropic" if "anthropic-version" in request.headers else "openai"
        denied = self._check_auth(request, api)
        if denied is not None:
            return denied
        return _json(self.catalog.listing(api), 200)

    # -- request parsing ------------------------------------------------------------------
    def _prepare(self, api: str, path: str, body: dict[str, Any], version: str | None = None) -> Prepared:
        """Validate the body (`version`: the anthropic-version header); count input tokens; apply the context limit."""
        if not isinstance(body.get("model"), str) or not body["model"]:
            raise _Reject(400, "you must provide a model parameter", param="model")
        self.catalog.check(api, path, body, version)
        if body.get("stream_options") is not None and body.get("stream") is not True and api == "openai":
            raise _Reject(400, "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                          param="stream_options")
        start = time.monotonic()
        if path == "/v1/embeddings":
            texts = _embedding_texts(body)
            return {"texts": texts, "input_tokens": sum(self.count_tokens(t) for t in texts), "cache": NO_CACHE,
                    "start": start}
        if api == "anthropic":
            _check_anthropic_blocks(body)
        input_tokens = sum(self.count_tokens(p) for p in _prompt_parts(api, body) if p)
        self._check_context(api, input_tokens)
        try:
            cache = (self.prompt_cache.anthropic(body, self.count_tokens) if api == "anthropic"
                     else self.prompt_cache.openai(body, self.count_tokens, input_tokens))
        except CacheError as exc:
            raise _Reject(400, str(exc)) from None
        return {"input_tokens": input_tokens, "cache": cache, "start": start}

    def _check_context(self, api: str, input_tokens: int) -> None:
        if self.context_tokens is not None and input_tokens > self.context_tokens:
            if api == "openai":
                raise _Reject(400, f"This model's maximum context length is {self.context_tokens} tokens. "
                                   f"However, your messages resulted in {input_tokens} tokens. Please reduce the "
                                   f"length of the messages.", code="context_length_exceeded", param="messages")
            raise _Reject(400, f"prompt is too long: {input_tokens} tokens > {self.context_tokens} maximum")

    def _generate(self, api: str, body: dict[str, Any], max_tokens: int | None, stops: Sequence[str]
                  ) -> tuple[str, str, str | None, int]:
        """(text, finish, matched stop sequence, output tokens) under max_tokens/stop."""
        produced = self.reply(api, body)
        text, finish = (produced, "stop") if isinstance(produced, str) else produced
        matched = None
        for stop in stops:
            cut = text.find(stop)
            if cut >= 0:
                text, finish, matched = text[:cut], "stop", stop
                break
        tokens = self.count_tokens(text)
        if max_tokens is not None and tokens > max_tokens:
            finish, matched = "length", None
            while tokens > max_tokens:  # cut in proportion until it fits (one pass for "cheap")
                text = text[: len(text) * max_tokens // tokens]
                tokens = self.count_tokens(text)
        return text, finish, matched, tokens

    # -- OpenAI ---------------------------------------------------------------------------
    def _openai_chat(self, body: dict[str, Any], prepared: Prepared, fault: str | None) -> tuple[dict[str, Any], int]:
        stop = body.get("stop") or []
        stops = [stop] if isinstance(stop, str) else list(stop)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        try:
            compat_api.check_chat(self.compat, body)
        except compat_api.CompatError as exc:
            raise _Reject(400, str(exc)) from None
        text, finish, _, output_tokens = self._generate("openai", body, limit, stops)
        ident = self._next_id()
        data = {
            "id": f"chatcmpl-{ident}", "object": "chat.completion", "created": int(time.time()),
            "model": body["model"], "system_fingerprint": "fp_loopback", "service_tier": "default",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None,
                                                 "annotations": []},
                         "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": prepared["input_tokens"], "completion_tokens": output_tokens,
                      "total_tokens": prepared["input_tokens"] + output_tokens,
                      "prompt_tokens_details": {"cached_tokens": prepared["cache"].read, "audio_tokens": 0},
                      "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                                    "accepted_prediction_tokens": 0,
                                                    "rejected_prediction_tokens": 0}},
        }
        return data, compat_api.decorate(self.compat, body, data, output_tokens, self.count_tokens)

    def _openai_embeddings(self, body: dict[str, Any], prepared: Prepared, fault: str | None) -> tuple[dict[str, Any], int]:
        dim = body.get("dimensions") or self.embed_dim
        if not isinstance(dim, int) or dim < 1:
            raise _Reject(400, "'dimensions' must be a positive integer", param="dimensions")
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(prepared["texts"]):
            vector = hashed_embedding(text, dim)
            if as_base64:  # what the openai SDK asks for by default: little-endian float32
                packed = array("f", vector)
                if sys.byteorder != "little":
                    packed.byteswap()
                embedding: str | list[float] = base64.b64encode(packed.tobytes()).decode()
            else:
                embedding = vector
            data.append({"object": "embedding", "index": index, "embedding": embedding})
        usage = {"prompt_tokens": prepared["input_tokens"], "total_tokens": prepared["input_tokens"]}
        return {"object": "list", "data": data, "model": body["model"], "usage": usage}, 0

    # -- Anthropic ------------------------------------------------------------------------
    def _anthropic_messages(self, body: dict[str, Any], prepared: Prepared, fault: str | None) -> tuple[dict[str, Any], int]:
        stops = list(body.get("stop_sequences") or [])
        text, finish, matched, output_tokens = self._generate("anthropic", body, body["max_tokens"], stops)
        if fault == "content_filter":
            finish = "refusal"
        stop_reason = {"stop": "stop_sequence" if matched else "end_turn", "length": "max_tokens",
                       "content_filter": "refusal"}.get(finish, finish)
        cache = prepared["cache"]  # input_tokens counts only what is neither read from nor written to it
        data = {
            "id": f"msg_{self._next_id()}", "type": "message", "role": "assistant", "model": body["model"],
            "content": [{"type": "text", "text": text}], "stop_reason": stop_reason, "stop_sequence": matched,
            "usage": {"input_tokens": prepared["input_tokens"] - cache.read - cache.write,
                      "output_tokens": output_tokens, "cache_creation_input_tokens": cache.write,
                      "cache_read_input_tokens": cache.read,
                      "cache_creation": {"ephemeral_5m_input_tokens": cache.write - cache.write_1h,
                                         "ephemeral_1h_input_tokens": cache.write_1h},
                      "service_tier": "standard"},
        }
        return data, output_tokens

    # -- files and fine-tuning (OpenAI) ---------------------------------------------------------
    def _control(self, handler: Handler, api: str = "openai") -> Handler:
        """Count, authenticate and serve a control-plane call (no limits, no faults)."""
        async def serve(request: web.Request) -> web.Response:
            route = request.match_info.route.resource
            path = route.canonical if route is not None else request.path  # one entry per job route
            self.stats.requests += 1
            self.stats.by_path[path] += 1
            response = self._check_auth(request, api)
            if response is None:  # (not `or`: a response is an empty mapping, hence falsy)
                response = await handler(request)
            self.stats.by_status[response.status] += 1
            return response
        return serve

    async def _stats(self, request: web.Request) -> web.Response:
        """Counters as JSON, for benchmarks running the server in another process."""
        return _json(self.stats.to_dict())

    async def _upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, web.FileField) or not isinstance(purpose, str):
            return openai_error(400, "multipart fields 'file' and 'purpose' are required", param="file")
        content = upload.file.read()
        file_id = f"file-{self._next_id()}"
        self.files[file_id] = {"content": content, "filename": upload.filename, "purpose": purpose,
                               "created_at": int(time.time())}
        return _json(self._file_object(file_id))

    def _file_object(self, file_id: str) -> dict[str, object]:
        entry = self.files[file_id]
        return {"id": file_id, "object": "file", "bytes": len(entry["content"]), "created_at": entry["created_at"],
                "filename": entry["filename"], "purpose": entry["purpose"], "status": "processed",
                "status_details": None}

    async def _get_file(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        if file_id not in self.files:
            return openai_error(404, f"No such File object: {file_id}", param="id")
        return _json(self._file_object(file_id))

    async def _file_content(self, request: web.Request) -> web.Response:
        file_id = request.match_info["file_id"]
        if file_id not in self.files:
            return openai_error(404, f"No such File object: {file_id}", param="id")
        offered = JSONL_TYPES if self.files[file_id]["filename"].endswith(".jsonl") else ("application/octet-stream",)
        return file_reply(request, "openai", self.files[file_id]["content"], offered)

    # -- batches (loopback_batches) ------------------------------------------------------------
    def batch_line(self, api: str, path: str, body: object) -> tuple[int, dict[str, Any]]:
        """(status, body) of one batch request, built exactly as the direct
        endpoint would (same text and usage; no limits, faults or latency)."""
        builders = {"/v1/chat/completions": self._openai_chat, "/v1/embeddings": self._openai_embeddings,
                    "/v1/messages": self._anthropic_messages}
        try:
            if not isinstance(body, dict):
                raise _Reject(400, "The request body must be a JSON object.")
            if body.get("stream"):
                raise _Reject(400, "stream: batch requests cannot be streamed", param="stream")
            prepared = self._prepare(api, path, body)
            data, output_tokens = builders[path](body, prepared, None)
        except _Reject as reject:
            return reject.status, self.error_body(api, reject.status, reject.message, reject.code, reject.param)
        if api == "anthropic":
            data["usage"]["service_tier"] = "batch"
        self._account(prepared, output_tokens, batch=True)
        return 200, data

    @staticmethod
    def error_body(api: str, status: int, message: str, code: str | None = None, param: str | None = None) -> JSONObject:
        """An error in the API's shape, as a JSON object (the body of its error reply)."""
        return api_error_body(api, status, message, code, param)

    async def _create_job(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return openai_error(400, "'model' and 'training_file' are required", param="model")
        training_file = body.get("training_file")
        if training_file not in self.files:
            return openai_error(400, f"invalid training_file: {training_file}", param="training_file",
                                code="invalid_training_file")
        job_id = f"ftjob-{self._next_id()}"
        method = body.get("method")
        if not isinstance(method, dict):
            method = {}
        hyperparameters = {"n_epochs": "auto", "batch_size": "auto", "learning_rate_multiplier": "auto",
                           **((method.get("supervised") or {}).get("hyperparameters") or {})}
        suffix = body.get("suffix")
        job = {
            "object": "fine_tuning.job", "id": job_id, "model": body["model"], "created_at": int(time.time()),
            "finished_at": None, "fine_tuned_model": None, "organization_id": "org-tulving",
            "result_files": [], "status": "queued", "validation_file": body.get("validation_file"),
            "training_file": training_file, "hyperparameters": hyperparameters,
            "trained_tokens": None, "error": None, "seed": body.get("seed") or 42, "user_provided_suffix": suffix,
            "estimated_finish": None, "integrations": [], "metadata": body.get("metadata"),
            "method": {"type": "supervised", "supervised": {"hyperparameters": hyperparameters}},
        }
        self.jobs[job_id] = {"job": job, "polls": 0, "problem": self._training_problem(training_file)}
        return _json(job)

    def _training_problem(self, file_id: str) -> str | None:
        """Why the training file would fail validation, as OpenAI words it."""
        lines = [line for line in self.files[file_id]["content"].splitlines() if line.strip()]
        for number, line in enumerate(lines, 1):
            try:
                example = orjson.loads(line)
            except orjson.JSONDecodeError:
                return f"Invalid file format. Line {number} is not valid JSON."
            if not isinstance(example, dict) or not isinstance(example.get("messages"), list):
                return f"Invalid file format. Line {number}, key \"messages\": missing or not a list."
        if len(lines) < self.finetune_min_examples:
            return (f"Training file has {len(lines)} example(s), but must have at least "
                    f"{self.finetune_min_examples} examples")
        return None

    async def _get_job(self, request: web.Request) -> web.Response:
        entry = self.jobs.get(request.match_info["job_id"])
        if entry is None:
            return openai_error(404, f"Could not find fine tune: {request.match_info['job_id']}",
                                code="fine_tune_not_found", param="id")
        entry["polls"] += 1
        job = entry["job"]
        if job["status"] in ("queued", "running") and entry["polls"] >= self.finetune_polls:
            job["finished_at"] = int(time.time())
            if entry["problem"]:
                job["status"] = "failed"
                job["error"] = {"code": "invalid_training_file", "message": entry["problem"],
                                "param": "training_file"}
            else:
                job["status"] = "succeeded"
                job["fine_tuned_model"] = f"ft:{job['model']}:tulving:{job['user_provided_suffix'] or ''}:{job['id']}"
                job["trained_tokens"] = cheap_tokens(self.files[job["training_file"]]["content"].decode("utf-8",
                                                                                                        "replace"))
        elif job["status"] == "queued":
            job["status"] = "running"
        return _json(job)


class _Aborted(web.HTTPInternalServerError):
    """The handler dropped the connection on purpose (reset / truncate).
    An HTTPException, so aiohttp finds the transport closed and moves on
    without logging an error."""

    def __init__(self, kind: str):
        super().__init__(reason=kind)
        self.kind = kind


_FAULT_MESSAGES = {
    "500": "The server had an error while processing your request. Sorry about that!",
    "502": "Bad gateway.",
    "503": "The engine is currently overloaded, please try again later.",
    "504": "Gateway timeout.",
    "529": "Overloaded",
}
