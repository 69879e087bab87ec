"""The official SDK clients accept the loopback server's replies: evidence that
it speaks the real OpenAI and Anthropic formats (and so that tests against it
test the providers against those formats)."""
from __future__ import annotations

import anthropic
import openai
import orjson
import pytest

from engine.loopback.server import Faults, LoopbackServer, default_reply, hashed_embedding
from providers.base import BAD_REQUEST, CONFIG, ProviderError
from providers.openai_finetune import submit_finetune

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["m", "c", "gpt-4o-mini", "claude-sonnet-4"]

KEY = "sk-loopback-test-key"
USER = [{"role": "user", "content": "Which events happened in Boston?"}]


def openai_client(server: LoopbackServer, key: str = KEY) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.openai_base_url, api_key=key, max_retries=0)


def anthropic_client(server: LoopbackServer, key: str = KEY) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=server.anthropic_base_url, api_key=key, max_retries=0)


async def test_openai_sdk_chat_completion():
    async with LoopbackServer(models=SERVED, api_keys=[KEY]) as server:
        client = openai_client(server)
        try:
            completion = await client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "system", "content": "Be brief."}, *USER],
                temperature=1.0, max_tokens=100, seed=1, stop=["\n\n"])
            raw = await client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=USER)
        finally:
            await client.close()
    choice = completion.choices[0]
    assert choice.message.content == default_reply("openai", {"messages": USER})
    assert choice.message.role == "assistant" and choice.finish_reason == "stop"
    assert completion.usage.prompt_tokens > 0 and completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens)
    assert completion.id.startswith("chatcmpl-") and raw.headers["x-request-id"].startswith("req_")


async def test_openai_sdk_embeddings_default_base64_and_float():
    texts = ["Maya met Sam", "a quiet harbour"]
    async with LoopbackServer(models=SERVED, embed_dim=24) as server:
        client = openai_client(server)
        try:
            default = await client.embeddings.create(model="text-embedding-3-small", input=texts)
            floats = await client.embeddings.create(model="text-embedding-3-small", input=texts,
                                                    encoding_format="float")
        finally:
            await client.close()
    for response in (default, floats):
        assert [item.index for item in response.data] == [0, 1]
        for item, text in zip(response.data, texts):
            assert item.embedding == pytest.approx(hashed_embedding(text, 24), abs=1e-6)
        assert response.usage.prompt_tokens > 0


async def test_anthropic_sdk_messages():
    async with LoopbackServer(models=SERVED, api_keys=[KEY]) as server:
        client = anthropic_client(server)
        try:
            message = await client.messages.create(model="claude-sonnet-4", max_tokens=3, system="Be brief.",
                                                   messages=USER)
            full = await client.messages.create(model="claude-sonnet-4", max_tokens=500, messages=USER,
                                                stop_sequences=["Boston"])
        finally:
            await client.close()
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens <= 3
    assert message.content[0].type == "text" and message.content[0].text
    assert full.stop_reason == "stop_sequence" and full.stop_sequence == "Boston"
    assert "Boston" not in full.content[0].text


async def test_429_surfaces_as_the_sdks_rate_limit_error_with_retry_after():
    async with LoopbackServer(models=SERVED, rpm=60) as server:
        oclient, aclient = openai_client(server), anthropic_client(server)
        try:
            await oclient.chat.completions.create(model="m", messages=USER)
            with pytest.raises(openai.RateLimitError) as openai_info:
                await oclient.chat.completions.create(model="m", messages=USER)
            with pytest.raises(anthropic.RateLimitError) as anthropic_info:
                await aclient.messages.create(model="c", max_tokens=10, messages=USER)
        finally:
            await oclient.close()
            await aclient.close()
    for info in (openai_info, anthropic_info):
        assert info.value.status_code == 429 and info.value.response.headers["retry-after"] == "1"
    assert openai_info.value.code == "rate_limit_exceeded"
    # refused by the per-second enforcement; the header reports the minute's budget (60 less 1 served)
    assert anthropic_info.value.response.headers["anthropic-ratelimit-requests-remaining"] == "59"


async def test_529_and_503_surface_as_the_sdks_server_errors():
    async with LoopbackServer(models=SERVED, faults=Faults(schedule=["529", "503"])) as server:
        aclient, oclient = anthropic_client(server), openai_client(server)
        try:
            with pytest.raises(anthropic.InternalServerError) as anthropic_info:
                await aclient.messages.create(model="c", max_tokens=10, messages=USER)
            with pytest.raises(openai.InternalServerError) as openai_info:
                await oclient.chat.completions.create(model="m", messages=USER)
        finally:
            await aclient.close()
            await oclient.close()
    assert isinstance(anthropic_info.value, anthropic.OverloadedError)
    assert anthropic_info.value.status_code == 529 and openai_info.value.status_code == 503


async def test_401_surfaces_as_the_sdks_authentication_error():
    async with LoopbackServer(models=SERVED, api_keys=[KEY]) as server:
        client = openai_client(server, key="sk-wrong")
        try:
            with pytest.raises(openai.AuthenticationError) as info:
                await client.chat.completions.create(model="m", messages=USER)
        finally:
            await client.close()
    assert info.value.code == "invalid_api_key"


def write_training_file(path, n: int):
    line = {"messages": [{"role": "user", "content": "When did Maya visit Boston?"},
                         {"role": "assistant", "content": "On March 3."}]}
    path.write_bytes(b"\n".join(orjson.dumps(line) for _ in range(n)) + b"\n")
    return path


async def test_finetune_flow_through_the_sdk(tmp_path):
    async with LoopbackServer(models=SERVED, api_keys=[KEY], finetune_polls=3) as server:
        result = await submit_finetune(base_url=server.openai_base_url, api_key=KEY,
                                       training_file=write_training_file(tmp_path / "train.jsonl", 12),
                                       model="gpt-4o-mini-2024-07-18", suffix="emb", poll_interval=0.01, timeout=10)
        assert server.stats.by_path["/v1/fine_tuning/jobs/{job_id}"] == 3
    assert result["status"] == "succeeded" and result["job_id"].startswith("ftjob-")
    assert result["fine_tuned_model"] == f"ft:gpt-4o-mini-2024-07-18:tulving:emb:{result['job_id']}"
    assert result["training_file"].startswith("file-")


async def test_failed_finetune_raises_with_the_jobs_message(tmp_path):
    async with LoopbackServer(models=SERVED, finetune_polls=1) as server:
        with pytest.raises(ProviderError) as info:
            await submit_finetune(base_url=server.openai_base_url, api_key=KEY,
                                  training_file=write_training_file(tmp_path / "small.jsonl", 4),
                                  model="gpt-4o-mini", suffix=None, poll_interval=0.01, timeout=10)
        with pytest.raises(ProviderError) as missing:
            await submit_finetune(base_url=server.openai_base_url, api_key=KEY, training_file=tmp_path / "none.jsonl",
                                  model="gpt-4o-mini", suffix=None, poll_interval=0.01, timeout=10)
    assert info.value.kind == BAD_REQUEST and "at least 10 examples" in str(info.value)
    assert missing.value.kind == CONFIG


async def test_finetune_upload_rejected_by_auth_is_classified(tmp_path):
    async with LoopbackServer(models=SERVED, api_keys=["sk-other"]) as server:
        with pytest.raises(ProviderError) as info:
            await submit_finetune(base_url=server.openai_base_url, api_key=KEY,
                                  training_file=write_training_file(tmp_path / "t.jsonl", 10),
                                  model="gpt-4o-mini", suffix=None, poll_interval=0.01, timeout=10)
    assert info.value.kind == "auth" and KEY not in str(info.value)
