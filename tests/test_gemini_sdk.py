"""Tulving's Gemini wire against the official google-genai SDK: both perform the
same operations against the loopback, which records every request; paths,
methods, the key header and the bodies must match. The SDK also parses the
loopback's replies, evidence that the loopback speaks the real format (so
tests against it test the provider against that format)."""
from __future__ import annotations

import io

import orjson
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from engine.config import Config
from engine.loopback.gemini import Recorded
from engine.loopback.server import LoopbackServer, default_reply
from engine.requests import ChatRequest
from engine.resolve import chat_messages, chat_params
from providers.base import EndpointSpec
from providers.gemini_batch import GeminiBatchApi
from providers.gemini_http import GeminiProvider

KEY = "AIza-loopback-sdk-key-0123456789abc"
MODEL = "gemini-2.5-flash"
PROMPT = "List all events involving Jackson Ramos."
SYSTEM = "Answer from the book only."


def sdk(server: LoopbackServer) -> genai.Client:
    return genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=server.gemini_base_url))


def tulving(server: LoopbackServer) -> GeminiProvider:
    return GeminiProvider(EndpointSpec(name="g", kind="gemini", base_url=server.gemini_base_url), KEY)


def same_call(ours: Recorded, theirs: Recorded) -> None:
    assert (ours.method, ours.path, ours.query) == (theirs.method, theirs.path, theirs.query)
    assert ours.headers["x-goog-api-key"] == theirs.headers["x-goog-api-key"] == KEY
    assert ours.headers["content-type"].startswith("application/json")
    assert orjson.loads(ours.body) == orjson.loads(theirs.body)


async def recorded(server: LoopbackServer, action) -> list[Recorded]:
    server.gemini.recorded = []
    await action()
    calls, server.gemini.recorded = server.gemini.recorded, None
    return calls


@pytest.mark.parametrize("stream", [False, True])
async def test_generate_content_is_the_sdks_request_and_the_sdk_reads_the_reply(stream):
    config = types.GenerateContentConfig(system_instruction=SYSTEM, temperature=1.0, max_output_tokens=300,
                                         seed=7, stop_sequences=["\n\n"])
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    params = {"temperature": 1.0, "max_tokens": 300, "seed": 7, "stop": ["\n\n"]}
    async with LoopbackServer(api_keys=[KEY]) as server:
        client, provider = sdk(server), tulving(server)
        texts: list[str] = []

        async def with_sdk() -> None:
            if stream:
                async for chunk in await client.aio.models.generate_content_stream(model=MODEL, contents=PROMPT,
                                                                                    config=config):
                    texts.append(chunk.text or "")
            else:
                reply = await client.aio.models.generate_content(model=MODEL, contents=PROMPT, config=config)
                texts.append(reply.text or "")
                assert reply.usage_metadata.prompt_token_count > 0 and reply.candidates[0].finish_reason == "STOP"

        theirs = await recorded(server, with_sdk)
        results = []

        async def with_tulving() -> None:
            results.append(await provider.chat(MODEL, messages, params=params, timeout=10, stream=stream))

        ours = await recorded(server, with_tulving)
        await provider.aclose()
    [their_call], [our_call] = theirs, ours
    same_call(our_call, their_call)
    assert "".join(texts) == results[0].text == default_reply("gemini", {"messages": [messages[1]]})


async def test_the_leaderboard_alias_sends_what_the_reference_call_sends():
    """The reference: `client.models.generate_content(model=..., contents=user_prompt)`."""
    config = Config.load(None)
    request = ChatRequest(model="gemini-2.5-pro", messages=[{"role": "system", "content": SYSTEM},
                                                            {"role": "user", "content": PROMPT}])
    alias = config.alias("gemini-2.5-pro")
    async with LoopbackServer(api_keys=[KEY]) as server:
        client, provider = sdk(server), tulving(server)
        theirs = await recorded(server, lambda: client.aio.models.generate_content(model=alias.model,
                                                                                    contents=PROMPT))

        async def with_tulving() -> None:
            await provider.chat(alias.model, chat_messages(alias, request), params=chat_params(alias, request),
                                timeout=10)
        ours = await recorded(server, with_tulving)
        await provider.aclose()
    same_call(ours[0], theirs[0])
    assert b"systemInstruction" not in ours[0].body and b"generationConfig" not in ours[0].body


async def test_a_batch_is_created_and_read_as_the_sdk_does():
    async with LoopbackServer(api_keys=[KEY]) as server:
        # Batch Mode is documented under v1beta only (ai.google.dev/api/batch-api, checked 2026-11-28): the
        # loopback refuses it on v1, the SDK's default version, as an undocumented method.
        with pytest.raises(genai_errors.ClientError) as refused:
            await sdk(server).aio.batches.create(model=MODEL, src=[{"contents": [{"role": "user", "parts": [
                {"text": PROMPT}]}]}])
        assert refused.value.code == 404
        client = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=server.gemini_base_url,
                                                                          api_version="v1beta"))
        api = GeminiBatchApi(EndpointSpec(name="g", kind="gemini", base_url=server.gemini_base_url), KEY)
        created = []

        async def with_sdk() -> None:
            created.append(await client.aio.batches.create(
                model=MODEL, config={"display_name": "tulving-compare"},
                src=[{"contents": [{"role": "user", "parts": [{"text": PROMPT}]}], "metadata": {"key": "k0"}}]))

        async def with_tulving() -> None:
            created.append(await api.submit([api.line("k0", MODEL, [{"role": "user", "content": PROMPT}], {})]))

        theirs = await recorded(server, with_sdk)
        ours = await recorded(server, with_tulving)
        polled = await recorded(server, lambda: api.poll(created[1].id))
        their_poll = await recorded(server, lambda: client.aio.batches.get(name=created[0].name))
        job = await client.aio.batches.get(name=created[1].id)  # the SDK reads the batch Tulving made
        results = await api.results(await api.poll(created[1].id))
        await api.aclose()
    ours_body, theirs_body = orjson.loads(ours[0].body), orjson.loads(theirs[0].body)
    ours_body["batch"]["displayName"] = theirs_body["batch"]["displayName"]  # a name of each client's own
    assert ours_body == theirs_body
    assert (ours[0].method, ours[0].path) == (theirs[0].method, theirs[0].path)
    assert ours[0].headers["x-goog-api-key"] == theirs[0].headers["x-goog-api-key"]
    assert polled[0].method == their_poll[0].method == "GET"
    assert polled[0].path.rsplit("/", 1)[0] == their_poll[0].path.rsplit("/", 1)[0] == "/gemini/v1beta/batches"
    assert job.state == types.JobState.JOB_STATE_SUCCEEDED and job.model == f"models/{MODEL}"
    [inlined] = job.dest.inlined_responses
    assert inlined.metadata == {"key": "k0"} and inlined.response.text == results["k0"].text


def _upload_meta(body: bytes) -> dict[str, object]:
    """An upload start's `file` metadata, in one spelling (the SDK's async client sends snake_case)."""
    meta = orjson.loads(body)["file"]
    return {"mimeType": meta.get("mimeType", meta.get("mime_type")),
            "sizeBytes": int(meta.get("sizeBytes", meta.get("size_bytes")))}


async def test_a_batch_file_is_uploaded_as_the_sdk_uploads_it():
    async with LoopbackServer(api_keys=[KEY]) as server:
        client = genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=server.gemini_base_url,
                                                                          api_version="v1beta"))
        api = GeminiBatchApi(EndpointSpec(name="g", kind="gemini", base_url=server.gemini_base_url), KEY)
        api.inline_bytes = 0
        lines = [api.line(f"k{i}", MODEL, [{"role": "user", "content": f"{PROMPT} ({i})"}], {}) for i in range(3)]
        handle: list[str | None] = []
        ours = await recorded(server, lambda: _append(handle, api.prepare(lines)))
        data = ours[1].body
        theirs = await recorded(server, lambda: client.aio.files.upload(
            file=io.BytesIO(data), config={"mime_type": "jsonl", "display_name": "tulving-compare"}))
        seen = await client.aio.files.get(name=str(handle[0]))  # the SDK reads the file Tulving uploaded
        server.gemini.uploads.refused_mime_types = {"jsonl"}
        with pytest.raises(genai_errors.ClientError) as refused:  # the loopback's refusal, as the SDK reads it
            await client.aio.files.upload(file=io.BytesIO(data), config={"mime_type": "jsonl"})
        await api.aclose()
    for step, (our, their) in enumerate(zip(ours, theirs, strict=True)):
        assert (our.method, our.path) == (their.method, their.path) == ("POST", "/gemini/upload/v1beta/files")
        names = ("x-goog-upload-command",) + (("x-goog-upload-protocol", "x-goog-upload-header-content-length",
                                               "x-goog-upload-header-content-type", "x-goog-api-key")
                                              if step == 0 else ("x-goog-upload-offset",))
        assert {n: our.headers.get(n) for n in names} == {n: their.headers.get(n) for n in names}
    assert _upload_meta(ours[0].body) == _upload_meta(theirs[0].body) == {"mimeType": "jsonl",
                                                                          "sizeBytes": len(data)}
    assert ours[1].body == theirs[1].body and ours[1].query.keys() == theirs[1].query.keys() == {"upload_id"}
    assert seen.mime_type == "jsonl" and seen.size_bytes == len(data)
    assert refused.value.code == 400 and "Unsupported MIME type: jsonl" in str(refused.value)


async def _append(into: list, awaitable) -> None:
    into.append(await awaitable)
