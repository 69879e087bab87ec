"""A differential test of the wire against the official SDKs (openai,
anthropic; versions from the test extra): for each operation, the SDK and
Tulving's provider make the same call through a recording proxy in front of
the loopback server (which answers as the APIs do), and the two recorded
requests are compared: method, path, query, the headers the API requires
(auth header and scheme, anthropic-version, anthropic-beta, the body's
content type), the set of other headers, and the body (JSON: equal;
multipart: the same parts). Where Tulving deliberately differs, the
difference is listed below with its reason; anything else fails.

Operations: OpenAI chat plain and streamed; the OpenAI batch flow (file
upload, multipart purpose=batch; create; retrieve; download of the output
and error files); Anthropic messages plain, streamed, and with
cache_control on a system block and on a user prefix; Anthropic message
batches (create, retrieve, results). Gemini is tested elsewhere.
"""
from __future__ import annotations

import email.parser
import email.policy
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import anthropic
import openai
import orjson
import pytest
from aiohttp import web

from engine.loopback.batches import BatchKnobs
from engine.loopback.server import LoopbackServer
from providers.anthropic_batch import AnthropicBatchApi
from providers.anthropic_http import AnthropicProvider
from providers.base import PREFIX_END, ChatResult, EndpointSpec, ProviderError
from providers.openai_batch import OpenAIBatchApi
from providers.openai_http import OpenAIProvider
from providers.standard_kinds import ANTHROPIC_API_VERSION

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["gpt-4o-mini", "claude-sonnet-5-5"]

# The anthropic SDK's own API version (anthropic/_constants.py). Tulving pins
# an older one by default (endpoint option `anthropic_version`): a known
# difference, kept here so that a change on either side is seen. The calls
# below set the option to the SDK's version, so the rest is compared exactly.
SDK_ANTHROPIC_VERSION = "2026-10-21"
KNOWN_VERSION_GAP = {"2023-06-01": "Tulving's default; anthropic 2.14 sends 2026-10-21 (set anthropic_version "
                                   "on the endpoint to follow it)"}

KEY = "sk-differential-test-key-0123456789"
GPT, CLAUDE = "gpt-4o-mini", "claude-sonnet-5-5"
SYSTEM = "You answer questions about the book. Be brief."
BOOK = "Chapter 1. Maya met Sam at the harbour on March 3. " * 20
QUESTION = "Where did Maya meet Sam?"
PARAMS = {"temperature": 0.0, "max_tokens": 64}

# Headers that must be equal when either side sends them: what the API reads
# (the credential is compared apart: see `credential`).
REQUIRED = ("anthropic-version", "anthropic-beta")
# The one credential difference: the anthropic SDK (2.14) sends its API key as
# `Authorization: Bearer`, Tulving as `x-api-key`, the header the Messages API
# reference documents; the API (and the loopback server) accepts both.
ANTHROPIC_KEY_HEADER = "Tulving sends x-api-key (the documented header); anthropic 2.x sends Authorization: Bearer"
# Headers one side sends and the other does not, each with why that is fine.
DELIBERATE = {
    "x-stainless-": "the SDKs' telemetry (os, arch, runtime, package version, retry count, timeout): "
                    "no API requires it, Tulving sends none",
    "authorization": ANTHROPIC_KEY_HEADER,
    "x-api-key": ANTHROPIC_KEY_HEADER,
    "accept-encoding": "transport detail of each HTTP client (the replies are small JSON or event streams)",
    "connection": "HTTP/1.1 keeps connections alive by default; httpx (the SDKs) says keep-alive anyway",
    "idempotency-key": "the SDKs' retry de-duplication; Tulving's engine de-duplicates by its cache key",
}
# Headers both send whose values may differ (not compared), and why: user-agent
# (each client names itself), accept (Tulving asks application/json everywhere,
# a streamed or file download included; the APIs ignore it), host (the same
# server, spelled by each client).
# Tulving's JSON content type is a session default, so it also rides on body-less GETs; the SDKs send none there.
GET_CONTENT_TYPE = "Tulving's session sends its JSON content type on a GET too; a GET has no body to type"


@dataclass
class Seen:
    """One request as the recording proxy saw it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]                    # lower-case names
    json: Any = None                           # a JSON body, parsed
    parts: dict[str, dict[str, Any]] = field(default_factory=dict)  # multipart: name -> filename, type, data

    @property
    def media_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()


def _parts(content_type: str, body: bytes) -> dict[str, dict[str, Any]]:
    message = email.parser.BytesParser(policy=email.policy.default).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body)
    parts = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        parts[str(name)] = {"filename": part.get_filename(), "content_type": part.get_content_type()
                            if part.get("content-type") else None, "data": part.get_payload(decode=True)}
    return parts


def seen(request: web.Request, body: bytes) -> Seen:
    record = Seen(request.method, request.path, dict(request.query),
                  {k.lower(): v for k, v in request.headers.items()})
    if record.media_type == "application/json" and body:
        record.json = orjson.loads(body)
    elif record.media_type == "multipart/form-data":
        record.parts = _parts(request.headers["content-type"], body)
    return record


_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive"}


class Recorder:
    """A recording reverse proxy in front of a LoopbackServer: every request
    is recorded, then relayed with its Host (so absolute URLs the server
    builds, Anthropic's results_url, point back here)."""

    def __init__(self, upstream: LoopbackServer):
        self.upstream = f"http://{upstream.host}:{upstream.port}"
        self.requests: list[Seen] = []

    async def __aenter__(self) -> Recorder:
        self.session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.origin = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()
        await self.session.close()

    async def _relay(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append(seen(request, body))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self.session.request(request.method, self.upstream + request.rel_url.path_qs, data=body,
                                        headers=headers) as reply:
            raw = await reply.read()
            out = {k: v for k, v in reply.headers.items() if k.lower() not in _HOP}
            return web.Response(status=reply.status, body=raw, headers=out)

    def take(self) -> list[Seen]:
        taken, self.requests = self.requests, []
        return taken


def _deliberate(name: str, anthropic_api: bool) -> bool:
    if name in ("authorization", "x-api-key"):
        return anthropic_api  # OpenAI: the same header on both sides, or this fails
    return any(name.startswith(prefix) if prefix.endswith("-") else name == prefix for prefix in DELIBERATE)


def credential(request: Seen) -> tuple[str, str] | None:
    """(header and scheme, key) of the API key a request presents."""
    if "x-api-key" in request.headers:
        return "x-api-key", request.headers["x-api-key"]
    scheme, _, key = request.headers.get("authorization", "").partition(" ")
    return (f"authorization {scheme}", key) if key else None


def same_credential(sdk: Seen, ours: Seen) -> None:
    """The same key, the same way; for Anthropic, the same key (ANTHROPIC_KEY_HEADER)."""
    theirs, mine = credential(sdk), credential(ours)
    assert theirs is not None and mine is not None and mine[1] == theirs[1] == KEY
    if "anthropic-version" in sdk.headers:
        assert mine[0] == "x-api-key", ANTHROPIC_KEY_HEADER
    else:
        assert mine[0] == theirs[0] == "authorization Bearer"
        assert "x-api-key" not in sdk.headers and "x-api-key" not in ours.headers


def same_request(sdk: Seen, ours: Seen) -> None:
    """Tulving's request `ours` is the SDK's `sdk`, but for the listed differences."""
    assert (ours.method, ours.path, ours.query) == (sdk.method, sdk.path, sdk.query)
    same_credential(sdk, ours)
    for name in REQUIRED:
        assert ours.headers.get(name) == sdk.headers.get(name), name
    if sdk.media_type or ours.method != "GET":
        assert ours.media_type == sdk.media_type, (sdk.path, sdk.media_type, ours.media_type)
    else:
        assert ours.media_type in ("", "application/json"), GET_CONTENT_TYPE
    differ = set(sdk.headers) ^ set(ours.headers)
    anthropic_api = "anthropic-version" in sdk.headers
    unexplained = {h for h in differ if not _deliberate(h, anthropic_api) and not (h == "content-type" and ours.method == "GET")}
    assert not unexplained, f"headers sent by one side only: {sorted(unexplained)}"
    assert ours.json == sdk.json, sdk.path
    assert ours.parts.keys() == sdk.parts.keys()
    for name, part in sdk.parts.items():
        mine = ours.parts[name]
        assert (mine["filename"], mine["content_type"]) == (part["filename"], part["content_type"]), name
        assert _jsonl(mine["data"]) == _jsonl(part["data"]), name


def _jsonl(data: bytes) -> list[Any]:
    try:
        return [orjson.loads(line) for line in data.splitlines() if line.strip()]
    except orjson.JSONDecodeError:
        return [data]


def same_flow(sdk: list[Seen], ours: list[Seen]) -> None:
    assert [(r.method, r.path) for r in ours] == [(r.method, r.path) for r in sdk]
    for a, b in zip(sdk, ours):
        same_request(a, b)


def spec(kind: str, base_url: str) -> EndpointSpec:
    options = {"anthropic_version": SDK_ANTHROPIC_VERSION} if kind == "anthropic" else {}
    return EndpointSpec(name=f"diff-{kind}", kind=kind, base_url=base_url, options=options)


def test_the_anthropic_version_gap_is_the_known_one():
    from anthropic._constants import ANTHROPIC_API_VERSION as sdk_version

    assert sdk_version == SDK_ANTHROPIC_VERSION  # a new SDK: compare again, and update the note
    assert ANTHROPIC_API_VERSION == sdk_version or ANTHROPIC_API_VERSION in KNOWN_VERSION_GAP


@pytest.fixture
async def recorder():
    async with LoopbackServer(models=SERVED, api_keys=[KEY], batch=BatchKnobs(polls=1, fail_share=0.5, shuffle=False)) as server:
        async with Recorder(server) as proxy:
            yield proxy


# -- OpenAI ------------------------------------------------------------------------------------

CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_chat_is_the_sdks_request(recorder, stream):
    client = openai.AsyncOpenAI(base_url=recorder.origin + "/v1", api_key=KEY, max_retries=0)
    try:
        if stream:
            chunks = await client.chat.completions.create(model=GPT, messages=CHAT, stream=True,
                                                          stream_options={"include_usage": True}, **PARAMS)
            text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
        else:
            text = (await client.chat.completions.create(model=GPT, messages=CHAT, **PARAMS)).choices[0].message.content
    finally:
        await client.close()
    sdk = recorder.take()
    provider = OpenAIProvider(spec("openai", recorder.origin + "/v1"), KEY)
    try:
        result = await provider.chat(GPT, CHAT, params=PARAMS, timeout=10, stream=stream)
    finally:
        await provider.aclose()
    same_flow(sdk, recorder.take())
    assert result.text == text and not result.usage_counted_locally


async def test_openai_batch_flow_is_the_sdks(recorder):
    base = recorder.origin + "/v1"
    api = OpenAIBatchApi(spec("openai", base), KEY)
    lines = [api.line(f"line-{i}", GPT, [{"role": "user", "content": f"{QUESTION} ({i})"}], PARAMS) for i in range(2)]
    try:
        info = await api.submit(lines)
        info = await api.poll(info.id)
        results = await api.results(info)
    finally:
        await api.aclose()
    ours = recorder.take()
    assert info.ended and len(results) == 2
    assert sum(isinstance(r, ChatResult) for r in results.values()) == 1  # fail_share 0.5: one line each way
    assert sum(isinstance(r, ProviderError) for r in results.values()) == 1

    client = openai.AsyncOpenAI(base_url=base, api_key=KEY, max_retries=0)
    try:
        uploaded = await client.files.create(file=("batch.jsonl", b"".join(line + b"\n" for line in lines),
                                                   "application/jsonl"), purpose="batch")
        batch = await client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                            completion_window="24h", metadata={"client": "tulving"})
        batch = await client.batches.retrieve(batch.id)
        output = await client.files.content(batch.output_file_id)
        errors = await client.files.content(batch.error_file_id)
    finally:
        await client.close()
    sdk = recorder.take()
    assert batch.status == "completed" and output.content and errors.content
    upload = ours[0]
    assert upload.parts["purpose"]["data"] == b"batch" and upload.parts["file"]["filename"] == "batch.jsonl"
    assert _jsonl(upload.parts["file"]["data"]) == [orjson.loads(line) for line in lines]
    # A batch line's body is the SDK's own chat body for the same call.
    [line] = [orjson.loads(x) for x in lines[:1]]
    assert line["url"] == "/v1/chat/completions" and line["method"] == "POST"
    assert line["body"] == {"model": GPT, "messages": [{"role": "user", "content": f"{QUESTION} (0)"}], **PARAMS}
    # Ids differ between the two flows (two batches): compare the paths with each side's own ids.
    for seen_list, ids in ((sdk, (uploaded.id, batch.id, batch.output_file_id, batch.error_file_id)),
                           (ours, _openai_ids(ours))):
        _name_ids(seen_list, ids)
    same_flow(sdk, ours)


def _openai_ids(ours: list[Seen]) -> tuple[str, str, str, str]:
    """The file, batch and result file ids of Tulving's flow, from the paths it called."""
    file_id = ours[1].json["input_file_id"]
    batch_id = ours[2].path.rsplit("/", 1)[1]
    output_id, error_id = (r.path.split("/")[3] for r in ours[3:5])
    return file_id, batch_id, output_id, error_id


def _name_ids(requests: list[Seen], ids: tuple[str, ...]) -> None:
    """Replace a flow's own ids by their role, in paths and bodies."""
    names = dict(zip(ids, ("<input file>", "<batch>", "<output file>", "<error file>")))
    for r in requests:
        for real, name in names.items():
            r.path = r.path.replace(real, name)
        if isinstance(r.json, dict) and r.json.get("input_file_id") in names:
            r.json["input_file_id"] = names[r.json["input_file_id"]]


# -- Anthropic ----------------------------------------------------------------------------------

def cached_system() -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM + BOOK, PREFIX_END: len(SYSTEM + BOOK)},
            {"role": "user", "content": QUESTION}]


def cached_user() -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": BOOK + QUESTION, PREFIX_END: len(BOOK)}]


EPHEMERAL = {"type": "ephemeral"}


def _one_hour(call: dict) -> dict:
    """The call with its cache marks on the 1-hour TTL, as Tulving marks a batch's
    shared prefix (a batch outlives the 5-minute cache; providers/anthropic_batch.py)."""
    text = orjson.dumps(call).replace(orjson.dumps(EPHEMERAL), orjson.dumps({"type": "ephemeral", "ttl": "1h"}))
    return orjson.loads(text)
# The same calls written for the SDK, as Anthropic's prompt-caching docs show them.
SDK_CALLS = {
    "plain": {"system": SYSTEM, "messages": [{"role": "user", "content": QUESTION}]},
    "cached system": {"system": [{"type": "text", "text": SYSTEM + BOOK, "cache_control": EPHEMERAL}],
                      "messages": [{"role": "user", "content": QUESTION}]},
    "cached user prefix": {"system": SYSTEM, "messages": [{"role": "user", "content": [
        {"type": "text", "text": BOOK, "cache_control": EPHEMERAL}, {"type": "text", "text": QUESTION}]}]},
}
# anthropic 2.x dropped `temperature` from its signature: an SDK user sends it as an extra body field.
# Anthropic's current API version (2026-10-21, what the SDK 2.14 and Tulving send) takes no temperature,
# top_p or top_k: both sides send the output limit only (test_anthropic_sampling_* below for the rest).
CLAUDE_PARAMS = {"max_tokens": PARAMS["max_tokens"]}
SDK_PARAMS = CLAUDE_PARAMS
OURS = {"plain": lambda: CHAT, "cached system": cached_system, "cached user prefix": cached_user}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("call", list(SDK_CALLS))
async def test_anthropic_messages_are_the_sdks_request(recorder, call, stream):
    client = anthropic.AsyncAnthropic(base_url=recorder.origin, api_key=KEY, max_retries=0)
    try:
        if stream:
            events = await client.messages.create(model=CLAUDE, stream=True, **SDK_CALLS[call], **SDK_PARAMS)
            text = "".join([e.delta.text async for e in events if e.type == "content_block_delta"])
        else:
            message = await client.messages.create(model=CLAUDE, **SDK_CALLS[call], **SDK_PARAMS)
            text = "".join(b.text for b in message.content if b.type == "text")
    finally:
        await client.close()
    sdk = recorder.take()
    provider = AnthropicProvider(spec("anthropic", recorder.origin), KEY)
    try:
        result = await provider.chat(CLAUDE, OURS[call](), params=CLAUDE_PARAMS, timeout=10, stream=stream)
    finally:
        await provider.aclose()
    same_flow(sdk, recorder.take())
    assert result.text == text


async def test_anthropic_message_batches_are_the_sdks(recorder):
    api = AnthropicBatchApi(spec("anthropic", recorder.origin), KEY)
    calls = [("a-0", CHAT), ("a-1", cached_user())]
    try:
        info = await api.submit([api.line(cid, CLAUDE, messages, CLAUDE_PARAMS) for cid, messages in calls])
        info = await api.poll(info.id)
        results = await api.results(info)
    finally:
        await api.aclose()
    ours = recorder.take()
    assert info.ended and set(results) == {"a-0", "a-1"}

    client = anthropic.AsyncAnthropic(base_url=recorder.origin, api_key=KEY, max_retries=0)
    requests = [{"custom_id": "a-0", "params": {"model": CLAUDE, **SDK_CALLS["plain"], **CLAUDE_PARAMS}},
                {"custom_id": "a-1", "params": {"model": CLAUDE, **_one_hour(SDK_CALLS["cached user prefix"]),
                                                **CLAUDE_PARAMS}}]
    try:
        batch = await client.messages.batches.create(requests=requests)
        batch = await client.messages.batches.retrieve(batch.id)
        got = [item.custom_id async for item in await client.messages.batches.results(batch.id)]
    finally:
        await client.close()
    sdk = recorder.take()
    assert batch.processing_status == "ended" and sorted(got) == ["a-0", "a-1"]
    # The SDK's results() reads the batch again for its results_url, then the results.
    assert [(r.method, r.path) for r in sdk][-2:-1] == [("GET", f"/v1/messages/batches/{batch.id}")]
    del sdk[-2]
    for requests_seen, batch_id in ((sdk, batch.id), (ours, info.id)):
        for r in requests_seen:
            r.path = r.path.replace(batch_id, "<batch>")
    same_flow(sdk, ours)
