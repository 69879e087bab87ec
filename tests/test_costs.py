"""Prices and spending: ModelAlias.cost with prompt-cache reads and writes and
the batch discount, the budget's worst case and settlement, the default
prices and their validation, the providers' usage parsing, the cache keeping
the prompt-cache counts, and the engine's accounting equal to hand-computed
dollars on the loopback server."""
from __future__ import annotations

import pytest

from engine.benchmark.evaluation import answers as A
from engine.budget import Budget, worst_case
from engine.config import Config, ConfigError, ModelAlias
from engine.loopback.server import LoopbackServer, cheap_tokens, constant
from engine.requests import ChatRequest
from engine.scheduler import Engine
from providers.anthropic_http import AnthropicProvider
from providers.base import BUDGET, ChatResult, EndpointSpec
from providers.openai_http import OpenAIProvider

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["mm"]

SONNET = dict(price_in=3.0, price_cached_in=0.3, price_cache_write=3.75, price_out=15.0, batch_discount=0.5)


def alias(**prices) -> ModelAlias:
    return ModelAlias(name="m", endpoints=("e",), model="m", **prices)


# -- ModelAlias.cost -------------------------------------------------------------------------

def test_cost_prices_cache_reads_writes_and_batches_by_hand():
    sonnet = alias(**SONNET)
    # 100,000 prompt tokens: 60,000 read, 30,000 written, 10,000 plain; 500 out.
    expected = (10_000 * 3.0 + 60_000 * 0.3 + 30_000 * 3.75 + 500 * 15.0) / 1e6
    assert sonnet.cost(100_000, 500, cache_read=60_000, cache_write=30_000) == pytest.approx(expected)
    assert expected == pytest.approx(0.168)
    assert sonnet.cost(100_000, 500, cache_read=60_000, cache_write=30_000, batch=True) == pytest.approx(0.084)
    assert sonnet.cost(100_000, 500) == pytest.approx(0.3075)
    # No cache prices set: cached tokens cost the plain input price.
    plain = alias(price_in=2.0, price_out=8.0)
    assert plain.cost(1000, 10, cache_read=900) == plain.cost(1000, 10) == pytest.approx(0.00208)
    assert alias().cost(10**6, 10**6) == 0.0


def test_the_default_prices_of_the_built_in_aliases():
    config = Config.load(None)
    gpt4o, sonnet, mini = config.alias("gpt-4o"), config.alias("claude-3-5-sonnet"), config.alias("gpt-4o-mini")
    assert (gpt4o.price_in, gpt4o.price_cached_in, gpt4o.price_out, gpt4o.batch_discount) == (2.5, 1.25, 10.0, 0.5)
    assert gpt4o.price_cache_write is None  # OpenAI charges no cache write
    assert (sonnet.price_in, sonnet.price_cached_in, sonnet.price_cache_write, sonnet.price_out) == (3.0, 0.3, 3.75, 15.0)
    assert mini.price_cached_in == mini.price_in / 2
    for name in ("gpt-4o", "gpt-4o-mini", "o3-mini", "claude-3-5-sonnet", "claude-sonnet-4", "text-embedding-3-small"):
        a = config.alias(name)
        assert a.price_in and 0 < a.batch_discount <= 1
        assert a.price_cached_in is None or a.price_cached_in < a.price_in


def test_prices_are_overridable_in_the_config(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[models.gpt-4o]\nendpoint = "openai"\nmodel = "gpt-4o-2024-08-06"\nprice_in = 1.0\n'
                    'price_cached_in = 0.1\nprice_out = 2.0\nbatch_discount = 1\n')
    gpt4o = Config.load(path).alias("gpt-4o")
    assert (gpt4o.price_in, gpt4o.price_cached_in, gpt4o.price_out, gpt4o.batch_discount) == (1.0, 0.1, 2.0, 1.0)
    assert gpt4o.cost(10**6, 0, batch=True) == 1.0


@pytest.mark.parametrize("key,value,message", [
    ("batch_discount", 0, "in \\(0, 1\\]"), ("batch_discount", 1.5, "in \\(0, 1\\]"),
    ("batch_discount", -0.5, "in \\(0, 1\\]"), ("batch_discount", "half", "in \\(0, 1\\]"),
    ("batch_discount", float("nan"), "in \\(0, 1\\]"), ("price_cached_in", -1, ">= 0"),
    ("price_cache_write", "x", ">= 0"), ("price_in", float("inf"), ">= 0"), ("price_out", True, ">= 0"),
])
def test_bad_prices_are_refused_at_load(key, value, message):
    with pytest.raises(ConfigError, match=f"{key} must be .*{message}"):
        Config.from_dicts({"e": {"kind": "openai"}}, {"m": {"endpoint": "e", "model": "x", key: value}})


# -- the budget -----------------------------------------------------------------------------

def test_the_worst_case_prices_every_prompt_token_at_the_dearest_input_price():
    sonnet = alias(**SONNET)
    assert worst_case(sonnet, 1000, 100) == pytest.approx((1000 * 3.75 + 100 * 15.0) / 1e6)
    gpt = alias(price_in=2.5, price_cached_in=1.25, price_out=10.0)
    assert worst_case(gpt, 1000, 100) == pytest.approx((1000 * 2.5 + 100 * 10.0) / 1e6)
    assert worst_case(gpt, 1000, 100, batch=True) == pytest.approx((1000 * 2.5 + 100 * 10.0) / 2e6)


def test_budget_reserves_the_worst_case_and_settles_what_the_reply_used():
    sonnet = alias(**SONNET)
    budget = Budget(max_cost=0.01)
    assert budget.admit(sonnet, 1000, 100) is None
    held = budget.reserve(sonnet, 1000, 100)
    assert budget.reserved == pytest.approx(0.00525)
    refusal = budget.admit(sonnet, 1000, 100)  # 0.00525 held + 0.00525 > 0.01
    assert refusal is not None and refusal.kind == BUDGET
    result = ChatResult(text="x", input_tokens=1000, output_tokens=10, cache_read_tokens=900)
    cost = budget.settle(held, sonnet, result)
    assert cost == pytest.approx((100 * 3.0 + 900 * 0.3 + 10 * 15.0) / 1e6)
    assert budget.spent == pytest.approx(cost) and budget.reserved == pytest.approx(0.0)
    assert budget.settle(budget.reserve(sonnet, 10, 1, batch=True), sonnet, result, batch=True) == pytest.approx(cost / 2)
    assert budget.settle(budget.reserve(sonnet, 10, 1), sonnet, None) == 0.0
    assert budget.reserved == pytest.approx(0.0, abs=1e-12)


# -- the providers read the prompt-cache usage ---------------------------------------------------

def test_anthropic_usage_adds_cache_reads_and_writes_into_the_prompt():
    provider = AnthropicProvider(EndpointSpec(name="a", kind="anthropic"))
    result = provider.chat_result({"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                                   "usage": {"input_tokens": 12, "output_tokens": 3,
                                             "cache_creation_input_tokens": 1000, "cache_read_input_tokens": 0}},
                                  "r")
    assert (result.input_tokens, result.cache_write_tokens, result.cache_read_tokens) == (1012, 1000, 0)


def test_openai_usage_reads_cached_tokens():
    provider = OpenAIProvider(EndpointSpec(name="o", kind="openai"))
    result = provider.chat_result({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 2000, "completion_tokens": 3,
                                             "prompt_tokens_details": {"cached_tokens": 1920}}}, "r")
    assert (result.input_tokens, result.cache_read_tokens, result.cache_write_tokens) == (2000, 1920, 0)


def test_openai_usage_reads_cache_writes_and_an_alias_with_a_write_price_pays_them():
    provider = OpenAIProvider(EndpointSpec(name="o", kind="openai"))
    result = provider.chat_result({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}],
                                   "usage": {"prompt_tokens": 2000, "completion_tokens": 3,
                                             "prompt_tokens_details": {"cached_tokens": 0,
                                                                       "cache_write_tokens": 1920}}}, "r")
    assert (result.input_tokens, result.cache_read_tokens, result.cache_write_tokens) == (2000, 0, 1920)
    alias = Config.from_dicts({"e": {"kind": "openai"}}, {"m": {"endpoint": "e", "model": "x", "price_in": 1.0,
                                                               "price_cache_write": 2.0, "price_out": 0.0}}).alias("m")
    cost = alias.cost(result.input_tokens, result.output_tokens, cache_read=result.cache_read_tokens,
                      cache_write=result.cache_write_tokens)
    assert cost == pytest.approx((80 * 1.0 + 1920 * 2.0) / 1e6)


# -- the engine's accounting, by hand, on the loopback server ----------------------------------

def priced_config(server: LoopbackServer, kind: str, **prices) -> Config:
    base = server.anthropic_base_url if kind == "anthropic" else server.openai_base_url
    return Config.from_dicts({"e": {"kind": kind, "base_url": base, "max_concurrency": 8}},
                             {"m": {"endpoint": "e", "model": "mm", "params": {"max_tokens": 20}, **prices}})


async def test_spending_equals_hand_computed_dollars_and_the_cache_keeps_the_counts(tmp_path, short_book,
                                                                                    short_questions):
    questions = short_questions[:4]
    requests = list(A.answer_requests(questions, model="m", mode=A.IN_CONTEXT, book=short_book))
    cache = str(tmp_path / "c.sqlite")
    async with LoopbackServer(in_process=True, models=SERVED, reply=lambda api, body: "seven words make up this reply here",
                              latency=constant(0.02)) as server:
        async with Engine(priced_config(server, "anthropic", **SONNET), cache_path=cache) as engine:
            outcomes = await engine.run(requests)
        stats = server.stats
    # By hand from what the server counted: one write of the prefix, three reads.
    system = A.SYSTEM_PROMPT
    prefix = cheap_tokens(system + " " + requests[0].messages[1]["content"][:requests[0].prefix_end[1]])
    output = cheap_tokens("seven words make up this reply here")
    plain = stats.input_tokens - stats.cache_write_tokens - stats.cache_read_tokens
    assert stats.cache_write_tokens == prefix and stats.cache_read_tokens == 3 * prefix
    by_hand = (plain * 3.0 + prefix * 3.75 + 3 * prefix * 0.3 + 4 * output * 15.0) / 1e6
    assert sum(o.cost for o in outcomes) == pytest.approx(by_hand, rel=1e-12)
    assert engine.stats.cost == pytest.approx(by_hand, rel=1e-12)
    without_caching = (stats.input_tokens * 3.0 + 4 * output * 15.0) / 1e6
    assert by_hand < 0.45 * without_caching  # the saving this buys on a 10k-token book
    # A rerun replays from the cache, prompt-cache counts included, and pays nothing.
    async with Engine(priced_config(server, "anthropic", **SONNET), cache_path=cache) as engine:
        again = await engine.run(requests)
    assert all(o.cached and o.cost == 0 for o in again)
    assert [(o.result.cache_read_tokens, o.result.cache_write_tokens) for o in again] == [
        (o.result.cache_read_tokens, o.result.cache_write_tokens) for o in outcomes]


async def test_openai_cached_tokens_are_priced_at_the_cached_price(short_book, short_questions):
    requests = list(A.answer_requests(short_questions[:3], model="m", mode=A.IN_CONTEXT, book=short_book))
    gpt = dict(price_in=2.5, price_cached_in=1.25, price_out=10.0)
    async with LoopbackServer(in_process=True, models=SERVED, latency=constant(0.02)) as server:
        async with Engine(priced_config(server, "openai", **gpt)) as engine:
            outcomes = await engine.run(requests)
    for o in outcomes:
        r = o.result
        assert o.cost == pytest.approx(((r.input_tokens - r.cache_read_tokens) * 2.5 + r.cache_read_tokens * 1.25
                                        + r.output_tokens * 10.0) / 1e6)
    assert sum(1 for o in outcomes if o.result.cache_read_tokens) == 2


async def test_a_request_without_a_prefix_marker_is_not_held_back():
    async with LoopbackServer(in_process=True, models=SERVED, latency=constant(0.05)) as server:
        async with Engine(priced_config(server, "anthropic")) as engine:
            await engine.run([ChatRequest(model="m", messages=[{"role": "user", "content": "BOOK " * 3000 + str(i)}])
                              for i in range(4)])
            assert engine._warmup.held_total == 0
        assert server.stats.max_in_flight == 4


def test_a_call_refused_only_for_what_calls_in_flight_hold_waits_for_them():
    sonnet = alias(**SONNET)
    budget = Budget(max_cost=0.008)
    held = budget.reserve(sonnet, 1000, 100)  # 0.00525 held by a call in flight
    assert budget.admit(sonnet, 1000, 100) is not None
    assert budget.fits_after_inflight(sonnet, 1000, 100)  # 0 spent + 0.00525 <= 0.008: wait, do not refuse
    assert not budget.fits_after_inflight(sonnet, 3000, 100)  # 0.01275 > 0.008 whatever the call in flight costs

    class Waiter:
        woken = 0

        def wake(self) -> None:
            self.woken += 1

    waiter = Waiter()
    budget.wait_for_room(waiter)
    budget.settle(held, sonnet, ChatResult(text="x", input_tokens=1000, output_tokens=10, cache_read_tokens=1000))
    assert waiter.woken == 1 and budget.admit(sonnet, 1000, 100) is None
    budget.settle(budget.reserve(sonnet, 1, 1), sonnet, None)
    assert waiter.woken == 1  # woken once per wait
    assert not Budget().fits_after_inflight(sonnet, 1000, 100)  # no cap: nothing to wait for


async def test_spending_counts_a_joined_call_once_and_scales_the_saving_to_the_price_paid():
    from engine.requests import Outcome
    from engine.spending import Spending, caching_saving

    request = ChatRequest(model="m", messages=[{"role": "user", "content": "same prompt"}])
    async with LoopbackServer(in_process=True, models=SERVED, latency=constant(0.05)) as server:
        config = priced_config(server, "anthropic", **SONNET)
        async with Engine(config) as engine:
            outcomes = await engine.run([request, request])
        assert server.stats.requests == 1
    spending = Spending()
    for o in outcomes:
        spending.add("answer", config.alias("m"), o)
    [row] = spending.rows()
    assert (row["calls"], row["cached"]) == (2, 1)
    assert row["spent_usd"] == pytest.approx(sum(o.cost for o in outcomes), abs=1e-6) and row["spent_usd"] > 0
    assert row["input_tokens"] == next(o.result.input_tokens for o in outcomes if not o.joined)
    sonnet = alias(**SONNET)
    result = ChatResult(text="x", input_tokens=10_000, output_tokens=0, cache_read_tokens=9_000)
    direct = sonnet.cost(10_000, 0, cache_read=9_000)
    assert caching_saving(sonnet, result, direct) == pytest.approx(9_000 * (3.0 - 0.3) / 1e6)
    assert caching_saving(sonnet, result, direct / 2) == pytest.approx(9_000 * (3.0 - 0.3) / 2e6)  # by batch
    spending.add("judge", sonnet, Outcome(request=request, result=result, cost=direct))
    assert spending.rows()[1]["caching_saved_usd"] == pytest.approx(0.0243)
