"""The engine against real HTTP on loopback and a real SQLite cache.

Servers are engine.loopback.server instances speaking the OpenAI API; the
engine reaches them through the real OpenAI-format provider. Latencies are a
few ms and limits high enough that each test takes about a second. No test
asserts a time: what the limits allow is checked on the servers' side (their
429s, their count of calls in any second), the timing itself on a virtual
clock in tests/test_gate.py and tests/test_pacing.py.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from engine.config import Config, ConfigError
from engine.dispatch import shared_prefix
from engine.loopback.server import Faults, LoopbackServer, constant
from engine.requests import ChatRequest, Outcome
from engine.resolve import resolve
from engine.retry import RetryPolicy
from engine.scheduler import Engine
from providers.base import BAD_REPLY, BUDGET, OVERLOADED, PROMPT_TOO_LONG, ChatResult, Provider
from providers.kinds import ProviderKind, registry, set_registry

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["test-model", "x", "rec"]

FAST_RETRY = RetryPolicy(base=0.01, cap=0.05)


def make_config(*servers: LoopbackServer, model: Mapping[str, Any] | None = None, **endpoint: Any) -> Config:
    """One alias "m" served by every server given (replicas)."""
    endpoints = {f"lb{i}": {"kind": "openai", "base_url": s.openai_base_url, "max_concurrency": 8,
                            "timeout": 5.0, "max_attempts": 4, **endpoint}
                 for i, s in enumerate(servers)}
    alias = {"endpoints": list(endpoints), "model": "test-model",
             "params": {"temperature": 0.0, "max_tokens": 16}, **(model or {})}
    return Config.from_dicts(endpoints, {"m": alias})


def chat(i: int, text: str | None = None, **kwargs: Any) -> ChatRequest:
    return ChatRequest(model="m", messages=[{"role": "user", "content": text or f"question number {i}"}],
                       tag=i, **kwargs)


async def test_run_returns_input_order_and_rerun_is_served_by_the_cache(tmp_path):
    cache = tmp_path / "cache.sqlite"
    async with LoopbackServer(models=SERVED, latency=constant(0.002)) as server:
        config = make_config(server)
        async with Engine(config, cache_path=str(cache)) as engine:
            first = await engine.run([chat(i) for i in range(200)])
        assert [o.tag for o in first] == list(range(200))
        assert all(o.ok and not o.cached and o.attempts == 1 for o in first)
        assert server.stats.requests == 200
        assert engine.stats.calls == 200 and engine.stats.succeeded == 200

        async with Engine(config, cache_path=str(cache)) as engine:
            again = await engine.run(chat(i) for i in range(200))
        assert server.stats.requests == 200  # zero new calls
        assert all(o.cached for o in again)
        assert [o.text for o in again] == [o.text for o in first]
        assert engine.stats.cache_hits == 200 and engine.stats.calls == 0
        # A hit is built positionally (engine/requests.py cached_outcome): the same as by keywords.
        assert again[3] == Outcome(request=again[3].request, result=first[3].result, cached=True, key=first[3].key)
        assert again[3].key == resolve(config, again[3].request).key and again[3].attempts == 0


async def test_concurrency_never_exceeds_the_endpoint_limit():
    async with LoopbackServer(models=SERVED, latency=constant(0.02)) as server:
        async with Engine(make_config(server, max_concurrency=5)) as engine:
            outcomes = await engine.run([chat(i) for i in range(60)])
    assert all(o.ok for o in outcomes)
    assert server.stats.max_in_flight == 5


async def test_request_rate_limit_holds_without_429s():
    # Server and client both at 1200 RPM (20/s); the server allows a 0.6 s burst (12 calls: a call
    # sent up to half a second late still fits), so the 30 calls sent at once would meet 429s.
    async with LoopbackServer(models=SERVED, rpm=1200, burst_seconds=0.6) as server:
        async with Engine(make_config(server, rpm=1200, max_concurrency=32)) as engine:
            outcomes = await engine.run([chat(i) for i in range(30)])
    assert all(o.ok for o in outcomes)
    # The client throttled itself: the server (which refuses past its rate) saw
    # no call too many. (The pacing's timing: tests/test_gate.py, on a virtual clock.)
    assert server.stats.rate_limited == 0
    assert server.stats.max_accepted_in(1.0) <= 20 + 10 + 1  # rate x 1 s + client burst


async def test_input_token_limit_holds_and_is_corrected_from_usage():
    # ~100-token prompts under 60k input tokens/min (1,000/s): ten calls per second. The server's
    # bucket holds 0.6 s of it (600 tokens: a call sent up to half a second late still fits), so the
    # 15 calls (1,500 tokens) sent at once would meet 429s; paced, none.
    prompt = "word " * 80
    async with LoopbackServer(models=SERVED, input_tpm=60_000, burst_seconds=0.6) as server:
        config = make_config(server, input_tpm=60_000, max_concurrency=16)
        async with Engine(config) as engine:
            outcomes = await engine.run([chat(i, f"{i} {prompt}") for i in range(15)])
    assert all(o.ok for o in outcomes), [str(o.error) for o in outcomes if not o.ok]
    assert server.stats.rate_limited == 0
    assert server.stats.input_tokens >= 15 * 100


async def test_retry_after_is_honoured():
    # The server admits one request per quarter second (a bucket of one); the client has no limit
    # set, so the second call is answered 429 with retry-after-ms: 250 (and retry-after: 1, whole
    # seconds) and must wait it out: retried at once (FAST_RETRY's 0.01-0.05 s), it would meet several.
    async with LoopbackServer(models=SERVED, rpm=240, burst_seconds=0.25) as server:
        async with Engine(make_config(server), retry_policy=FAST_RETRY) as engine:
            outcomes = await engine.run([chat(0), chat(1)])
    assert all(o.ok for o in outcomes)
    assert server.stats.rate_limited >= 1
    assert engine.stats.rate_limited == server.stats.rate_limited
    # The call waited the server's retry-after (how long: tests/test_gate.py, on a
    # virtual clock): not a burst of retries, one or two 429s.
    assert server.stats.rate_limited <= 2


async def test_an_endpoint_without_a_set_rate_learns_the_servers_after_429s():
    # 3,000 RPM on the server, none in the client: concurrency alone cannot
    # slow 1 ms calls down, so the engine infers a request rate from the 429s.
    # The server's bucket holds half a second of it (25 calls): 150 calls overflow it.
    async with LoopbackServer(models=SERVED, rpm=3000, burst_seconds=0.5, latency=constant(0.001)) as server:
        async with Engine(make_config(server, max_concurrency=16, max_attempts=20)) as engine:
            outcomes = await engine.run([chat(i) for i in range(150)])
            limits = engine._endpoints["lb0"].gate.limits
    assert all(o.ok for o in outcomes)
    assert server.stats.rate_limited <= 80, server.stats.rate_limited  # unthrottled: hundreds
    # It paced itself by a request rate it inferred or the server reported (that
    # the rate neither collapses nor stalls after a 429 episode:
    # tests/test_pacing.py, on a virtual clock).
    assert limits.knows_request_limit()


async def test_injected_faults_lose_no_result():
    faults = Faults(schedule=["503", "529", "reset", "truncate", "stall", "500", "bad_json", "502", "504"],
                    stall_seconds=30)
    async with LoopbackServer(models=SERVED, faults=faults) as server:
        config = make_config(server, timeout=0.3, max_attempts=6, max_concurrency=4)
        async with Engine(config, retry_policy=FAST_RETRY) as engine:
            outcomes = await engine.run([chat(i) for i in range(30)])
    assert all(o.ok for o in outcomes), [str(o.error) for o in outcomes if not o.ok]
    assert sum(server.stats.faults.values()) == 9
    assert engine.stats.retries == 9
    assert sum(o.attempts for o in outcomes) == 30 + 9


async def test_a_request_that_always_fails_ends_with_its_error_and_others_complete():
    async with LoopbackServer(models=SERVED, context_tokens=100) as ok_server, \
            LoopbackServer(models=SERVED, faults=Faults(rates={"503": 1.0})) as broken:
        config = Config.from_dicts(
            {"lb0": {"kind": "openai", "base_url": ok_server.openai_base_url, "max_attempts": 3},
             "broken": {"kind": "openai", "base_url": broken.openai_base_url, "max_attempts": 3}},
            {"m": {"endpoint": "lb0", "model": "x", "params": {"max_tokens": 16}},
             "down": {"endpoint": "broken", "model": "x", "params": {"max_tokens": 16}}})
        requests = [chat(i) for i in range(10)]
        requests.append(chat(100, "long " * 1000))  # over the server's context: not retryable
        requests.append(ChatRequest(model="down", messages=[{"role": "user", "content": "hi"}], tag=200))
        async with Engine(config, retry_policy=FAST_RETRY) as engine:
            outcomes = {o.tag: o async for o in engine.stream(requests)}
    assert all(outcomes[i].ok for i in range(10))
    assert outcomes[100].error.kind == PROMPT_TOO_LONG and outcomes[100].attempts == 1
    assert outcomes[200].error.kind == OVERLOADED and outcomes[200].attempts == 3
    assert broken.stats.requests == 3
    with pytest.raises(Exception) as info:
        outcomes[200].text
    assert "overloaded" in str(info.value)
    assert engine.stats.errors == {PROMPT_TOO_LONG: 1, OVERLOADED: 1}


async def test_identical_requests_in_flight_are_sent_once():
    async with LoopbackServer(models=SERVED, latency=constant(0.05)) as server:
        async with Engine(make_config(server), window=64) as engine:  # all 20 pulled at once
            same = [chat(i, "the same question") for i in range(20)]
            outcomes = await engine.run(same)
    assert server.stats.requests == 1
    assert [o.tag for o in outcomes] == list(range(20))
    assert len({o.text for o in outcomes}) == 1 and all(o.ok for o in outcomes)
    assert sum(o.cost for o in outcomes) == 0.0 and engine.stats.deduplicated == 19
    assert outcomes[0].result is not outcomes[1].result  # each caller gets its own copy


async def test_run_accepts_the_same_request_object_twice():
    async with LoopbackServer(models=SERVED) as server:
        async with Engine(make_config(server)) as engine:
            once = chat(1)
            outcomes = await engine.run([once, chat(2), once])
    assert [o.tag for o in outcomes] == [1, 2, 1] and all(o.ok for o in outcomes)


async def test_replicas_share_the_load_and_each_keeps_its_limits():
    async with LoopbackServer(models=SERVED, rpm=1200, latency=constant(0.01)) as a, \
            LoopbackServer(models=SERVED, rpm=1200, latency=constant(0.01)) as b:
        async with Engine(make_config(a, b, rpm=1200, max_concurrency=3)) as engine:
            outcomes = await engine.run([chat(i) for i in range(60)])
    assert all(o.ok for o in outcomes)
    assert a.stats.requests >= 15 and b.stats.requests >= 15
    assert a.stats.requests + b.stats.requests == 60
    assert a.stats.rate_limited == b.stats.rate_limited == 0
    assert a.stats.max_in_flight <= 3 and b.stats.max_in_flight <= 3
    assert {o.endpoint for o in outcomes} == {"lb0", "lb1"}  # both served: the load was shared


async def test_requests_are_pulled_lazily_within_the_window():
    pulled = 0

    def requests():
        nonlocal pulled
        for i in range(10_000):
            pulled += 1
            yield ChatRequest(model="builtin:reader",
                              messages=[{"role": "user", "content": f"Context: Ann met Bob. Question {i}?"}], tag=i)

    window = 32
    yielded = 0
    most_ahead = 0
    async with Engine(Config.load(), window=window) as engine:
        async for outcome in engine.stream(requests()):
            assert outcome.ok
            most_ahead = max(most_ahead, pulled - yielded)
            yielded += 1
    assert yielded == pulled == 10_000
    assert most_ahead <= window


async def test_big_prompts_are_pulled_within_a_character_budget(monkeypatch):
    """A book in context per request: the engine holds a few, not the window's worth."""
    import engine.scheduler as scheduler

    monkeypatch.setattr(scheduler, "MAX_PENDING_CHARS", 2_500_000)
    book = "lorem ipsum " * 83_334  # ~1M characters
    pulled = yielded = most_ahead = 0

    def requests():
        nonlocal pulled
        for i in range(8):
            pulled += 1
            yield chat(i, f"{book}\nQuestion {i}?")

    async with LoopbackServer(models=SERVED) as server:
        async with Engine(make_config(server), window=32) as engine:
            async for outcome in engine.stream(requests()):
                assert outcome.ok
                most_ahead = max(most_ahead, pulled - yielded)
                yielded += 1
    assert yielded == 8 and most_ahead == 3


async def test_max_cost_stops_new_calls_but_cached_requests_still_yield(tmp_path):
    cache = str(tmp_path / "cache.sqlite")
    # $1 per million tokens each way: a call reserves ~(10 + 16) tokens = $0.000026.
    priced = {"price_in": 1.0, "price_out": 1.0}
    async with LoopbackServer(models=SERVED) as server:
        config = make_config(server, model=priced, max_concurrency=1)
        async with Engine(config, cache_path=cache) as engine:
            await engine.run([chat(i) for i in range(3)])  # cached for the rerun
        assert server.stats.requests == 3
        spent_per_call = engine.stats.cost / 3
        async with Engine(config, cache_path=cache, max_cost=spent_per_call * 4.5) as engine:
            outcomes = await engine.run([chat(i) for i in range(12)])
    cached = [o for o in outcomes if o.cached]
    sent = [o for o in outcomes if not o.cached and o.ok]
    refused = [o for o in outcomes if o.error is not None]
    assert len(cached) == 3
    assert 1 <= len(sent) <= 4 and engine.stats.cost <= spent_per_call * 4.5
    assert len(refused) == 12 - 3 - len(sent)
    assert all(o.error.kind == BUDGET and o.attempts == 0 for o in refused)
    assert server.stats.requests == 3 + len(sent)


# -- prefix ordering (local models) ------------------------------------------------------

class RecordingProvider(Provider):
    """An in-process provider that records the order of its calls and answers
    at once, marked as a llama.cpp-like prefix-reusing model."""

    kind = "recording"
    prefers_prefix_order = True
    calls: list[str] = []

    async def chat(self, model: str, messages: Sequence[Mapping[str, str]], *,
                   params: Mapping[str, Any], timeout: float) -> ChatResult:
        text = messages[-1]["content"]
        RecordingProvider.calls.append(text)
        await asyncio.sleep(0.001)
        if "explode" in text:
            raise ValueError("provider bug")
        return ChatResult(text=text[-8:], input_tokens=len(text) // 4, output_tokens=2)


@pytest.fixture
def recording():
    previous = set_registry(registry().with_kinds(ProviderKind("recording", f"{__name__}:RecordingProvider",
                                                               "records the calls it gets")))
    RecordingProvider.calls = []
    yield Config.from_dicts({"rec": {"kind": "recording", "max_concurrency": 4}},
                            {"r": {"endpoint": "rec", "model": "rec"}})
    set_registry(previous)


def test_shared_prefix_counts_characters_across_messages():
    book = "x" * 100_000
    assert shared_prefix(("user", book + "Q1"), ("user", book + "Q2")) == 4 + 100_001
    assert shared_prefix(("system", "a", "user", "b"), ("system", "a", "user", "c")) == 6 + 1 + 4
    assert shared_prefix(("user", "abc"), ("user", "abc")) == 7
    assert shared_prefix(("user", "abc"), ("system", "abc")) == 0


async def test_prefix_order_runs_requests_over_the_same_book_consecutively(recording):
    books = {name: f"BOOK {name} " + name * 5000 for name in "ABC"}
    # Interleaved, as a caller iterating over questions would produce them.
    requests = [ChatRequest(model="r", messages=[{"role": "user", "content": f"{books[b]}\nQuestion {q}"}],
                            tag=(b, q)) for q in range(5) for b in "ABC"]
    async with Engine(recording, window=64) as engine:
        outcomes = await engine.run(requests)
    assert all(o.ok for o in outcomes)
    order = [call[5] for call in RecordingProvider.calls]  # the book letter of each call
    switches = sum(1 for x, y in zip(order, order[1:]) if x != y)
    assert order[0] == "A" and switches == 2, order


async def test_a_provider_that_raises_a_non_provider_error_yields_bad_reply(recording):
    requests = [ChatRequest(model="r", messages=[{"role": "user", "content": t}], tag=t)
                for t in ("fine 1", "explode", "fine 2")]
    async with Engine(recording, retry_policy=FAST_RETRY) as engine:
        outcomes = {o.tag: o for o in await engine.run(requests)}
    assert outcomes["fine 1"].ok and outcomes["fine 2"].ok
    assert outcomes["explode"].error.kind == BAD_REPLY and "ValueError" in str(outcomes["explode"].error)
    assert outcomes["explode"].attempts == 6  # retried like any bad reply, then given up


# -- user errors --------------------------------------------------------------------

async def test_missing_api_key_stops_before_any_call(monkeypatch):
    monkeypatch.delenv("TULVING_TEST_KEY", raising=False)
    async with LoopbackServer(models=SERVED) as server:
        config = make_config(server, key_env="TULVING_TEST_KEY")
        async with Engine(config) as engine:
            with pytest.raises(ConfigError, match="TULVING_TEST_KEY"):
                await engine.run([chat(i) for i in range(5)])
    assert server.stats.requests == 0


async def test_unknown_model_is_a_config_error():
    async with Engine(Config.load()) as engine:
        with pytest.raises(ConfigError, match="unknown model 'nope'"):
            await engine.run([ChatRequest(model="nope", messages=[{"role": "user", "content": "hi"}])])


async def test_stopping_a_stream_early_cancels_its_calls():
    async with LoopbackServer(models=SERVED, latency=constant(0.2)) as server:
        async with Engine(make_config(server, max_concurrency=4)) as engine:
            async with contextlib.aclosing(engine.stream(chat(i) for i in range(100))) as outcomes:
                async for _ in outcomes:
                    break
            assert engine._inflight == {}
    assert server.stats.requests <= 16


async def test_pulling_waits_while_the_cache_writer_is_behind(tmp_path, monkeypatch):
    """A slow cache disk must not let prompts pile up in memory: once the
    writer's backlog is over the bound, no further request is pulled until it
    has caught up."""
    import cache.store as store
    import engine.scheduler as scheduler

    monkeypatch.setattr(scheduler, "MAX_CACHE_BACKLOG_CHARS", 20_000)
    real_commit = store.ResponseCache._commit

    def slow_commit(self, conn, rows):  # a slow disk: 50 ms per batch
        time.sleep(0.05)
        return real_commit(self, conn, rows)

    monkeypatch.setattr(store.ResponseCache, "_commit", slow_commit)
    text = "x" * 5_000
    pulled = 0
    worst = 0

    def requests():
        nonlocal pulled
        for i in range(60):
            pulled += 1
            yield ChatRequest("builtin:reader", [{"role": "user", "content": f"{text} question {i}?"}], tag=i)

    async with Engine(Config.load(), cache_path=str(tmp_path / "c.sqlite"), window=16) as engine:
        async for _ in engine.stream(requests()):
            worst = max(worst, engine._cache.backlog_chars)
    # Backlog can pass the bound by at most one pull (window requests), never grow without limit.
    assert pulled == 60
    assert worst <= 20_000 + 16 * 5_100, worst


async def test_prompts_waiting_for_the_cache_writer_share_the_pending_budget(tmp_path, monkeypatch):
    """Book-sized prompts answered but not yet stored are held in memory as
    much as those pulled ahead: with a writer that lags, the two together stay
    within MAX_PENDING_CHARS (plus the one request a pull may go over by)."""
    import cache.store as store
    import engine.scheduler as scheduler

    monkeypatch.setattr(scheduler, "MAX_PENDING_CHARS", 2_500_000)
    real_commit = store.ResponseCache._commit

    def slow_commit(self, conn, rows):  # a writer slower than the answers: 100 ms per batch
        time.sleep(0.1)
        return real_commit(self, conn, rows)

    monkeypatch.setattr(store.ResponseCache, "_commit", slow_commit)
    book = "lorem ipsum " * 83_334  # ~1M characters
    pulled = yielded = 0
    most_held = 0.0

    def requests():
        nonlocal pulled, most_held
        for i in range(12):
            held = pulled - yielded + engine._cache.backlog_chars / len(book)
            most_held = max(most_held, held)
            pulled += 1
            yield ChatRequest("builtin:reader", [{"role": "user", "content": f"{book}\nQuestion {i}?"}], tag=i)

    async with Engine(Config.load(), cache_path=str(tmp_path / "c.sqlite"), window=32) as engine:
        async for outcome in engine.stream(requests()):
            assert outcome.ok
            yielded += 1
    assert yielded == 12
    assert most_held <= 3.01, most_held  # 2.5 prompts' budget, the last pull going over by one


async def test_an_open_engine_raises_the_young_gc_threshold_and_closing_puts_it_back(tmp_path):
    import gc

    from engine.gc_tuning import YOUNG_THRESHOLD

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        config = Config.from_dicts({}, {})
        async with Engine(config) as first:
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
            async with Engine(config, cache_path=str(tmp_path / "c.sqlite")):
                assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)  # `first` is still open
        assert gc.get_threshold() == (700, 10, 10)
        assert first._closed

        # A cache that cannot be opened leaves nothing raised behind.
        (tmp_path / "not-a-cache.sqlite").write_text("plain text")
        with pytest.raises(Exception):
            async with Engine(config, cache_path=str(tmp_path / "not-a-cache.sqlite")):
                pass
        assert gc.get_threshold() == (700, 10, 10)

        # A threshold changed by the user while the engine ran is left as they set it.
        async with Engine(config):
            gc.set_threshold(500, 5, 5)
        assert gc.get_threshold() == (500, 5, 5)
    finally:
        gc.set_threshold(*before)
