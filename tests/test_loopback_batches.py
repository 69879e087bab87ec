"""The OpenAI Batch API and Anthropic Message Batches on the loopback server,
driven end to end by the official SDKs' batch clients."""
from __future__ import annotations

import anthropic
import openai
import orjson
import pytest

from engine.loopback.batches import BatchKnobs
from engine.loopback.server import LoopbackServer

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["c", "gpt-4o", "gpt-4o-mini", "claude-sonnet-4"]

QUESTIONS = [f"Which events happened in place number {i}?" for i in range(6)]


def chat_line(custom_id: str, question: str, model: str = "gpt-4o-mini", url: str = "/v1/chat/completions") -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": model, "max_tokens": 40, "messages": [{"role": "user", "content": question}]}}


def jsonl(lines: list) -> bytes:
    return b"".join((line if isinstance(line, bytes) else orjson.dumps(line)) + b"\n" for line in lines)


async def openai_batch(client: openai.AsyncOpenAI, lines: list, endpoint: str = "/v1/chat/completions"):
    uploaded = await client.files.create(file=("batch.jsonl", jsonl(lines)), purpose="batch")
    return await client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h",
                                       metadata={"run": "test"})


async def poll(client: openai.AsyncOpenAI, batch_id: str, n: int) -> list:
    return [await client.batches.retrieve(batch_id) for _ in range(n)]


async def read_lines(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    content = await client.files.content(file_id)
    return [orjson.loads(line) for line in content.read().splitlines()]


@pytest.fixture
async def oai():
    async def make(**knobs):
        server = await LoopbackServer(models=SERVED, batch=BatchKnobs(**knobs)).start()
        servers.append(server)
        client = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        clients.append(client)
        return client, server
    servers, clients = [], []
    yield make
    for client in clients:
        await client.close()
    for server in servers:
        await server.close()


@pytest.fixture
async def ant():
    async def make(**knobs):
        server = await LoopbackServer(models=SERVED, batch=BatchKnobs(**knobs)).start()
        servers.append(server)
        client = anthropic.AsyncAnthropic(base_url=server.anthropic_base_url, api_key="k", max_retries=0)
        clients.append(client)
        return client, server
    servers, clients = [], []
    yield make
    for client in clients:
        await client.close()
    for server in servers:
        await server.close()


# -- OpenAI -------------------------------------------------------------------------------------

async def test_openai_batch_goes_through_its_states_and_replies_like_direct_calls(oai):
    client, server = await oai(polls=3)
    lines = [chat_line(f"q{i}", q) for i, q in enumerate(QUESTIONS)]
    batch = await openai_batch(client, lines)
    states = await poll(client, batch.id, 4)
    direct = [await client.chat.completions.create(**line["body"]) for line in lines]
    outputs = await read_lines(client, states[-1].output_file_id)
    assert batch.status == "validating" and batch.id.startswith("batch_") and batch.expires_at == batch.created_at + 86400
    assert [s.status for s in states] == ["in_progress", "finalizing", "completed", "completed"]
    assert states[0].request_counts.total == 6 and 0 < states[0].request_counts.completed < 6
    done = states[-1]
    assert done.request_counts.model_dump() == {"total": 6, "completed": 6, "failed": 0}
    assert done.error_file_id is None and done.model == "gpt-4o-mini" and done.metadata == {"run": "test"}
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    ids = [line["custom_id"] for line in outputs]
    assert sorted(ids) == [f"q{i}" for i in range(6)] and ids != [f"q{i}" for i in range(6)]  # out of order
    by_id = {line["custom_id"]: line for line in outputs}
    for i, reply in enumerate(direct):
        line = by_id[f"q{i}"]
        assert line["id"].startswith("batch_req_") and line["error"] is None
        assert line["response"]["status_code"] == 200 and line["response"]["request_id"].startswith("req_")
        body = line["response"]["body"]
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"] == reply.choices[0].message.content
        assert body["usage"] == reply.usage.model_dump(exclude_none=True)
    assert done.usage.input_tokens == sum(r.usage.prompt_tokens for r in direct)
    assert done.usage.output_tokens == sum(r.usage.completion_tokens for r in direct)
    stats = server.stats
    assert stats.batch_requests == {"succeeded": 6}
    assert stats.batch_input_tokens == done.usage.input_tokens == stats.input_tokens
    assert stats.by_path["/v1/batches/{batch_id}"] == 4


async def test_openai_partial_failure_goes_to_the_error_file(oai):
    client, server = await oai(polls=1, fail_share=0.4)
    batch = await openai_batch(client, [chat_line(f"q{i}", q) for i, q in enumerate(QUESTIONS[:5])])
    done = (await poll(client, batch.id, 1))[0]
    outputs = await read_lines(client, done.output_file_id)
    errors = await read_lines(client, done.error_file_id)
    assert done.status == "completed" and done.request_counts.model_dump() == {"total": 5, "completed": 3, "failed": 2}
    assert len(outputs) == 3 and all(line["response"]["status_code"] == 200 for line in outputs)
    assert [line["response"]["status_code"] for line in errors] == [500, 500]
    assert all(line["response"]["body"]["error"]["type"] == "server_error" for line in errors)
    assert {line["custom_id"] for line in outputs + errors} == {f"q{i}" for i in range(5)}
    assert server.stats.batch_requests == {"succeeded": 3, "injected_500": 2}
    # A line the direct endpoint would refuse fails with the same 400 in the error file.
    client, server = await oai(polls=1)
    bad = {"custom_id": "bad", "method": "POST", "url": "/v1/chat/completions",
           "body": {"model": "gpt-4o-mini", "messages": []}}
    batch = await openai_batch(client, [chat_line("ok", "x"), bad])
    done = (await poll(client, batch.id, 1))[0]
    [line] = await read_lines(client, done.error_file_id)
    assert line["custom_id"] == "bad" and line["response"]["status_code"] == 400 and line["error"] is None
    assert line["response"]["body"]["error"]["param"] == "messages"
    assert server.stats.batch_requests == {"succeeded": 1, "errored_400": 1}


async def test_openai_all_failed_batch_completes_without_output_file(oai):
    client, _ = await oai(polls=1, fail_share=1.0)
    batch = await openai_batch(client, [chat_line(f"q{i}", q) for i, q in enumerate(QUESTIONS[:3])])
    done = (await poll(client, batch.id, 1))[0]
    assert done.status == "completed" and done.output_file_id is None and done.error_file_id
    assert done.request_counts.failed == 3 and len(await read_lines(client, done.error_file_id)) == 3


async def test_openai_validation_failure(oai):
    client, _ = await oai(polls=2)
    lines = [chat_line("a", "one"), b"{not json", chat_line("a", "two"), chat_line("b", "x", url="/v1/embeddings"),
             chat_line("c", "y", model="gpt-4o")]
    batch = await openai_batch(client, lines)
    failed = (await poll(client, batch.id, 2))
    assert [s.status for s in failed] == ["failed", "failed"] and failed[0].failed_at
    errors = [(e.code, e.line) for e in failed[0].errors.data]
    assert errors == [("invalid_json_line", 2), ("duplicate_custom_id", 3), ("url_mismatch", 4),
                      ("model_mismatch", 5)]
    assert failed[0].output_file_id is None and failed[0].request_counts.total == 0
    empty = await openai_batch(client, [])
    assert (await client.batches.retrieve(empty.id)).errors.data[0].code == "empty_file"
    with pytest.raises(openai.BadRequestError):
        await client.batches.create(input_file_id=empty.input_file_id, endpoint="/v1/completions",
                                    completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        await client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions",
                                    completion_window="24h")


async def test_openai_expiry_keeps_the_done_half(oai):
    client, _ = await oai(polls=2, expire_after=0.5)
    batch = await openai_batch(client, [chat_line(f"q{i}", q) for i, q in enumerate(QUESTIONS)])
    states = await poll(client, batch.id, 2)
    assert [s.status for s in states] == ["in_progress", "expired"] and states[-1].expired_at
    outputs = await read_lines(client, states[-1].output_file_id)
    errors = await read_lines(client, states[-1].error_file_id)
    assert len(outputs) == len(errors) == 3
    assert all(e["response"] is None and e["error"]["code"] == "batch_expired" for e in errors)
    assert {line["custom_id"] for line in outputs + errors} == {f"q{i}" for i in range(6)}


async def test_openai_cancel_keeps_what_was_done(oai):
    client, _ = await oai(polls=4)
    batch = await openai_batch(client, [chat_line(f"q{i}", q) for i, q in enumerate(QUESTIONS)])
    first = (await poll(client, batch.id, 1))[0]
    cancelling = await client.batches.cancel(batch.id)
    again = await client.batches.cancel(batch.id)
    cancelled = (await poll(client, batch.id, 2))
    assert first.status == "in_progress" and cancelling.status == again.status == "cancelling"
    assert cancelling.cancelling_at == again.cancelling_at
    assert [s.status for s in cancelled] == ["cancelled", "cancelled"] and cancelled[0].cancelled_at
    outputs = await read_lines(client, cancelled[0].output_file_id)
    assert len(outputs) == first.request_counts.completed == 2
    assert cancelled[0].request_counts.model_dump() == {"total": 6, "completed": 2, "failed": 0}
    with pytest.raises(openai.BadRequestError, match="status 'cancelled'"):
        await client.batches.cancel(batch.id)


async def test_openai_list_pages_newest_first_and_embeddings_batches(oai):
    client, _ = await oai(polls=1)
    made = [await openai_batch(client, [chat_line("a", "x")]) for _ in range(3)]
    embed = await openai_batch(client, [{"custom_id": "e1", "method": "POST", "url": "/v1/embeddings",
                                         "body": {"model": "text-embedding-3-small", "input": "a harbour"}}],
                               endpoint="/v1/embeddings")
    listed = [b.id async for b in client.batches.list(limit=2)]
    assert listed == [embed.id] + [b.id for b in reversed(made)]
    done = await client.batches.retrieve(embed.id)
    [line] = await read_lines(client, done.output_file_id)
    assert line["response"]["body"]["object"] == "list" and line["response"]["body"]["usage"]["prompt_tokens"] > 0
    info = await client.files.retrieve(done.output_file_id)
    assert info.purpose == "batch_output" and info.bytes > 0


# -- Anthropic ----------------------------------------------------------------------------------

def message_request(custom_id: str, question: str, **params) -> dict:
    return {"custom_id": custom_id, "params": {"model": "claude-sonnet-4", "max_tokens": 40,
                                               "messages": [{"role": "user", "content": question}], **params}}


async def test_anthropic_batch_ends_with_an_absolute_results_url_and_direct_replies(ant):
    client, server = await ant(polls=3)
    requests = [message_request(f"q{i}", q) for i, q in enumerate(QUESTIONS)]
    batch = await client.messages.batches.create(requests=requests)
    states = [await client.messages.batches.retrieve(batch.id) for _ in range(3)]
    results = [r async for r in await client.messages.batches.results(batch.id)]
    direct = [await client.messages.create(**r["params"]) for r in requests]
    assert batch.id.startswith("msgbatch_") and batch.processing_status == "in_progress"
    assert batch.request_counts.processing == 6 and batch.results_url is None
    assert [s.processing_status for s in states] == ["in_progress", "in_progress", "ended"]
    assert states[1].request_counts.processing == 6 and states[1].request_counts.succeeded == 0
    assert states[-1].request_counts.succeeded == 6 and states[-1].request_counts.processing == 0
    assert states[-1].results_url == f"{server.anthropic_base_url}/v1/messages/batches/{batch.id}/results"
    assert states[-1].ended_at is not None and states[-1].expires_at > states[-1].created_at
    ids = [r.custom_id for r in results]
    assert sorted(ids) == [f"q{i}" for i in range(6)] and ids != [f"q{i}" for i in range(6)]
    by_id = {r.custom_id: r.result for r in results}
    for i, message in enumerate(direct):
        result = by_id[f"q{i}"]
        assert result.type == "succeeded"
        assert result.message.content[0].text == message.content[0].text
        assert result.message.usage.input_tokens == message.usage.input_tokens
        assert result.message.usage.output_tokens == message.usage.output_tokens
        assert result.message.usage.service_tier == "batch"
    assert server.stats.batch_output_tokens == sum(m.usage.output_tokens for m in direct)


async def test_anthropic_partial_failure_and_invalid_params_are_errored(ant):
    client, server = await ant(polls=1, fail_share=0.25)
    batch = await client.messages.batches.create(requests=[message_request(f"q{i}", q)
                                                           for i, q in enumerate(QUESTIONS[:4])])
    ended = await client.messages.batches.retrieve(batch.id)
    results = [r.result async for r in await client.messages.batches.results(batch.id)]
    assert ended.request_counts.succeeded == 3 and ended.request_counts.errored == 1
    [errored] = [r for r in results if r.type == "errored"]
    assert errored.error.type == "error" and errored.error.error.type == "api_error"
    assert server.stats.batch_requests == {"succeeded": 3, "injected_500": 1}
    # Params are checked when processed: an invalid one is errored like the direct call's 400.
    client, _ = await ant(polls=1)
    no_max = {"custom_id": "no-max", "params": {"model": "c", "messages": [{"role": "user", "content": "x"}]}}
    batch = await client.messages.batches.create(requests=[message_request("ok", "x"), no_max])
    await client.messages.batches.retrieve(batch.id)
    results = {r.custom_id: r.result async for r in await client.messages.batches.results(batch.id)}
    assert results["ok"].type == "succeeded" and results["no-max"].type == "errored"
    assert results["no-max"].error.error.type == "invalid_request_error"
    assert "max_tokens" in results["no-max"].error.error.message


async def test_anthropic_expiry_and_cancel(ant):
    client, _ = await ant(polls=2, expire_after=0.5)
    batch = await client.messages.batches.create(requests=[message_request(f"q{i}", "x") for i in range(4)])
    [await client.messages.batches.retrieve(batch.id) for _ in range(2)]
    results = [r.result.type async for r in await client.messages.batches.results(batch.id)]
    assert sorted(results) == ["expired", "expired", "succeeded", "succeeded"]

    client, _ = await ant(polls=5)
    batch = await client.messages.batches.create(requests=[message_request(f"q{i}", "x") for i in range(4)])
    await client.messages.batches.retrieve(batch.id)  # one of four polls: a quarter done
    canceling = await client.messages.batches.cancel(batch.id)
    ended = await client.messages.batches.retrieve(batch.id)
    results = [r.result.type async for r in await client.messages.batches.results(batch.id)]
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at is not None
    assert ended.processing_status == "ended"
    assert ended.request_counts.canceled == 3 and ended.request_counts.succeeded == 1
    assert sorted(results) == ["canceled", "canceled", "canceled", "succeeded"]
    with pytest.raises(anthropic.BadRequestError):
        await client.messages.batches.cancel(batch.id)


async def test_anthropic_create_validates_custom_ids_and_results_wait_for_the_end(ant):
    client, _ = await ant(polls=2)
    with pytest.raises(anthropic.BadRequestError, match="Duplicate custom_id"):
        await client.messages.batches.create(requests=[message_request("a", "x"), message_request("a", "y")])
    with pytest.raises(anthropic.BadRequestError, match="pattern"):
        await client.messages.batches.create(requests=[message_request("has space", "x")])
    batch = await client.messages.batches.create(requests=[message_request("a" * 64, "x")])
    with pytest.raises(anthropic.AnthropicError, match="results_url"):
        await client.messages.batches.results(batch.id)  # its retrieve is the first poll: not ended yet
    with pytest.raises(anthropic.BadRequestError):
        await client.messages.batches.delete(batch.id)
    ended = await client.messages.batches.retrieve(batch.id)
    other = await client.messages.batches.create(requests=[message_request("b", "x")])
    listed = [b.id async for b in client.messages.batches.list(limit=1)]
    deleted = await client.messages.batches.delete(batch.id)
    assert ended.processing_status == "ended" and listed == [other.id, batch.id]
    assert deleted.type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.batches.retrieve(batch.id)
