"""Tulving's OpenAI-compatible endpoint on loopback, for the length of a run:
a memory system's own model calls (extraction, embeddings) go through it, and
so through the run's engine -- rate-limited, cached (a rerun re-ingests for
nothing), priced, capped by --max-cost and counted per phase.

    endpoint = ModelEndpoint(engine)                 # the run's Engine (and its config)
    await endpoint.start()                           # 127.0.0.1, a port the OS picks
    secret = endpoint.grant(meter, ["gpt-4o-mini", "local:minilm"])
    ... the memory system calls endpoint.base_url ("http://127.0.0.1:PORT/v1") with
        `Authorization: Bearer <secret>` (OPENAI_BASE_URL / OPENAI_API_KEY) ...
    endpoint.revoke(secret); await endpoint.close()  # with the run

Served: POST /v1/chat/completions (also `"stream": true`, answered as
server-sent events once the whole reply is in), POST /v1/embeddings (float or
base64, the openai SDK's default), GET /v1/models and /v1/models/{id} (the
aliases the secret was granted). The `model` of a call is a Tulving model
alias from the run's config.

Security (it spends the user's money): it listens on 127.0.0.1 only; every
request needs a secret made by `grant` for one memory system (compared in
constant time: only the secret's SHA-256 is kept, and looked up); a secret
reaches only the aliases granted with it (any other model: 404
`model_not_found`); `revoke` and `close` end it. The secret is never logged
nor echoed in an error.

Every call is counted in the grant's PhaseMeter (`meter.add(alias,
outcome)`), in the phase the meter is in, so concurrent memory systems are
counted apart. Errors are OpenAI's shape `{"error": {"message", "type",
"param", "code"}}` and carry `x-should-retry: false` (the engine already
retried what can be retried; the openai SDK honours the header).

Wire shapes checked 2026-11-28 against the openai SDK 3.57's types
(ChatCompletion, ChatCompletionChunk, CreateEmbeddingResponse, Model,
CompletionUsage) and its embeddings call (base64 float32 unless
`encoding_format` is given: openai/lib/_parsing/_embeddings.py).
Not served: tools and function calling, `n` other than 1, logprobs, token
arrays as embedding input, images and audio in messages (400 each, naming
the parameter).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import overload

import numpy as np
import orjson
from aiohttp import web

from engine.benchmark.memory.meter import PhaseMeter
from engine.config import Config, ModelAlias
from engine.loopback.errors import openai_error
from engine.loopback.stream import openai_frames, write_stream
from engine.requests import ChatRequest, EmbedRequest, Outcome, Request
from engine.scheduler import Engine
from providers.base import ChatResult, EmbedResult, ErrorKind, ProviderError, TulvingError

HOST = "127.0.0.1"
NO_RETRY = {"x-should-retry": "false"}
JSON = dict[str, object]

# Wire parameters handed to the model as they are (ChatRequest.extra); the
# ones named in _chat_request are read into ChatRequest's own fields.
PASSED_THROUGH = ("top_p", "presence_penalty", "frequency_penalty", "response_format", "reasoning_effort",
                  "logit_bias", "verbosity")
# Accepted and not sent: they change nothing in the reply.
IGNORED = frozenset({"model", "messages", "stream", "stream_options", "user", "store", "metadata", "service_tier",
                     "safety_identifier", "prompt_cache_key", "n", "temperature", "max_tokens",
                     "max_completion_tokens", "stop", "seed", "tools", "tool_choice", "parallel_tool_calls",
                     "functions", "function_call", "logprobs", "top_logprobs", *PASSED_THROUGH})
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})
# How a call the engine could not make is told to the client: (status, type, code).
ERROR_REPLIES: dict[ErrorKind, tuple[int, str, str | None]] = {
    ErrorKind.BAD_REQUEST: (400, "invalid_request_error", None),
    ErrorKind.CONFIG: (400, "invalid_request_error", None),
    ErrorKind.PROMPT_TOO_LONG: (400, "invalid_request_error", "context_length_exceeded"),
    ErrorKind.CONTENT_FILTER: (400, "invalid_request_error", "content_filter"),
    ErrorKind.BUDGET: (429, "insufficient_quota", "insufficient_quota"),
    ErrorKind.RATE_LIMITED: (429, "requests", "rate_limit_exceeded"),
    ErrorKind.TIMEOUT: (504, "server_error", "timeout"),
}


class Refused(Exception):
    """A request the endpoint refuses: sent back in OpenAI's error shape."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def reply(self) -> web.Response:
        return openai_error(self.status, self.message, type=self.type, code=self.code, param=self.param,
                            headers=NO_RETRY)


@dataclass(slots=True)
class Grant:
    """What one secret opens: the aliases a memory system may call, and the
    meter its calls are counted in."""

    digest: bytes
    meter: PhaseMeter
    aliases: dict[str, ModelAlias]


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


class ModelEndpoint:
    """The OpenAI-compatible endpoint of a run (see the module docstring)."""

    def __init__(self, engine: Engine, config: Config | None = None):
        self.engine = engine
        self.config = config or engine.config
        self.port = 0
        self._grants: dict[bytes, Grant] = {}
        self._runner: web.AppRunner | None = None
        self._ids = itertools.count(1)

    # -- life -----------------------------------------------------------------------------
    async def start(self) -> ModelEndpoint:
        app = web.Application(client_max_size=256 * 1024 * 1024)  # a book-sized prompt fits
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/v1/models/{model:.+}", self._model)
        # A client that goes away (its own timeout) does not cancel the engine call: the
        # reply is paid for by then, and cached, so the client's retry costs nothing.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, HOST, 0, backlog=1024)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def close(self) -> None:
        """Revoke every secret and stop listening."""
        self._grants.clear()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> ModelEndpoint:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}/v1"

    def grant(self, meter: PhaseMeter, models: Sequence[str]) -> str:
        """A fresh secret for one memory system: it may call `models` (aliases
        of the config; ConfigError for an unknown one), counted in `meter`."""
        aliases = {name: self.config.alias(name) for name in models}
        secret = secrets.token_urlsafe(32)
        digest = _digest(secret)
        self._grants[digest] = Grant(digest, meter, aliases)
        return secret

    def revoke(self, secret: str) -> None:
        self._grants.pop(_digest(secret), None)

    # -- handlers -------------------------------------------------------------------------
    def _grant_of(self, request: web.Request) -> Grant:
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        digest = _digest(presented.strip())
        grant = self._grants.get(digest)
        if scheme.lower() != "bearer" or grant is None or not hmac.compare_digest(grant.digest, digest):
            raise Refused(401, "Incorrect API key provided: use the key Tulving handed this memory system "
                               "(its OPENAI_API_KEY) for this run.", code="invalid_api_key")
        return grant

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        try:
            grant = self._grant_of(request)
            body = await _json_body(request)
            alias = _granted(grant, body)
            call = chat_request(alias.name, body)
            result = await self._call(grant, alias, call)
        except Refused as refused:
            return refused.reply()
        reply = completion(f"chatcmpl-{next(self._ids):012x}", alias.name, result)
        if body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            return await write_stream(request, {}, openai_frames(reply, include_usage), None, None)
        return web.Response(body=orjson.dumps(reply), content_type="application/json")

    async def _embeddings(self, request: web.Request) -> web.Response:
        try:
            grant = self._grant_of(request)
            body = await _json_body(request)
            alias = _granted(grant, body)
            texts, as_base64 = embed_inputs(body)
            result = await self._call(grant, alias, EmbedRequest(alias.name, texts))
            reply = embeddings_reply(alias.name, result, as_base64, body.get("dimensions"))
        except Refused as refused:
            return refused.reply()
        return web.Response(body=orjson.dumps(reply), content_type="application/json")

    async def _models(self, request: web.Request) -> web.Response:
        try:
            grant = self._grant_of(request)
        except Refused as refused:
            return refused.reply()
        listing = {"object": "list", "data": [_model_object(name) for name in grant.aliases]}
        return web.Response(body=orjson.dumps(listing), content_type="application/json")

    async def _model(self, request: web.Request) -> web.Response:
        try:
            grant = self._grant_of(request)
            name = request.match_info["model"]
            if name not in grant.aliases:
                raise _not_found(name)
        except Refused as refused:
            return refused.reply()
        return web.Response(body=orjson.dumps(_model_object(name)), content_type="application/json")

    @overload
    async def _call(self, grant: Grant, alias: ModelAlias, call: ChatRequest) -> ChatResult: ...
    @overload
    async def _call(self, grant: Grant, alias: ModelAlias, call: EmbedRequest) -> EmbedResult: ...

    async def _call(self, grant: Grant, alias: ModelAlias, call: Request) -> ChatResult | EmbedResult:
        """One call through the engine, counted in the grant's meter."""
        try:
            outcome: Outcome = (await self.engine.run([call], label=f"memory {grant.meter.system}"))[0]
        except TulvingError as exc:  # the config cannot make the call (an endpoint's key is unset)
            raise Refused(500, str(exc), type="server_error") from None
        grant.meter.add(alias, outcome)
        if outcome.result is None:
            raise _failed(alias.name, outcome.error)
        return outcome.result


# -- requests -------------------------------------------------------------------------------
async def _json_body(request: web.Request) -> JSON:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        raise Refused(400, "We could not parse the JSON body of your request. (HINT: This likely means you "
                           "aren't using your HTTP library correctly.)") from None
    if not isinstance(body, dict):
        raise Refused(400, "The body of your request must be a JSON object.")
    return body


def _not_found(model: object) -> Refused:
    return Refused(404, f"The model `{model}` does not exist or you do not have access to it.",
                   code="model_not_found", param="model")


def _granted(grant: Grant, body: Mapping[str, object]) -> ModelAlias:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise Refused(400, "you must provide a model parameter", param="model")
    alias = grant.aliases.get(model)
    if alias is None:
        raise _not_found(model)
    return alias


def _refuse_unsupported(body: Mapping[str, object]) -> None:
    """400 for what the endpoint cannot honour (rather than ignoring it)."""
    unknown = sorted(set(body) - IGNORED)
    if unknown:
        raise Refused(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    if body.get("n") not in (None, 1):
        raise Refused(400, "Tulving's endpoint returns one choice per call: 'n' must be 1 (make several "
                           "calls, each with its own prompt, instead).", param="n")
    for name in ("tools", "functions"):
        if body.get(name):
            raise Refused(400, f"Tulving's endpoint does not serve tool or function calling ('{name}'): ask "
                               f"for JSON with response_format instead.", param=name)
    if body.get("tool_choice") not in (None, "none") or body.get("function_call") not in (None, "none"):
        raise Refused(400, "'tool_choice' is only allowed when 'tools' are specified.", param="tool_choice")
    if body.get("logprobs") or body.get("top_logprobs") is not None:
        raise Refused(400, "Tulving's endpoint does not return logprobs.", param="logprobs")
    if body.get("stream") not in (None, True, False):
        raise Refused(400, "'stream' must be a boolean.", param="stream")


def _integer(body: Mapping[str, object], name: str, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise Refused(400, f"Invalid '{name}': expected an integer >= {low:g}, got {value!r}.", param=name)
    return value


def _number(body: Mapping[str, object], name: str, low: float) -> int | float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
        raise Refused(400, f"Invalid '{name}': expected a number >= {low:g}, got {value!r}.", param=name)
    return value


def _stop(body: Mapping[str, object]) -> tuple[str, ...] | None:
    stop = body.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return tuple(stop) or None
    raise Refused(400, "Invalid 'stop': expected a string or a list of strings.", param="stop")


def _content(content: object, index: int) -> str:
    """A message's text: a string, or text parts joined (anything else is refused)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part["text"] for part in content
                 if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)]
        if len(texts) == len(content):  # every part a text part
            return "\n".join(texts)
    raise Refused(400, f"Invalid 'messages[{index}].content': Tulving's endpoint takes text only (a string or "
                       f"a list of text parts).", param=f"messages[{index}].content")


def chat_messages(body: Mapping[str, object]) -> tuple[dict[str, str], ...]:
    """The messages as the engine takes them ({role, content} strings)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Refused(400, "'messages' must be a non-empty list of messages.", param="messages")
    out = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ROLES:
            raise Refused(400, f"Invalid 'messages[{index}].role': {role!r} (Tulving's endpoint takes system, "
                               f"developer, user and assistant messages; no tool messages).",
                          param=f"messages[{index}].role")
        if message.get("tool_calls") or message.get("function_call"):
            raise Refused(400, f"Invalid 'messages[{index}]': tool calls are not served.",
                          param=f"messages[{index}]")
        out.append({"role": ROLES[role], "content": _content(message.get("content"), index)})
    return tuple(out)


def chat_request(name: str, body: Mapping[str, object]) -> ChatRequest:
    """The engine's request for one chat completion body (Refused when it asks
    for what the endpoint does not serve)."""
    _refuse_unsupported(body)
    limit = _integer(body, "max_completion_tokens", 1)
    if limit is None:
        limit = _integer(body, "max_tokens", 1)
    response_format = body.get("response_format")
    if response_format is not None and not (isinstance(response_format, dict) and response_format.get("type") in
                                            ("text", "json_object", "json_schema")):
        raise Refused(400, "Invalid 'response_format': expected {'type': 'text' | 'json_object' | 'json_schema'}.",
                      param="response_format")
    extra = {key: body[key] for key in PASSED_THROUGH if body.get(key) is not None}
    return ChatRequest(model=name, messages=chat_messages(body), temperature=_number(body, "temperature", 0),
                       max_tokens=limit, seed=_integer(body, "seed", -2**63),
                       stop=_stop(body), extra=extra or None)


def embed_inputs(body: Mapping[str, object]) -> tuple[list[str], bool]:
    """(texts, whether vectors go back as base64)."""
    unknown = sorted(set(body) - {"model", "input", "encoding_format", "dimensions", "user"})
    if unknown:
        raise Refused(400, f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    given = body.get("input")
    items = [given] if isinstance(given, str) else given if isinstance(given, list) else []
    texts = [t for t in items if isinstance(t, str)]
    if not texts or len(texts) != len(items):
        raise Refused(400, "'input' must be a string or a non-empty list of strings (Tulving's endpoint takes "
                           "no token arrays).", param="input")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64", None):
        raise Refused(400, f"Invalid 'encoding_format': {encoding!r} (expected 'float' or 'base64').",
                      param="encoding_format")
    return texts, encoding == "base64"


# -- replies --------------------------------------------------------------------------------
def _failed(name: str, error: ProviderError | None) -> Refused:
    kind = error.kind if error is not None else ErrorKind.BAD_REPLY
    message = error.message if error is not None else "no reply"
    status, type_, code = ERROR_REPLIES.get(kind, (502, "server_error", kind.value))
    return Refused(status, f"{name}: {message}", type=type_, code=code)


def completion(ident: str, name: str, result: ChatResult) -> JSON:
    """The chat.completion object of one reply."""
    finish = result.finish_reason if result.finish_reason in FINISH_REASONS else (
        "length" if result.finish_reason == "max_tokens" else "stop")
    usage: JSON = {"prompt_tokens": result.input_tokens, "completion_tokens": result.output_tokens,
             "total_tokens": result.input_tokens + result.output_tokens,
             "prompt_tokens_details": {"cached_tokens": result.cache_read_tokens}}
    message: JSON = {"role": "assistant", "content": result.text, "refusal": None, "annotations": []}
    return {"id": ident, "object": "chat.completion", "created": int(time.time()), "model": name,
            "system_fingerprint": None, "service_tier": "default",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": usage}


def embeddings_reply(name: str, result: EmbedResult, as_base64: bool, dimensions: object) -> JSON:
    """The embeddings list object; base64 is little-endian float32, as the API sends it."""
    width = len(result.vectors[0]) if result.vectors else 0
    if dimensions is not None and dimensions != width:
        raise Refused(400, f"{name} returns {width}-dimensional vectors: 'dimensions' {dimensions!r} cannot be "
                           f"served (leave it out, or set it to {width}).", param="dimensions")
    rows: Sequence[object] = result.vectors
    if as_base64:
        packed = np.asarray(result.vectors, dtype="<f4")
        rows = [base64.b64encode(row.tobytes()).decode() for row in packed]
    data: list[JSON] = [{"object": "embedding", "index": index, "embedding": row} for index, row in enumerate(rows)]
    usage = {"prompt_tokens": result.input_tokens, "total_tokens": result.input_tokens}
    return {"object": "list", "data": data, "model": name, "usage": usage}


def _model_object(name: str) -> JSON:
    return {"id": name, "object": "model", "created": 0, "owned_by": "tulving"}
