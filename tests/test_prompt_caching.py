"""Provider prompt caching end to end: the in-context prompts share the book
as a byte-identical prefix, the Anthropic body marks it with cache_control,
the engine warms each (model, prefix) with one call before fanning out, and
the loopback server (which reports cache reads and writes as each API does)
sees one cache write and reads after it."""
from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from engine.benchmark.evaluation import answers as A
from engine.config import Config
from engine.loopback.server import LoopbackServer, cheap_tokens, constant
from engine.requests import ChatRequest
from engine.scheduler import Engine
from engine.warmup import Warmup, marked, prefix_key
from providers.anthropic_http import messages_body
from providers.base import PREFIX_END

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["m", "o", "x", "model-m", "model-a", "model-b"]


def config(server: LoopbackServer, kind: str = "anthropic", models: tuple[str, ...] = ("m",),
           options: dict[str, Any] | None = None, **alias: Any) -> Config:
    base = server.anthropic_base_url if kind == "anthropic" else server.openai_base_url
    endpoint = {"kind": kind, "base_url": base, "max_concurrency": 16, "options": options or {}}
    return Config.from_dicts({"e": endpoint}, {name: {"endpoint": "e", "model": f"model-{name}",
                                                      "params": {"max_tokens": 20}, **alias} for name in models})


def in_context(book: Any, questions: Any, model: str = "m") -> list[ChatRequest]:
    return list(A.answer_requests(questions, model=model, mode=A.IN_CONTEXT, book=book))


# -- the prompt: book first, question last, prefix byte-identical ----------------------------

def test_in_context_prompts_share_the_book_as_their_prefix_and_end_with_the_question(short_book, short_questions):
    requests = in_context(short_book, short_questions[:5])
    ends = {r.prefix_end for r in requests}
    assert len(ends) == 1
    index, chars = ends.pop()
    assert requests[0].messages[index]["role"] == "user"
    prefixes = {r.messages[index]["content"][:chars] for r in requests}
    assert len(prefixes) == 1
    prefix = prefixes.pop()
    assert prefix.endswith("## Question:\n\n") and short_book.text in prefix
    for r, q in zip(requests, short_questions[:5]):
        assert r.messages[index]["content"][chars:].startswith(q.question)
    rag = list(A.answer_requests(short_questions[:1], model="m", mode=A.RAG_PARAGRAPH, book=short_book,
                                 chunks_for=lambda q: ["a chunk"]))
    assert rag[0].prefix_end is None


def test_the_marker_is_not_part_of_the_cache_key(short_book, short_questions):
    from dataclasses import replace

    from engine.resolve import resolve

    cfg = Config.from_dicts({"e": {"kind": "anthropic"}}, {"m": {"endpoint": "e", "model": "x"}})
    marked_request = in_context(short_book, short_questions[:1])[0]
    plain = replace(marked_request, prefix_end=None)
    assert resolve(cfg, marked_request).key == resolve(cfg, plain).key
    assert resolve(cfg, marked_request).prefix_end == marked_request.prefix_end
    assert all(set(m) == {"role", "content"} for m in resolve(cfg, marked_request).identity["messages"])


def test_a_reasoning_model_without_system_prompt_keeps_the_marker_on_the_user_turn():
    from engine.resolve import resolve

    cfg = Config.from_dicts({"e": {"kind": "openai"}}, {"o": {"endpoint": "e", "model": "o", "reasoning": True}})
    request = ChatRequest(model="o", messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "ab"}],
                          prefix_end=(1, 1))
    assert resolve(cfg, request).prefix_end == (0, 1)
    on_system = ChatRequest(model="o", messages=request.messages, prefix_end=(0, 1))
    assert resolve(cfg, on_system).prefix_end is None


# -- the Anthropic body --------------------------------------------------------------------

def test_the_anthropic_body_marks_the_block_ending_the_prefix():
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "BOOK. Question?"}]
    body = messages_body("c", marked(messages, (1, 5)), {"max_tokens": 5})
    assert body["system"] == "sys"
    assert body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "BOOK.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": " Question?"}]}]
    plain = messages_body("c", messages, {"max_tokens": 5})
    assert plain["messages"] == [{"role": "user", "content": "BOOK. Question?"}]  # unmarked: as before
    whole = messages_body("c", marked(messages, (1, 99)), {"max_tokens": 5})
    assert whole["messages"][0]["content"] == [{"type": "text", "text": "BOOK. Question?",
                                                "cache_control": {"type": "ephemeral"}}]
    system = messages_body("c", marked([{"role": "system", "content": "a"}, {"role": "system", "content": "bcd"},
                                        {"role": "user", "content": "q"}], (1, 2)), {})
    assert system["system"] == [{"type": "text", "text": "a\n\nbc", "cache_control": {"type": "ephemeral"}},
                                {"type": "text", "text": "d"}]
    assert system["messages"] == [{"role": "user", "content": "q"}]


# -- the engine against the loopback server ---------------------------------------------------

async def test_a_prefix_followed_by_only_whitespace_is_one_block_the_api_accepts():
    # The Messages API refuses a text block of only whitespace (400); the loopback refuses it too.
    import aiohttp

    async with LoopbackServer(models=SERVED, ttft=constant(0)) as server:
        url = server.anthropic_base_url + "/v1/messages"
        headers = {"anthropic-version": "2023-06-01", "x-api-key": "k"}
        refused = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "BOOK.", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "\n\n"}]}]}
        async with aiohttp.ClientSession() as session, session.post(url, json=refused, headers=headers) as reply:
            assert reply.status == 400 and "non-whitespace" in (await reply.json())["error"]["message"]
        refused["messages"][0]["content"][1]["text"] = ""
        async with aiohttp.ClientSession() as session, session.post(url, json=refused, headers=headers) as reply:
            assert reply.status == 400 and "must be non-empty" in (await reply.json())["error"]["message"]
        request = ChatRequest(model="m", messages=[{"role": "user", "content": "BOOK.\n\n"}], prefix_end=(0, 5))
        async with Engine(config(server), progress=False) as engine:
            [outcome] = await engine.run([request])
    assert outcome.ok, outcome.error
    body = messages_body("c", marked([{"role": "user", "content": "BOOK.\n\n"}], (0, 5)), {})
    assert body["messages"][0]["content"] == [{"type": "text", "text": "BOOK.\n\n", "cache_control": {"type": "ephemeral"}}]


async def test_anthropic_calls_write_the_book_once_and_read_it_after(short_book, short_questions):
    questions = short_questions[:6]
    bodies: list[dict] = []

    def reply(api: str, body: dict) -> str:
        bodies.append(body)
        return "an answer"

    async with LoopbackServer(models=SERVED, reply=reply, latency=constant(0.05)) as server:
        async with Engine(config(server)) as engine:
            outcomes = await engine.run(in_context(short_book, questions))
    assert all(o.ok for o in outcomes)
    user = bodies[0]["messages"][0]["content"]
    assert isinstance(user, list) and user[0]["cache_control"] == {"type": "ephemeral"}
    assert user[0]["text"].endswith("## Question:\n\n") and user[1]["text"].startswith(questions[0].question)
    prefix = cheap_tokens(bodies[0]["system"] + " " + user[0]["text"])  # what the server counts
    writes = [o.result.cache_write_tokens for o in outcomes]
    reads = [o.result.cache_read_tokens for o in outcomes]
    assert sorted(writes) == [0] * 5 + [prefix]  # the first call wrote the book...
    assert sorted(reads) == [0] + [prefix] * 5  # ...and every other call read it
    assert server.stats.cache_write_tokens == prefix and server.stats.cache_read_tokens == 5 * prefix
    # input_tokens counts the whole prompt, the cached parts included
    assert all(o.result.input_tokens > prefix for o in outcomes)


async def test_warming_makes_one_cache_write_per_model_and_prefix_for_concurrent_questions(short_book,
                                                                                          short_questions):
    questions = short_questions[:12]
    async with LoopbackServer(models=SERVED, latency=constant(0.05)) as server:
        async with Engine(config(server, models=("a", "b"))) as engine:
            outcomes = await engine.run(in_context(short_book, questions, "a") + in_context(short_book, questions, "b"))
        assert server.stats.max_in_flight > 2  # the other questions did go out together
    writes = [o for o in outcomes if o.result.cache_write_tokens]
    assert len(writes) == 2 and {o.request.model for o in writes} == {"a", "b"}
    assert sum(1 for o in outcomes if o.result.cache_read_tokens) == 2 * len(questions) - 2


async def test_without_warming_concurrent_first_calls_all_write(short_book, short_questions):
    # The control of the test above: the cache is warm only once a call has
    # finished, so calls sent together before that all pay for the write.
    questions = short_questions[:6]
    async with LoopbackServer(models=SERVED, latency=constant(0.05)) as server:
        async with Engine(config(server)) as engine:
            engine._warmup.hold = lambda job, key: False  # type: ignore[method-assign]
            outcomes = await engine.run(in_context(short_book, questions))
    assert sum(1 for o in outcomes if o.result.cache_write_tokens) > 1


async def test_prompt_cache_false_sends_no_marker_and_does_not_wait(short_book, short_questions):
    bodies: list[dict] = []

    def reply(api: str, body: dict) -> str:
        bodies.append(body)
        return "ok"

    async with LoopbackServer(models=SERVED, reply=reply, latency=constant(0.05)) as server:
        async with Engine(config(server, options={"prompt_cache": False})) as engine:
            outcomes = await engine.run(in_context(short_book, short_questions[:4]))
            assert engine._warmup.held_total == 0
        assert server.stats.max_in_flight == 4
    assert all(isinstance(b["messages"][0]["content"], str) for b in bodies)
    assert all(o.result.cache_write_tokens == 0 and o.result.cache_read_tokens == 0 for o in outcomes)


async def test_openai_gets_the_plain_messages_and_reads_its_automatic_cache(short_book, short_questions):
    bodies: list[dict] = []

    def reply(api: str, body: dict) -> str:
        bodies.append(body)
        return "ok"

    async with LoopbackServer(models=SERVED, reply=reply, latency=constant(0.05)) as server:
        async with Engine(config(server, kind="openai", options={"prompt_cache_key": True})) as engine:
            outcomes = await engine.run(in_context(short_book, short_questions[:5]))
    assert all(set(m) == {"role", "content"} for b in bodies for m in b["messages"])
    assert all(PREFIX_END not in m for b in bodies for m in b["messages"])
    keys = {b["prompt_cache_key"] for b in bodies}
    assert len(keys) == 1 and keys.pop().startswith("tulving-")
    reads = sorted(o.result.cache_read_tokens for o in outcomes)
    assert reads[0] == 0 and all(r > 2000 and r % 128 == 0 for r in reads[1:])


# -- Warmup on its own ----------------------------------------------------------------------

def test_a_failed_warming_call_hands_the_prefix_to_the_next_live_call():
    warmup = Warmup()
    assert warmup.hold("a", "k") is False
    assert warmup.hold("b", "k") and warmup.hold("c", "k") and warmup.hold("d", "k")
    assert warmup.finished("a", ok=False, alive=lambda j: j != "b") == ["c"]  # b was cancelled meanwhile
    assert warmup.waiting() == 1
    assert warmup.finished("c", ok=True) == ["d"]
    assert warmup.hold("e", "k") is False  # warm now: straight through
    assert warmup.finished("e", ok=True) == []


def test_prefix_keys_differ_by_model_and_by_prefix_only():
    m = [{"role": "user", "content": "BOOK question one"}]
    n = [{"role": "user", "content": "BOOK question two"}]
    assert prefix_key("x", m, (0, 5)) == prefix_key("x", n, (0, 5))
    assert prefix_key("x", m, (0, 5)) != prefix_key("y", m, (0, 5))
    assert prefix_key("x", m, (0, 5)) != prefix_key("x", [{"role": "user", "content": "BOOC question"}], (0, 5))


@pytest.mark.parametrize("bad", [{"prompt_cache": "yes"}, {"prompt_cache_key": 1}])
def test_prompt_cache_options_must_be_booleans(bad):
    from engine.config import ConfigError

    with pytest.raises(ConfigError, match="must be true or false"):
        Config.from_dicts({"e": {"kind": "openai", "options": bad}}, {})


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_a_warm_prefix_is_not_charged_to_anthropics_input_token_limit(short_book, short_questions, kind):
    # Anthropic does not count prompt-cache reads toward its input-tokens-per-
    # minute limit: once the book is warm, the other questions are charged only
    # their own tokens and go out together. OpenAI counts them: under the same
    # limit (four whole prompts per second, with the engine's send window about
    # 0.3 s apart) its calls go out one at a time, each answered (0.02 s) well
    # before the limit lets the next one go.
    questions = short_questions[:5]
    requests = in_context(short_book, questions)
    prompt_tokens = sum(len(m["content"]) // 4 + 1 for m in requests[0].messages)
    latency = 0.2 if kind == "anthropic" else 0.02  # Anthropic's warm calls overlap while answered
    async with LoopbackServer(models=SERVED, latency=constant(latency)) as server:
        cfg = config(server, kind=kind)
        cfg.endpoints["e"] = dataclasses.replace(cfg.endpoints["e"], input_tpm=4 * 60.0 * prompt_tokens)
        async with Engine(cfg) as engine:
            outcomes = await engine.run(requests)
        peak = server.stats.max_in_flight
    assert all(o.ok for o in outcomes)
    assert sum(1 for o in outcomes if o.result.cache_read_tokens) == len(questions) - 1
    if kind == "anthropic":
        assert peak >= 4, peak
    else:
        assert peak == 1, peak
