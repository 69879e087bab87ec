"""Streaming (server-sent events) on the loopback server, through the official
SDKs' streaming clients: same text and usage as the non-streamed reply,
configured time to first token, faults and client cancels mid-stream."""
from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import anthropic
import httpx2
import openai
import orjson
import pytest

from engine.loopback.server import Faults, LoopbackServer, constant
from engine.loopback.stream import split_text
from tests.stalls import Gap

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["m", "c", "gpt-4o-mini", "claude-sonnet-4"]

USER = [{"role": "user", "content": "Which events happened in Boston in the spring of that year?"}]
LONG = lambda api, body: "word " * 60  # 300 characters: 75 tokens, 75 deltas  # noqa: E731


def openai_client(server: LoopbackServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)


def anthropic_client(server: LoopbackServer) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=server.anthropic_base_url, api_key="k", max_retries=0)


def test_split_text_joins_back_in_n_pieces():
    assert split_text("abcdefghij", 3) == ["abc", "def", "ghij"]
    assert split_text("ab", 5) == ["a", "b"] and split_text("", 4) == []
    text = "Reply 1a2b: several words of a reply"
    assert "".join(split_text(text, 9)) == text and len(split_text(text, 9)) == 9


async def test_openai_stream_reassembles_the_non_streamed_reply_and_usage():
    async with LoopbackServer(models=SERVED, rpm=600) as server:
        client = openai_client(server)
        try:
            plain = await client.chat.completions.create(model="gpt-4o-mini", messages=USER, max_tokens=5)
            raw = await client.chat.completions.with_raw_response.create(
                model="gpt-4o-mini", messages=USER, max_tokens=5, stream=True,
                stream_options={"include_usage": True})
            chunks = [chunk async for chunk in raw.parse()]
            no_usage = [c async for c in await client.chat.completions.create(model="gpt-4o-mini", messages=USER,
                                                                               stream=True)]
        finally:
            await client.close()
        stats = server.stats
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.headers["x-ratelimit-limit-requests"] == "600" and raw.headers["x-request-id"].startswith("req_")
    assert int(raw.headers["openai-processing-ms"]) >= 0
    first, *middle, finish, usage_chunk = chunks
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content for c in middle)
    assert text == plain.choices[0].message.content and len(middle) == plain.usage.completion_tokens == 5
    assert finish.choices[0].finish_reason == plain.choices[0].finish_reason == "length"
    assert usage_chunk.choices == [] and usage_chunk.usage == plain.usage
    assert all(c.usage is None for c in chunks[:-1]) and {c.id for c in chunks} == {first.id}
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert no_usage[-1].choices[0].finish_reason == "stop" and all(c.usage is None for c in no_usage)
    assert stats.streams == 2 and stats.by_status[200] == 3
    assert stats.output_tokens == 5 + 5 + (len(no_usage) - 2)  # the last call: one delta per token


async def test_anthropic_stream_events_and_final_message_match_the_non_streamed_reply():
    async with LoopbackServer(models=SERVED, output_tpm=60_000) as server:
        client = anthropic_client(server)
        try:
            plain = await client.messages.create(model="claude-sonnet-4", max_tokens=500, system="Be brief.",
                                                 messages=USER, stop_sequences=["spring"])
            async with client.messages.stream(model="claude-sonnet-4", max_tokens=500, system="Be brief.",
                                              messages=USER, stop_sequences=["spring"]) as stream:
                deltas = [event.delta.text async for event in stream
                          if event.type == "content_block_delta"]
                final = await stream.get_final_message()
            raw = await client.messages.with_raw_response.create(model="claude-sonnet-4", max_tokens=500,
                                                                 messages=USER, stream=True)
            events = [event async for event in await raw.parse()]
        finally:
            await client.close()
    assert "".join(deltas) == plain.content[0].text == final.content[0].text
    assert final.stop_reason == plain.stop_reason == "stop_sequence" and final.stop_sequence == "spring"
    assert final.usage.input_tokens == plain.usage.input_tokens
    assert final.usage.output_tokens == plain.usage.output_tokens == len(deltas)
    assert [e.type for e in events[:2]] == ["message_start", "content_block_start"]
    assert [e.type for e in events[-3:]] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[0].message.usage.cache_read_input_tokens == 0
    assert raw.headers["content-type"].startswith("text/event-stream") and "request-id" in raw.headers
    assert raw.headers["anthropic-ratelimit-output-tokens-limit"] == "60000"


async def test_the_wire_format_has_event_lines_ping_and_done():
    async with LoopbackServer(models=SERVED) as server, aiohttp.ClientSession() as session:
        async with session.post(server.anthropic_base_url + "/v1/messages",
                                json={"model": "c", "max_tokens": 50, "messages": USER, "stream": True}) as resp:
            anthropic_wire = (await resp.read()).decode()
        async with session.post(server.openai_base_url + "/chat/completions",
                                json={"model": "m", "messages": USER, "stream": True}) as resp:
            openai_wire = (await resp.read()).decode()
        async with session.post(server.openai_base_url + "/chat/completions",
                                json={"model": "m", "messages": USER, "stream_options": {"include_usage": True}}
                                ) as resp:
            misplaced = resp.status, await resp.json()
    blocks = anthropic_wire.strip().split("\n\n")
    names = [b.split("\n")[0] for b in blocks]
    assert names[:3] == ["event: message_start", "event: content_block_start", "event: ping"]
    assert names[-1] == "event: message_stop" and all(b.split("\n")[1].startswith("data: {") for b in blocks)
    assert openai_wire.endswith("data: [DONE]\n\n") and "event:" not in openai_wire
    assert misplaced[0] == 400 and misplaced[1]["error"]["param"] == "stream_options"


async def first_token_times(server: LoopbackServer, n: int) -> list[tuple[float, float, int]]:
    """(time to first content delta, total, deltas) of `n` streamed calls."""
    client = openai_client(server)
    out = []
    try:
        for _ in range(n):
            start = time.perf_counter()
            first, count = None, 0
            async for chunk in await client.chat.completions.create(model="m", messages=USER, stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    first = first or time.perf_counter() - start
                    count += 1
            out.append((first, time.perf_counter() - start, count))
    finally:
        await client.close()
    return out


async def test_measured_time_to_first_token_and_token_gaps_follow_the_configuration():
    async with LoopbackServer(models=SERVED, ttft=constant(0.05), token_delay=constant(0.003), reply=LONG) as server:
        runs = await first_token_times(server, 2)
    for ttft, total, deltas in runs:  # at least the waits configured (a loaded host only adds to them)
        assert deltas == 75
        assert ttft >= 0.05
        assert total >= 0.05 + 74 * 0.003


async def test_non_streamed_replies_take_ttft_plus_the_token_gaps():
    waits: list[str] = []  # what the server drew for the reply's wait: the first token, then each gap

    def ttft() -> float:
        waits.append("ttft")
        return 0.01

    def gap() -> float:
        waits.append("gap")
        return 0.001

    async with LoopbackServer(models=SERVED, ttft=ttft, token_delay=gap, reply=LONG) as server:
        client = openai_client(server)
        try:
            reply = await client.chat.completions.create(model="m", messages=USER)
        finally:
            await client.close()
    # the whole generation's waits, though nothing streams: the first token and a gap before each other
    assert reply.usage.completion_tokens == 75 and waits == ["ttft"] + ["gap"] * 74


async def read_five_deltas_then_leave(server: LoopbackServer, api: str) -> None:
    if api == "anthropic":
        client = anthropic_client(server)
        async with client.messages.stream(model="c", max_tokens=500, messages=USER) as stream:
            received = 0
            async for event in stream:
                received += event.type == "content_block_delta"
                if received == 5:
                    break
    else:
        client = openai_client(server)
        stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
        received = 0
        async for chunk in stream:
            received += bool(chunk.choices and chunk.choices[0].delta.content)
            if received == 5:
                break
        await stream.close()
    await client.close()


@pytest.mark.parametrize("api", ["anthropic", "openai"])
async def test_a_client_that_cancels_mid_stream_stops_the_server_cleanly(caplog, api):
    caplog.set_level(logging.DEBUG)
    gap = Gap(0.02)
    async with LoopbackServer(models=SERVED, token_delay=gap, reply=LONG) as server:
        await read_five_deltas_then_leave(server, api)
        for _ in range(100):
            if server.stats.in_flight == 0:
                break
            await asyncio.sleep(0.01)
        stats = server.stats
        gap.seconds = 0.0  # the cut stream is what had to be slow; the next reply comes at once
        assert stats.in_flight == 0 and stats.streams == 1 and stats.streams_cancelled == 1
        assert stats.by_status == {"client_gone": 1} and 5 <= stats.output_tokens < 75
        # The server goes on serving.
        client = anthropic_client(server)
        try:
            message = await client.messages.create(model="c", max_tokens=500, messages=USER)
        finally:
            await client.close()
        assert message.usage.output_tokens == 75
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert errors == []


@pytest.mark.parametrize("kind", ["reset", "truncate"])
async def test_a_fault_cuts_the_stream_after_some_chunks(kind):
    async with LoopbackServer(models=SERVED, faults=Faults.first(1, kind), reply=LONG) as server:
        client = openai_client(server)
        try:
            received = []
            with pytest.raises((httpx2.TransportError, openai.APIError)):
                async for chunk in await client.chat.completions.create(model="m", messages=USER, stream=True):
                    if chunk.choices and chunk.choices[0].delta.content:
                        received.append(chunk.choices[0].delta.content)
            again = await client.chat.completions.create(model="m", messages=USER)
        finally:
            await client.close()
        stats = server.stats
    assert 0 < len(received) < 75 and stats.faults == {kind: 1} and stats.by_status[kind] == 1
    assert again.usage.completion_tokens == 75


async def test_an_in_stream_error_event_surfaces_as_the_sdks_error():
    async with LoopbackServer(models=SERVED, faults=Faults(schedule=["stream_error"] * 3), reply=LONG) as server:
        oclient, aclient = openai_client(server), anthropic_client(server)
        try:
            received = []
            with pytest.raises(openai.APIError) as openai_info:
                async for chunk in await oclient.chat.completions.create(model="m", messages=USER, stream=True):
                    received.append(chunk)
            with pytest.raises(anthropic.APIStatusError) as anthropic_info:
                async with aclient.messages.stream(model="c", max_tokens=500, messages=USER) as stream:
                    async for _ in stream:
                        pass
            with pytest.raises(anthropic.OverloadedError):  # unstreamed: a plain 529
                await aclient.messages.create(model="c", max_tokens=500, messages=USER)
        finally:
            await oclient.close()
            await aclient.close()
        stats = server.stats
    assert 30 < len(received) < 75 and openai_info.value.body["type"] == "server_error"
    assert anthropic_info.value.body["error"]["type"] == "overloaded_error"
    assert stats.faults == {"stream_error": 3} and stats.streams == 2 and stats.by_status == {200: 2, 529: 1}


async def test_rate_limits_and_auth_hold_for_streamed_calls():
    async with LoopbackServer(models=SERVED, rpm=60, api_keys=["good"]) as server:
        denied = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="bad", max_retries=0)
        client = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="good", max_retries=0)
        try:
            with pytest.raises(openai.AuthenticationError):
                await denied.chat.completions.create(model="m", messages=USER, stream=True)
            chunks = [c async for c in await client.chat.completions.create(model="m", messages=USER, stream=True)]
            with pytest.raises(openai.RateLimitError) as info:
                await client.chat.completions.create(model="m", messages=USER, stream=True)
        finally:
            await denied.close()
            await client.close()
    assert chunks and info.value.response.headers["retry-after"] == "1"


def test_stream_chunks_are_valid_json():
    # Every data line of both formats parses (guards the hand-built frames).
    from engine.loopback.stream import anthropic_frames, openai_frames
    data = {"id": "x", "created": 1, "model": "m", "system_fingerprint": "f", "service_tier": "default",
            "choices": [{"message": {"content": "héllo wörld"}, "finish_reason": "stop"}],
            "usage": {"completion_tokens": 3}}
    for frame, _ in openai_frames(data, True)[:-1]:
        assert orjson.loads(frame[len(b"data: "):])
    message = {"id": "m", "content": [{"type": "text", "text": "abc"}], "stop_reason": "end_turn",
               "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 2,
                                                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
    for frame, _ in anthropic_frames(message):
        assert orjson.loads(frame.split(b"\ndata: ", 1)[1])


async def test_the_openai_sdks_stream_helper_rebuilds_the_non_streamed_completion():
    # `chat.completions.stream` accumulates the chunks into a ChatCompletion
    # (openai.lib.streaming), stricter than iterating raw chunks.
    async with LoopbackServer(models=SERVED) as server:
        client = openai_client(server)
        try:
            plain = await client.chat.completions.create(model="m", messages=USER)
            async with client.chat.completions.stream(model="m", messages=USER,
                                                      stream_options={"include_usage": True}) as stream:
                events = [event async for event in stream]
                final = await stream.get_final_completion()
        finally:
            await client.close()
    done = [e for e in events if e.type == "content.done"]
    assert len(done) == 1 and done[0].content == plain.choices[0].message.content
    assert final.choices[0].message.content == plain.choices[0].message.content
    assert final.choices[0].finish_reason == plain.choices[0].finish_reason == "stop"
    assert final.usage == plain.usage and final.object == "chat.completion"
