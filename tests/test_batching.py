"""Batching behind the provider (engine/batching.py): the engine sees a
provider that holds its calls, not a batch dispatcher. Against the loopback
server in-process, real HTTP, the real cache file."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from engine.batching import BatchingProvider, Parking
from engine.budget import Budget
from engine.config import Config
from engine.loopback.batches import BatchKnobs
from engine.loopback.server import LoopbackServer
from engine.requests import ChatRequest
from engine.retry import RetryPolicy
from engine.scheduler import Engine
from providers.base import ChatResult
from tests.virtual_gate import make_job

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["test-model", "x"]

FAST_RETRY = RetryPolicy(base=0.01, cap=0.05)


def config(server: LoopbackServer, **endpoint: object) -> Config:
    return Config.from_dicts(
        {"lb": {"kind": "openai", "base_url": server.openai_base_url, "max_attempts": 3,
                "options": {"batch_poll": 0.01, "batch_poll_max": 0.02}, **endpoint},
         "plain": {"kind": "openai", "base_url": server.openai_base_url, "options": {"batch": False}}},
        {"m": {"endpoints": ["lb"], "model": "test-model", "params": {"max_tokens": 16},
               "price_in": 1000.0, "price_out": 2000.0},
         "p": {"endpoints": ["plain"], "model": "test-model"}})


def requests(n: int, model: str = "m") -> list[ChatRequest]:
    return [ChatRequest(model=model, messages=[{"role": "user", "content": f"question {i}"}], tag=i)
            for i in range(n)]


def lines_per_batch(server: LoopbackServer) -> list[int]:
    return sorted(len(e["run"].lines) for e in server.batches.openai.values())


async def test_the_engine_chooses_the_batching_provider_once_per_endpoint_from_the_kinds_batch_api(tmp_path):
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1)) as server:
        async with Engine(config(server), cache_path=str(tmp_path / "c.sqlite"), batch=True) as engine:
            outcomes = await engine.run(requests(2) + requests(1, "p"))
            providers = {name: ep.provider for name, ep in engine._endpoints.items()}
    assert all(o.ok for o in outcomes)
    assert isinstance(providers["lb"], BatchingProvider) and providers["lb"].holds_calls
    assert not isinstance(providers["plain"], BatchingProvider) and not providers["plain"].holds_calls
    assert server.stats.batch_requests == {"succeeded": 2} and server.stats.by_path["/v1/chat/completions"] == 1


async def test_calls_the_provider_holds_are_not_paced_by_the_endpoints_limits(tmp_path):
    """One request a minute, one at a time: paced like direct calls, ten
    calls would take ten minutes; held by the batching provider they go out
    together, in one batch."""
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1)) as server:
        async with Engine(config(server, rpm=1, max_concurrency=1), cache_path=str(tmp_path / "c.sqlite"),
                          batch=True, retry_policy=FAST_RETRY) as engine:
            outcomes = await asyncio.wait_for(engine.run(requests(10)), timeout=60)
        assert all(o.ok for o in outcomes) and lines_per_batch(server) == [10]


async def test_a_whole_round_past_the_pull_window_reaches_one_batch_and_leaves_nothing_parked(tmp_path):
    """The requests waiting on held calls (joined duplicates too) do not
    count in the engine's pull window of 4: all 30 distinct calls are in the
    one batch; once every call settled the parking is empty again."""
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1)) as server:
        async with Engine(config(server), cache_path=str(tmp_path / "c.sqlite"), batch=True, window=4) as engine:
            outcomes = await asyncio.wait_for(engine.run(requests(30) + requests(10)), timeout=120)
            parking = engine._batching.parking
            left = (parking.requests, parking.chars)
        assert all(o.ok for o in outcomes) and lines_per_batch(server) == [30]
        assert sum(o.joined for o in outcomes) == 10 and left == (0, 0)


def test_the_parking_counts_each_request_waiting_on_a_held_call_until_it_stops(monkeypatch):
    """The call record tells its holder (engine/call.py `CallHolder`) of every
    waiter: made with one, joined, left by a stream, settled."""
    parking = Parking()
    ask, again = ChatRequest(model="m", messages=[{"role": "user", "content": "abc"}]), \
        ChatRequest(model="m", messages=[{"role": "system", "content": "sys"}, {"role": "user", "content": "abcd"}])
    one, other = asyncio.Queue(), asyncio.Queue()
    job = make_job(held=True)
    direct = make_job()
    assert job.held and not direct.held
    job = dataclasses.replace(job, waiters=[(ask, one)], holder=parking)
    assert parking.room() == (1, 3)
    job.join(again, other)
    job.join(ask, one)
    assert parking.room() == (3, 3 + 7 + 3)
    assert job.leave(other) == 1 and parking.room() == (2, 6)
    assert len(job.take_waiters()) == 2 and parking.room() == (0, 0) and parking.chars == 0
    monkeypatch.setattr(Parking, "MAX_REQUESTS", 1)  # past its caps the room stops growing
    monkeypatch.setattr(Parking, "MAX_CHARS", 5)
    for _ in range(3):
        parking.waiting(again, 1)
    assert parking.room() == (1, 5)


async def test_a_result_that_came_by_batch_is_priced_at_the_batch_discount_by_itself(tmp_path):
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1)) as server:
        cfg = config(server)
        async with Engine(cfg, cache_path=str(tmp_path / "c.sqlite"), batch=True) as engine:
            (outcome,) = await engine.run(requests(1))
    result = outcome.result
    assert isinstance(result, ChatResult) and result.batched
    alias = cfg.alias("m")
    full = alias.cost(result.input_tokens, result.output_tokens)
    assert Budget().settle(0.0, alias, result) == pytest.approx(full * 0.5) == pytest.approx(outcome.cost)
    direct = ChatResult(text="x", input_tokens=result.input_tokens, output_tokens=result.output_tokens)
    assert Budget().settle(0.0, alias, direct) == pytest.approx(full)


async def test_a_call_whose_caller_left_before_its_batch_went_out_is_not_sent(tmp_path):
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1)) as server:
        async with Engine(config(server), cache_path=str(tmp_path / "c.sqlite"), batch=True) as engine:
            stream = engine.stream(requests(5))
            first = asyncio.ensure_future(stream.__anext__())
            while "lb" not in engine._endpoints or len(engine._endpoints["lb"].provider.lines) < 5:
                await asyncio.sleep(0)  # until the five calls wait in the batch being gathered
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            await stream.aclose()  # the stream ends: its calls are cancelled
            await asyncio.sleep(0.3)
            (kept,) = await engine.run(requests(1))
        assert kept.ok and lines_per_batch(server) == [1]


async def test_batch_mode_without_a_cache_says_a_killed_run_cannot_resume(tmp_path):
    async with LoopbackServer(models=SERVED, batch=BatchKnobs(polls=1)) as server:
        async with Engine(config(server), batch=True) as engine:
            outcomes = await engine.run(requests(3))
    assert all(o.ok for o in outcomes)
    assert any("without a cache" in n for n in engine.stats.notices) and engine.stats.batched_calls == 3


def test_batch_options_are_read_typed_and_a_bad_one_stops_the_config_load(tmp_path):
    from engine.batching_mode import batch_options
    from engine.config import ConfigError

    spec = Config.from_dicts({"lb": {"kind": "openai", "options": {"batch_poll": 2, "batch_poll_max": 1,
                                                                   "batch_queue_requests": 5}}},
                             {"m": {"endpoints": ["lb"], "model": "x"}}).endpoints["lb"]
    options = batch_options(spec)
    assert (options.poll_first, options.poll_max, options.queue_requests, options.queue_tokens) == (2.0, 2.0, 5, None)
    with pytest.raises(ConfigError, match="batch_poll must be a finite number, got 'soon'"):
        Config.from_dicts({"lb": {"kind": "openai", "options": {"batch_poll": "soon"}}},
                          {"m": {"endpoints": ["lb"], "model": "x"}})


async def test_the_ledger_forgets_a_harvested_key_only_once_the_cache_holds_its_result(tmp_path):
    from cache.batches import BatchLedger
    from cache.store import ResponseCache
    from providers.base import ChatResult

    path = tmp_path / "c.sqlite"
    async with ResponseCache(path) as cache:
        cache.put("a" * 64, {"op": "chat", "model": "m", "messages": []}, ChatResult(text="stored"))
    ledger = BatchLedger(path)
    await ledger.record("batch_1", endpoint="lb", kind="openai", base_url=None, model="m", state="completed",
                        keys=["a" * 64, "b" * 64])
    await ledger.settled_stored("batch_1", ["a" * 64, "b" * 64])
    assert await ledger.owing("lb", ["a" * 64, "b" * 64]) == {"b" * 64: "batch_1"}
    ledger.close()
