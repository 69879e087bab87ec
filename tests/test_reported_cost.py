"""What a call costs: the provider's own figure first (OpenRouter `usage.cost`,
xAI's cost in ticks), billed tokens the provider reports outside the usual
field (xAI reasoning tokens), the price table as the estimate and the
cross-check; prices dated and tiered by prompt length; and no call counted
free because of the address it went to. Over HTTP on loopback where the wire
is the subject."""
from __future__ import annotations

import pytest

from engine.config import Config, ConfigError, default_tables
from engine.loopback.compat import reasoning_text
from engine.loopback.server import LoopbackServer
from engine.prices import disagrees
from engine.requests import ChatRequest
from engine.scheduler import Engine
from engine.spending import Spending, spending_lines

SHORT = [{"role": "system", "content": "You answer questions about a book."},
         {"role": "user", "content": "When did Ava meet Leo?"}]


def one_model(kind: str, url: str, **alias: object) -> Config:
    return Config.from_dicts({"ep": {"kind": kind, "base_url": url, "max_attempts": 1}},
                             {"m": {"endpoint": "ep", "model": "m", "params": {}, **alias}})


async def test_openrouter_usage_cost_is_what_is_counted_and_the_table_is_the_cross_check():
    async with LoopbackServer(models=["m"], compat="openrouter") as server:
        # The table says $5 / $5 per million; the loopback bills $1 per million (its usage.cost).
        config = one_model("openrouter", server.openai_base_url, price_in=5.0, price_out=5.0)
        async with Engine(config) as engine:
            outcomes = await engine.run([ChatRequest(model="m", messages=SHORT, draw=i) for i in range(3)])
    spending = Spending()
    for outcome in outcomes:
        result = outcome.result
        assert result is not None and result.reported_cost is not None
        billed = (result.input_tokens + result.output_tokens) * 1e-6
        assert result.reported_cost == pytest.approx(billed)
        assert outcome.cost == pytest.approx(billed)  # counted: the provider's figure, not the table's 5x
        spending.add("answer", config.alias("m"), outcome)
    [row] = spending.rows()
    assert row["spent_usd"] == pytest.approx(row["reported_usd"]) and row["table_usd"] == pytest.approx(
        5 * row["reported_usd"], rel=1e-3)
    said = [line for line in spending_lines(spending.rows()) if "reported" in line]
    assert len(said) == 1 and "they disagree" in said[0]


async def test_xai_reasoning_tokens_outside_completion_tokens_are_billed_output():
    async with LoopbackServer(models=["m"], compat="xai") as server:
        config = one_model("xai", server.openai_base_url, price_in=1.0, price_out=1.0)
        async with Engine(config) as engine:
            [outcome] = await engine.run([ChatRequest(model="m", messages=SHORT)])
    result = outcome.result
    assert result is not None
    hidden = server.count_tokens(reasoning_text({"messages": SHORT}))
    assert hidden > 0 and result.output_tokens == server.count_tokens(result.text) + hidden
    assert outcome.cost == pytest.approx((result.input_tokens + result.output_tokens) * 1e-6)  # ticks / 1e10


def test_a_call_is_priced_by_the_band_in_force_on_its_day_for_its_prompt():
    config = Config.load()
    sol = config.alias("gpt-6.1-sol")
    assert sol.cost(272_000, 0, day="2026-11-28") == pytest.approx(272_000 * 2.0 / 1e6)  # exactly 272K: standard
    assert sol.cost(272_001, 1000, day="2026-11-28") == pytest.approx((272_001 * 4.0 + 1000 * 15.0) / 1e6)
    flash = config.alias("gemini-flash")  # Google's half price until 2026-12-31
    assert flash.cost(1000, 1000, day="2026-12-31") == pytest.approx((750 + 3750) / 1e6)
    assert flash.cost(1000, 1000, day="2027-01-01") == pytest.approx((1500 + 7500) / 1e6)
    sonnet = config.alias("claude-sonnet-5-5")  # cache reads cut from $0.20 to $0.10 on 2026-10-07
    assert sonnet.cost(1000, 0, cache_read=1000, day="2026-10-06") == pytest.approx(0.20 / 1000)
    assert sonnet.cost(1000, 0, cache_read=1000, day="2026-10-07") == pytest.approx(0.10 / 1000)
    haiku = config.alias("claude-haiku-5-5")  # the whole call at the >100K rates
    assert haiku.cost(100_001, 10, batch=True) == pytest.approx((100_001 * 0.5 + 10 * 2.5) / 1e6 / 2)


def test_a_config_declares_bands_and_a_malformed_one_is_one_line():
    endpoints = {"ep": {"kind": "openai", "base_url": "https://example.invalid/v1"}}
    bands = [{"above": 1000, "price_in": 9.0}, {"until": "2020-01-01", "price_in": 0.5}]
    alias = Config.from_dicts(endpoints, {"m": {"endpoint": "ep", "model": "m", "price_in": 1.0, "price_out": 2.0,
                                                "prices": bands}}).alias("m")
    assert alias.cost(1001, 0) == pytest.approx(1001 * 9.0 / 1e6) and alias.cost(1000, 10) == pytest.approx(
        (1000 + 20) / 1e6)
    for bad, says in (([{"above": -1, "price_in": 1.0}], "above must be"), ([{"price_in": 1.0, "when": 1}], "when"),
                      ([{"above": 5}], "sets no price"), ("x", "must be a list"),
                      ([{"since": "2026-02-01", "until": "2026-01-01", "price_in": 1.0}], "is after")):
        with pytest.raises(ConfigError) as caught:
            Config.from_dicts(endpoints, {"m": {"endpoint": "ep", "model": "m", "price_in": 1.0, "prices": bad}})
        assert says in str(caught.value) and "\n" not in str(caught.value)


def test_no_model_is_free_for_its_address_only_by_its_kind_or_the_config():
    loop = {"kind": "openai", "base_url": "http://127.0.0.1:4000/v1"}
    endpoints, models = default_tables()
    config = Config.from_dicts({**endpoints, "proxy": loop, "mine": {**loop, "free": True}}, models)
    assert not config.is_free(config.alias("proxy/team-gpt"))  # a proxy's own name on localhost: asked about
    assert config.is_free(config.alias("mine/team-gpt"))  # the config says so, once, on the endpoint
    proxied = config.alias("proxy/gpt-5")  # OpenAI's name for gpt-5-2025-08-07, behind a local proxy
    assert proxied.priced and (proxied.price_in, proxied.model) == (1.25, "gpt-5")
    assert config.is_free(config.alias("builtin:reader")) and config.is_free(config.alias("local:smollm2"))


def test_the_tolerance_ignores_rounding_and_names_a_real_gap():
    assert not disagrees(0.00100, 0.00105) and not disagrees(0.00001, 0.00009)
    assert disagrees(0.0100, 0.0200)
