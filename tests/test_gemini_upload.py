"""The Gemini Files API upload over real HTTP on the loopback: Tulving's batch
input goes up by the resumable protocol Google documents (start, then the
bytes with "upload, finalize"), falls back to text/plain when the API refuses
the Batch guide's `jsonl` label, and the loopback refuses the steps the API
refuses (no protocol, a chunk of a session never started, a wrong offset, a
size that is not the declared one, a MIME type the Files API does not take)."""
from __future__ import annotations

import aiohttp
import orjson
import pytest

from engine.loopback.server import LoopbackServer
from providers.base import EndpointSpec, ProviderError
from providers.gemini_batch import GeminiBatchApi

KEY = "AIza-loopback-upload-key-0123456789ab"
MODEL = "gemini-2.5-flash"
USER = {"role": "user", "content": "Which events happened in Boston?"}


def batch_api(server: LoopbackServer) -> GeminiBatchApi:
    api = GeminiBatchApi(EndpointSpec(name="g", kind="gemini", base_url=server.gemini_base_url), KEY)
    api.inline_bytes = 0  # every batch goes as an uploaded file
    return api


def upload_url(server: LoopbackServer, version: str = "v1beta") -> str:
    return f"{server.gemini_base_url}/upload/{version}/files"


async def start(http: aiohttp.ClientSession, server: LoopbackServer, size: int, mime_type: str = "jsonl",
                **extra: str) -> aiohttp.ClientResponse:
    headers = {"x-goog-api-key": KEY, "X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start",
               "X-Goog-Upload-Header-Content-Length": str(size), "X-Goog-Upload-Header-Content-Type": mime_type,
               **extra}
    return await http.post(upload_url(server), data=orjson.dumps({"file": {"displayName": "t"}}), headers=headers)


async def chunk(http: aiohttp.ClientSession, url: str, data: bytes, offset: int, command: str
                ) -> aiohttp.ClientResponse:
    return await http.post(url, data=data, headers={"X-Goog-Upload-Command": command,
                                                    "X-Goog-Upload-Offset": str(offset)})


async def test_a_batch_file_goes_up_by_the_resumable_protocol_and_answers():
    async with LoopbackServer(api_keys=[KEY]) as server:
        server.gemini.recorded = []
        api = batch_api(server)
        try:
            lines = [api.line(f"k{i}", MODEL, [USER], {"max_tokens": 20}) for i in range(3)]
            results = await api.results(await api.poll((await api.submit(lines)).id))
        finally:
            await api.aclose()
        steps = [r for r in server.gemini.recorded if "/upload/" in r.path]
    assert server.gemini.uploads.protocols == ["resumable-start", "resumable-chunk"]  # one start, one chunk
    first, second = steps
    assert first.path == "/gemini/upload/v1beta/files" and "upload_id" not in first.query
    assert first.headers["x-goog-upload-protocol"] == "resumable" and first.headers["x-goog-upload-command"] == "start"
    assert first.headers["x-goog-upload-header-content-type"] == "jsonl"
    assert int(first.headers["x-goog-upload-header-content-length"]) == len(second.body)
    assert second.headers["x-goog-upload-command"] == "upload, finalize"
    assert second.headers["x-goog-upload-offset"] == "0"
    assert [orjson.loads(line)["key"] for line in second.body.splitlines()] == ["k0", "k1", "k2"]
    assert sorted(results) == ["k0", "k1", "k2"] and all(r.text for r in results.values())


async def test_a_refused_jsonl_label_is_started_again_as_text_plain():
    async with LoopbackServer(api_keys=[KEY]) as server:
        server.gemini.uploads.refused_mime_types = {"jsonl"}  # the intermittent "Unsupported MIME type: jsonl"
        server.gemini.recorded = []
        api = batch_api(server)
        try:
            info = await api.submit([api.line("k0", MODEL, [USER], {})])
            results = await api.results(await api.poll(info.id))
        finally:
            await api.aclose()
        starts = [r.headers["x-goog-upload-header-content-type"] for r in server.gemini.recorded
                  if r.headers.get("x-goog-upload-command") == "start"]
        statuses = dict(server.stats.by_status)
    assert starts == ["jsonl", "text/plain"] and statuses.get(400) == 1
    assert list(results) == ["k0"]


async def test_an_upload_refused_for_another_reason_is_not_retried():
    async with LoopbackServer(api_keys=[KEY]) as server:
        server.gemini.uploads.refused_mime_types = {"jsonl", "text/plain"}
        api = batch_api(server)
        try:
            with pytest.raises(ProviderError) as refused:
                await api.submit([api.line("k0", MODEL, [USER], {})])
        finally:
            await api.aclose()
        starts = server.gemini.uploads.protocols
    assert refused.value.status == 400 and "Unsupported MIME type: text/plain" in refused.value.message
    assert KEY not in str(refused.value) and starts == ["resumable-start", "resumable-start"]


async def test_the_loopback_refuses_the_upload_steps_the_api_refuses():
    data = b'{"key": "k0", "request": {}}\n'
    async with LoopbackServer(api_keys=[KEY]) as server, aiohttp.ClientSession() as http:
        no_protocol = await http.post(upload_url(server), data=data, headers={"x-goog-api-key": KEY})
        no_length = await start(http, server, 0, **{"X-Goog-Upload-Header-Content-Length": ""})
        bad_type = await start(http, server, len(data), mime_type="application/x-cu-seeme")
        on_v1 = await http.post(upload_url(server, "v1"), headers={  # files are documented under v1beta only
            "x-goog-api-key": KEY, "X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start"})
        never_started = await chunk(http, f"{upload_url(server)}?upload_id=u999", data, 0, "upload, finalize")
        session = (await start(http, server, len(data))).headers["X-Goog-Upload-URL"]
        wrong_offset = await chunk(http, session, data, 5, "upload, finalize")
        too_short = await chunk(http, session, data[:-1], 0, "upload, finalize")
        short_session = (await start(http, server, len(data))).headers["X-Goog-Upload-URL"]
        half = await chunk(http, short_session, data[:10], 0, "upload")
        finalized_short = await chunk(http, short_session, b"", 10, "finalize")
        stored = len(server.gemini.files)
        statuses = [no_protocol.status, no_length.status, bad_type.status, on_v1.status, never_started.status,
                    wrong_offset.status, too_short.status, half.status, finalized_short.status]
        messages = [(await r.json())["error"]["message"] for r in (bad_type, wrong_offset, too_short)]
    assert statuses == [400, 400, 400, 404, 404, 400, 400, 200, 400]
    assert messages[0] == "Unsupported MIME type: application/x-cu-seeme"
    assert "is not the 0 bytes received so far" in messages[1] and f"hold {len(data) - 1} bytes" in messages[2] and f"declared {len(data)}" in messages[2]
    assert half.headers["X-Goog-Upload-Status"] == "active" and stored == 0  # nothing finalized, nothing stored


async def test_an_upload_in_chunks_is_stored_whole_once_finalized():
    data = b"".join(orjson.dumps({"key": f"k{i}", "request": {}}) + b"\n" for i in range(40))
    async with LoopbackServer(api_keys=[KEY]) as server, aiohttp.ClientSession() as http:
        session = (await start(http, server, len(data))).headers["X-Goog-Upload-URL"]
        parts = [await chunk(http, session, data[i:i + 256], i, "upload") for i in range(0, len(data) - 256, 256)]
        sent = sum(len(data[i:i + 256]) for i in range(0, len(data) - 256, 256))
        last = await chunk(http, session, data[sent:], sent, "upload, finalize")
        body = await last.json()
        again = await chunk(http, session, b"", len(data), "finalize")  # the session is gone once final
        stored = server.gemini.files[body["file"]["name"].removeprefix("files/")][1]
    assert {p.headers["X-Goog-Upload-Status"] for p in parts} == {"active"}
    assert last.headers["X-Goog-Upload-Status"] == "final" and body["file"]["mimeType"] == "jsonl"
    assert body["file"]["sizeBytes"] == str(len(data)) and stored == data and again.status == 404
