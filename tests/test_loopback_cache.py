"""Provider prompt caching on the loopback server, as each API reports it,
checked through the official SDKs (streamed and not)."""
from __future__ import annotations

import asyncio

import anthropic
import openai
import pytest

from engine.loopback.server import LoopbackServer, cheap_tokens, constant

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["m", "c", "gpt-4o", "gpt-4o-mini", "claude-sonnet-4"]

BOOK = "The harbour woke before the town did. " * 130   # 4940 chars: 1235 "cheap" tokens
QUESTION = [{"role": "user", "content": "Which events happened in Boston?"}]


def cached_system(text: str = BOOK, **control) -> list[dict]:
    return [{"type": "text", "text": "You answer questions about a book."},
            {"type": "text", "text": text, "cache_control": {"type": "ephemeral", **control}}]


def system_tokens(blocks: list[dict]) -> int:
    return cheap_tokens(" ".join(b["text"] for b in blocks))


@pytest.fixture
async def aclient_and_server():
    async with LoopbackServer(models=SERVED) as server:
        client = anthropic.AsyncAnthropic(base_url=server.anthropic_base_url, api_key="k", max_retries=0)
        try:
            yield client, server
        finally:
            await client.close()


async def test_anthropic_first_call_writes_the_prefix_later_calls_read_it(aclient_and_server):
    client, server = aclient_and_server
    system = cached_system()
    ask = lambda question, system=system: client.messages.create(  # noqa: E731
        model="claude-sonnet-4", max_tokens=50, system=system, messages=[{"role": "user", "content": question}])
    first = await ask("Which events happened in Boston?")
    second = await ask("Which events happened in Boston?")
    other = await ask("Who was at the harbour?")
    changed = await ask("Who was at the harbour?", cached_system(BOOK + "Epilogue."))
    prefix = system_tokens(system)
    assert prefix >= 1024
    assert (first.usage.cache_creation_input_tokens, first.usage.cache_read_input_tokens) == (prefix, 0)
    assert first.usage.cache_creation.ephemeral_5m_input_tokens == prefix
    assert first.usage.input_tokens == cheap_tokens("Which events happened in Boston?")
    assert (second.usage.cache_creation_input_tokens, second.usage.cache_read_input_tokens) == (0, prefix)
    assert second.usage.input_tokens == first.usage.input_tokens
    assert second.content[0].text == first.content[0].text
    assert other.usage.cache_read_input_tokens == prefix and other.usage.cache_creation_input_tokens == 0
    assert changed.usage.cache_read_input_tokens == 0 and changed.usage.cache_creation_input_tokens > prefix
    assert server.stats.cache_read_tokens == 2 * prefix
    assert server.stats.cache_write_tokens == prefix + changed.usage.cache_creation_input_tokens


async def test_anthropic_prefixes_below_the_minimum_are_not_cached():
    short = cached_system("A short system prompt. " * 10)
    for minimum, expected in ((1024, 0), (20, system_tokens(short))):
        async with LoopbackServer(models=SERVED, cache_min_tokens=minimum) as server:
            client = anthropic.AsyncAnthropic(base_url=server.anthropic_base_url, api_key="k", max_retries=0)
            try:
                first = await client.messages.create(model="c", max_tokens=20, system=short, messages=QUESTION)
                second = await client.messages.create(model="c", max_tokens=20, system=short, messages=QUESTION)
            finally:
                await client.close()
        assert first.usage.cache_creation_input_tokens == expected
        assert second.usage.cache_read_input_tokens == expected
        assert first.usage.input_tokens + first.usage.cache_creation_input_tokens == (
            second.usage.input_tokens + second.usage.cache_read_input_tokens)


async def test_anthropic_cache_expires_after_its_ttl_and_a_hit_refreshes_it(aclient_and_server):
    client, server = aclient_and_server
    now = [1000.0]
    server.prompt_cache.clock = lambda: now[0]
    system, hour = cached_system(), cached_system(BOOK + "Appendix.", ttl="1h")
    call = lambda s: client.messages.create(model="c", max_tokens=20, system=s, messages=QUESTION)  # noqa: E731
    assert (await call(system)).usage.cache_creation_input_tokens > 0
    now[0] += 240
    assert (await call(system)).usage.cache_read_input_tokens > 0      # refreshed: lives 5 more minutes
    now[0] += 240
    assert (await call(system)).usage.cache_read_input_tokens > 0
    now[0] += 301
    expired = await call(system)
    assert expired.usage.cache_read_input_tokens == 0 and expired.usage.cache_creation_input_tokens > 0
    written = await call(hour)
    now[0] += 3000
    assert written.usage.cache_creation.ephemeral_1h_input_tokens > 0
    assert (await call(hour)).usage.cache_read_input_tokens > 0


async def test_anthropic_conversation_reads_the_earlier_breakpoint_and_writes_the_rest(aclient_and_server):
    client, _ = aclient_and_server
    turn1 = [{"role": "user", "content": [{"type": "text", "text": BOOK, "cache_control": {"type": "ephemeral"}}]}]
    first = await client.messages.create(model="c", max_tokens=20, messages=turn1)
    turn2 = [{"role": "user", "content": [{"type": "text", "text": BOOK}]},  # marker moved on: lookback finds it
             {"role": "assistant", "content": "Noted."},
             {"role": "user", "content": [{"type": "text", "text": "Now a question about the harbour. " * 40,
                                           "cache_control": {"type": "ephemeral"}}]}]
    second = await client.messages.create(model="c", max_tokens=20, messages=turn2)
    assert first.usage.cache_creation_input_tokens == cheap_tokens(BOOK)
    assert second.usage.cache_read_input_tokens == cheap_tokens(BOOK)
    assert second.usage.cache_creation_input_tokens == cheap_tokens("Noted.") + cheap_tokens(
        "Now a question about the harbour. " * 40)
    assert second.usage.input_tokens == 0
    too_many = [{"role": "user", "content": [{"type": "text", "text": f"block {i}",
                                              "cache_control": {"type": "ephemeral"}} for i in range(5)]}]
    with pytest.raises(anthropic.BadRequestError, match="maximum of 4 blocks"):
        await client.messages.create(model="c", max_tokens=20, messages=too_many)


async def test_anthropic_cache_is_warm_only_after_the_first_reply_finished():
    async with LoopbackServer(models=SERVED, latency=constant(0.1)) as server:
        client = anthropic.AsyncAnthropic(base_url=server.anthropic_base_url, api_key="k", max_retries=0)
        try:
            call = lambda: client.messages.create(model="c", max_tokens=20, system=cached_system(),  # noqa: E731
                                                  messages=QUESTION)
            together = await asyncio.gather(call(), call())
            after = await call()
        finally:
            await client.close()
    assert [m.usage.cache_creation_input_tokens > 0 for m in together] == [True, True]
    assert after.usage.cache_read_input_tokens > 0


async def test_anthropic_streamed_usage_reports_the_cache(aclient_and_server):
    client, _ = aclient_and_server
    await client.messages.create(model="c", max_tokens=20, system=cached_system(), messages=QUESTION)
    async with client.messages.stream(model="c", max_tokens=20, system=cached_system(), messages=QUESTION) as stream:
        start = None
        async for event in stream:
            if event.type == "message_start":
                start = event.message.usage
        final = await stream.get_final_message()
    prefix = system_tokens(cached_system())
    assert start.cache_read_input_tokens == final.usage.cache_read_input_tokens == prefix
    assert final.usage.cache_creation_input_tokens == 0


async def test_anthropic_input_token_limit_does_not_count_cache_reads():
    # A bucket of 1000 tokens refilling at 1000/s: the first call (1252 tokens) leaves a debt
    # of 252; a read of the prefix then costs only the uncached rest.
    async with LoopbackServer(models=SERVED, input_tpm=60_000) as server:
        client = anthropic.AsyncAnthropic(base_url=server.anthropic_base_url, api_key="k", max_retries=0)
        try:
            await client.messages.create(model="c", max_tokens=20, system=cached_system(), messages=QUESTION)
            await asyncio.sleep(1.4)  # full again
            raw = await client.messages.with_raw_response.create(model="c", max_tokens=20,
                                                                 system=cached_system(), messages=QUESTION)
        finally:
            await client.close()
    message = await raw.parse()
    remaining = int(raw.headers["anthropic-ratelimit-input-tokens-remaining"])
    assert message.usage.cache_read_input_tokens > 1000
    assert remaining >= 1000 - message.usage.input_tokens - 2  # charged only the uncached tokens


async def test_openai_caches_long_prompts_in_128_token_steps():
    async with LoopbackServer(models=SERVED) as server:
        client = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        try:
            call = lambda content, **kw: client.chat.completions.create(  # noqa: E731
                model="gpt-4o", messages=[{"role": "system", "content": BOOK}, {"role": "user", "content": content}],
                **kw)
            first = await call("Which events happened in Boston?")
            same = await call("Which events happened in Boston?")
            other = await call("Who was at the harbour?")
            streamed = [c async for c in await call("Who was at the harbour?", stream=True,
                                                    stream_options={"include_usage": True})]
            short = [await client.chat.completions.create(model="gpt-4o", messages=QUESTION) for _ in range(2)]
            other_model = await client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "system", "content": BOOK},
                                               {"role": "user", "content": "Which events happened in Boston?"}])
        finally:
            await client.close()
    total = cheap_tokens(BOOK) + cheap_tokens("Which events happened in Boston?")
    assert first.usage.prompt_tokens == same.usage.prompt_tokens == total
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert same.usage.prompt_tokens_details.cached_tokens == total // 128 * 128 == 1152
    assert other.usage.prompt_tokens_details.cached_tokens == cheap_tokens(BOOK) // 128 * 128
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == other.usage.prompt_tokens_details.cached_tokens
    assert [r.usage.prompt_tokens_details.cached_tokens for r in short] == [0, 0]
    assert other_model.usage.prompt_tokens_details.cached_tokens == 0


async def test_openai_minimum_is_configurable():
    async with LoopbackServer(models=SERVED, cache_min_tokens=128) as server:
        client = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="k", max_retries=0)
        try:
            messages = [{"role": "user", "content": "word " * 120}]  # 150 tokens
            replies = [await client.chat.completions.create(model="m", messages=messages) for _ in range(2)]
        finally:
            await client.close()
    assert [r.usage.prompt_tokens_details.cached_tokens for r in replies] == [0, 128]


def test_the_cache_stays_within_its_entry_budget():
    from engine.loopback.prompt_cache import PromptCache
    now = [0.0]
    cache = PromptCache(min_tokens=4, ttl=10.0, clock=lambda: now[0], max_entries=100)
    body = lambda i: {"model": "m", "messages": [{"role": "user", "content": f"prompt {i:04d} " + "x" * 40}]}  # noqa: E731
    for i in range(300):
        cache.commit(cache.openai(body(i), cheap_tokens, 20))
    assert len(cache._expiry) <= 100
    hit = PromptCache(min_tokens=4, ttl=10.0, clock=lambda: now[0], max_entries=100)
    long = {"model": "m", "messages": [{"role": "user", "content": "y" * 2000}]}
    hit.commit(hit.openai(long, cheap_tokens, 500))
    for i in range(300):
        hit.commit(hit.openai(body(i), cheap_tokens, 20))
    assert hit.openai(long, cheap_tokens, 500).read == 0  # the oldest entries went first...
    hit.commit(hit.openai(long, cheap_tokens, 500))
    assert hit.openai(long, cheap_tokens, 500).read == 384  # ...and the newest stay: 500 tokens in 128-steps
