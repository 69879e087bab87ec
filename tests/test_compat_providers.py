"""The OpenAI-compatible services (kinds xai, deepseek, openrouter, azure-openai)
driven through the real engine and CLI against the loopback server started
with their quirks (`compat=`): request bodies against what the reference
(ahstat/episodic-memory-benchmark, epbench/src/models/models_wrapper.py)
sends, the DeepSeek long-prompt route to OpenRouter, reasoning kept beside the
answer and never judged, cache-hit and reasoning-token pricing, Azure's
api-key header, and `--batch` refused where there is no batch API."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from cache.codec import result_from_record
from engine.benchmark.builtin import judge as builtin_judge
from engine.benchmark.builtin import reader as builtin_reader
from engine.benchmark.evaluation.results import load_results
from engine.config import Config
from engine.loopback.compat import reasoning_text
from engine.loopback.server import LoopbackServer
from engine.requests import ChatRequest
from engine.resolve import resolve
from engine.scheduler import Engine
from engine.tokens import count_tokens
from providers.standard_kinds import DEEPSEEK, OPENROUTER, XAI

# the ids these tests send that the registry does not serve (made up, or DeepSeek's retired names
# the reference called): the loopback, like a real API, serves only the ids it is told besides those
SERVED = ["m", "deepseek-chat", "deepseek-reasoner", "my-gpt-deployment", "judge-model"]

REPO = Path(__file__).resolve().parent.parent
SYSTEM = {"role": "system", "content": "You are an expert in answering questions about a book."}
SHORT = [SYSTEM, {"role": "user", "content": "When did Ava meet Leo?"}]
# " x" is one cl100k token: the reference's switch is count_tokens(user_prompt) > 60000.
LONG_USER = " x" * 60_001
EDGE_USER = " x" * 60_000
REFERENCE_ROUTE = {"order": ["Fireworks"],
                   "ignore": ["Avian", "Novita", "DeepInfra", "Featherless", "DeepSeek", "Kluster", "Nebius",
                              "Together"]}


def shipped(kind_models: dict[str, Any], name: str, endpoint: str) -> dict[str, Any]:
    """A shipped alias's table, on a test endpoint, callable (its standing keys left out:
    the retired names are what the reference called, which this test reproduces)."""
    table = {k: v for k, v in kind_models[name].items() if k not in ("retired", "replacement")}
    return {**table, "endpoint": endpoint}


def compat_config(deepseek: LoopbackServer, openrouter: LoopbackServer) -> Config:
    endpoints = {"ds": {"kind": "deepseek", "base_url": deepseek.openai_base_url, "max_attempts": 1},
                 "or": {"kind": "openrouter", "base_url": openrouter.openai_base_url, "max_attempts": 1}}
    models = {name: shipped(dict(DEEPSEEK.default_models), name, "ds") for name in ("deepseek-v3", "deepseek-r1")}
    models.update({name: shipped(dict(OPENROUTER.default_models), name, "or")
                   for name in ("deepseek-v3-openrouter", "deepseek-r1-openrouter", "llama-3.1-405b")})
    return Config.from_dicts(endpoints, models)


def recorder(bodies: list[dict[str, Any]]) -> Any:
    def reply(api: str, body: dict[str, Any]) -> str:
        bodies.append(body)
        return "Ava met Leo on 12 May 2024."
    return reply


def chat(model: str, user: str, **kw: Any) -> ChatRequest:
    return ChatRequest(model=model, messages=[SYSTEM, {"role": "user", "content": user}], **kw)


# -- request bodies, as the reference sends them ---------------------------------------------

def test_the_long_prompt_counts_as_the_reference_counts_it():
    assert count_tokens(LONG_USER) == 60_001 and count_tokens(EDGE_USER) == 60_000


async def test_deepseek_goes_direct_up_to_60000_tokens_and_to_openrouter_above(tmp_path):
    ds_bodies: list[dict[str, Any]] = []
    or_bodies: list[dict[str, Any]] = []
    async with LoopbackServer(models=SERVED, reply=recorder(ds_bodies), compat="deepseek") as ds, \
            LoopbackServer(models=SERVED, reply=recorder(or_bodies), compat="openrouter") as orr:
        config = compat_config(ds, orr)
        requests = [chat("deepseek-v3", "When did Ava meet Leo?"), chat("deepseek-r1", EDGE_USER),
                    chat("deepseek-v3", LONG_USER), chat("deepseek-r1", LONG_USER)]
        async with Engine(config, cache_path=str(tmp_path / "c.sqlite")) as engine:
            outcomes = await engine.run(requests)
        assert all(o.ok for o in outcomes), [o.error for o in outcomes]
        # The bodies the reference's calls send (the SDK's stream=False is the API default,
        # which Tulving leaves out): no max_tokens, no temperature, the system message kept.
        assert ds_bodies == [
            {"model": "deepseek-chat", "messages": [SYSTEM, {"role": "user", "content": "When did Ava meet Leo?"}]},
            {"model": "deepseek-reasoner", "messages": [SYSTEM, {"role": "user", "content": EDGE_USER}]}]
        assert or_bodies == [
            {"model": "deepseek/deepseek-chat", "messages": [SYSTEM, {"role": "user", "content": LONG_USER}],
             "provider": REFERENCE_ROUTE, "include_reasoning": True},
            {"model": "deepseek/deepseek-r1", "messages": [SYSTEM, {"role": "user", "content": LONG_USER}],
             "provider": REFERENCE_ROUTE, "include_reasoning": True}]
        assert [o.endpoint for o in outcomes] == ["ds", "ds", "or", "or"]
        # Reasoning kept beside the answer: DeepSeek's reasoning_content, OpenRouter's reasoning.
        reasonings = [o.result.reasoning for o in outcomes]  # type: ignore[union-attr]
        assert reasonings == [None, reasoning_text(ds_bodies[1]), None, reasoning_text(or_bodies[1])]
        # The routed call's identity is its target alias's: a rerun hits the cache, reasoning included.
        assert resolve(config, requests[3]).alias.name == "deepseek-r1-openrouter"
        async with Engine(config, cache_path=str(tmp_path / "c.sqlite")) as engine:
            again = await engine.run(requests)
    assert all(o.cached for o in again) and len(ds_bodies) + len(or_bodies) == 4
    assert [o.result.reasoning for o in again] == reasonings  # type: ignore[union-attr]


def test_every_leaderboard_row_of_these_kinds_renders_the_reference_body():
    endpoints = {"xai": {"kind": "xai"}, "or": {"kind": "openrouter"}}
    models = {name: shipped(dict(XAI.default_models), name, "xai")
              for name in ("grok-4-fast-reasoning", "grok-4-fast-non-reasoning")}
    models["llama-3.1-405b"] = shipped(dict(OPENROUTER.default_models), "llama-3.1-405b", "or")
    config = Config.from_dicts(endpoints, models)
    for name, model, params in [("grok-4-fast-reasoning", "grok-4-fast-reasoning", {}),
                                ("grok-4-fast-non-reasoning", "grok-4-fast-non-reasoning", {}),
                                ("llama-3.1-405b", "meta-llama/llama-3.1-405b-instruct",
                                 {"provider": {"order": ["Fireworks"]}})]:
        resolved = resolve(config, ChatRequest(model=name, messages=SHORT))
        assert (resolved.alias.model, resolved.params, resolved.messages) == (model, params, SHORT)


# -- prices -----------------------------------------------------------------------------------

async def test_deepseek_cache_hits_are_priced_as_cache_reads_and_reasoning_tokens_once():
    book = "The book. " * 600  # a shared prefix the loopback's prompt cache keeps
    async with LoopbackServer(models=SERVED, compat="deepseek", cache_min_tokens=64) as ds, LoopbackServer(models=SERVED) as unused:
        config = compat_config(ds, unused)
        alias = config.alias("deepseek-r1")
        async with Engine(config) as engine:
            [first] = await engine.run([chat("deepseek-r1", book + "Question one?")])
            [second] = await engine.run([chat("deepseek-r1", book + "Question two?")])
    for outcome in (first, second):
        result = outcome.result
        assert result is not None and result.reasoning is not None
        # completion_tokens already holds the reasoning: the answer's tokens plus the reasoning's, once.
        assert result.output_tokens == ds.count_tokens(result.text) + ds.count_tokens(result.reasoning)
        assert outcome.cost == pytest.approx(alias.cost(result.input_tokens, result.output_tokens,
                                                        cache_read=result.cache_read_tokens))
    assert first.result.cache_read_tokens == 0  # type: ignore[union-attr]
    read = second.result.cache_read_tokens  # type: ignore[union-attr]
    assert read > 0  # DeepSeek's prompt_cache_hit_tokens, at price_cached_in
    plain = alias.cost(second.result.input_tokens, second.result.output_tokens)  # type: ignore[union-attr]
    assert second.cost == pytest.approx(plain - read * (0.55 - 0.14) / 1e6)


# -- OpenRouter's provider object, Azure's key header -----------------------------------------

async def test_openrouter_refuses_an_unknown_provider_field_and_the_engine_reports_it():
    async with LoopbackServer(models=SERVED, compat="openrouter") as orr:
        url = orr.openai_base_url + "/chat/completions"
        body = {"model": "deepseek/deepseek-r1", "messages": SHORT, "provider": {**REFERENCE_ROUTE, "orderr": []}}
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=body) as reply:
                assert reply.status == 400 and "orderr" in (await reply.json())["error"]["message"]
            async with session.post(url, json={**body, "provider": {"allow_fallbacks": "no"}}) as reply:
                assert reply.status == 400
            async with session.post(url, json={**body, "provider": REFERENCE_ROUTE}) as reply:
                assert reply.status == 200 and "cost" in (await reply.json())["usage"]
        config = Config.from_dicts({"or": {"kind": "openrouter", "base_url": orr.openai_base_url, "max_attempts": 1}},
                                   {"bad": {"endpoint": "or", "model": "m", "params": {"provider": {"oder": ["x"]}}}})
        async with Engine(config) as engine:
            [outcome] = await engine.run([ChatRequest(model="bad", messages=SHORT)])
    assert not outcome.ok and outcome.error is not None and outcome.error.kind == "bad_request"


async def test_azure_sends_the_key_in_the_api_key_header_to_the_v1_path(monkeypatch):
    bodies: list[dict[str, Any]] = []
    monkeypatch.setenv("TULVING_TEST_AZURE_KEY", "az-secret")
    async with LoopbackServer(models=SERVED, reply=recorder(bodies), compat="azure", api_keys=["az-secret"]) as az:
        base = f"http://127.0.0.1:{az.port}/openai/v1"
        config = Config.from_dicts(
            {"az": {"kind": "azure-openai", "base_url": base, "key_env": "TULVING_TEST_AZURE_KEY", "max_attempts": 1},
             "as-openai": {"kind": "openai", "base_url": base, "key_env": "TULVING_TEST_AZURE_KEY",
                           "max_attempts": 1}},
            {"dep": {"endpoint": "az", "model": "my-gpt-deployment", "params": {}},
             "bearer": {"endpoint": "as-openai", "model": "my-gpt-deployment", "params": {}}})
        async with Engine(config) as engine:
            ok, refused = await engine.run([ChatRequest(model="dep", messages=SHORT),
                                            ChatRequest(model="bearer", messages=SHORT)])
        assert az.stats.by_path["/openai/v1/chat/completions"] == 2
    assert ok.ok and bodies == [{"model": "my-gpt-deployment", "messages": SHORT}]
    assert not refused.ok and refused.error is not None and refused.error.kind == "auth"  # a bearer key is refused
    assert "az-secret" not in str(refused.error)


def test_the_cache_reads_old_records_without_reasoning():
    assert result_from_record({"text": "an answer"}).reasoning is None  # type: ignore[typeddict-item]
    assert result_from_record({"text": "a", "reasoning": "because"}).reasoning == "because"  # type: ignore[typeddict-item]


# -- the CLI ----------------------------------------------------------------------------------

def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("TULVING_CONFIG", None)
    e.pop("TULVING_CACHE", None)
    e["TULVING_TEST_KEY"] = "k"
    return e


def tulving(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", "--quiet", "--config", "tulving.toml", "--cache",
                           "cache.sqlite", *args], cwd=tmp_path, env=env(), capture_output=True, text=True,
                          timeout=300)


@contextmanager
def threaded(server: LoopbackServer) -> Iterator[LoopbackServer]:
    """The loopback served from a thread of its own, for a CLI run in a subprocess."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)


def write_config(tmp_path: Path, url: str, kind: str = "deepseek") -> None:
    (tmp_path / "tulving.toml").write_text(
        f'[endpoints.ds]\nkind = "{kind}"\nbase_url = "{url}"\nfree = true\nkey_env = "TULVING_TEST_KEY"\nmax_attempts = 2\n\n'
        '[endpoints.lb]\nkind = "openai"\nbase_url = "' + url + '"\nfree = true\nmax_attempts = 2\n\n'
        '[models.ds-r1]\nendpoint = "ds"\nmodel = "deepseek-reasoner"\nparams = {}\n'
        'price_in = 0.55\nprice_cached_in = 0.14\nprice_out = 2.19\n\n'
        '[models.lb-judge]\nendpoint = "lb"\nmodel = "judge-model"\nparams = { temperature = 0.0 }\n')


def test_batch_is_refused_at_start_for_a_kind_without_a_batch_api(tmp_path):
    write_config(tmp_path, "http://127.0.0.1:9/v1")
    run = tulving(tmp_path, "run", "--book", "synaptic-echoes-short", "--models", "ds-r1", "--modes", "in-context",
                  "--judge", "builtin:judge", "--sample", "2", "--batch", "--out", "out")
    assert run.returncode == 2
    [line] = run.stderr.strip().splitlines()
    assert line.endswith("--batch: ds-r1 is served by endpoint 'ds' of kind 'deepseek', which has no batch API: "
                         "run it without --batch"), line
    assert not (tmp_path / "out").exists()


def test_a_run_keeps_the_reasoning_in_the_results_and_never_shows_it_to_the_judge(tmp_path):
    judge_bodies: list[dict[str, Any]] = []

    def reply(api: str, body: dict[str, Any]) -> str:
        if body["model"] == "judge-model":
            judge_bodies.append(body)
            return builtin_judge.respond(body["messages"], {})
        return builtin_reader.respond(body["messages"], {})

    with threaded(LoopbackServer(models=SERVED, reply=reply, compat="deepseek")) as server:
        write_config(tmp_path, server.openai_base_url)
        run = tulving(tmp_path, "run", "--book", "synaptic-echoes-short", "--models", "ds-r1", "--modes",
                      "in-context", "--judge", "lb-judge", "--sample", "6", "--out", "out")
    assert run.returncode == 0, run.stderr
    records = load_results(tmp_path / "out" / "results.jsonl")
    assert len(records) == 6 and all(r.reasoning and r.reasoning.startswith("Thinking about") for r in records)
    lines = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert all(line["reasoning"] == r.reasoning for line, r in zip(lines, records))
    assert judge_bodies and not any("Thinking about" in json.dumps(b) for b in judge_bodies)
    assert all(r.judge_reply is not None and not r.judge_failed for r in records)


def test_the_documented_presets_load_and_route(tmp_path):
    text = (REPO / "docs" / "providers.md").read_text()
    section = text[text.index("## OpenAI-compatible services"):text.index("## Streaming")]
    (tmp_path / "presets.toml").write_text(section.split("```toml\n", 1)[1].split("```", 1)[0])
    config = Config.load(tmp_path / "presets.toml")  # over the defaults, as a user's file is read
    long = resolve(config, ChatRequest(model="deepseek-now", messages=[{"role": "user", "content": LONG_USER}]))
    assert (long.alias.name, long.endpoints[0].name) == ("deepseek-now-openrouter", "openrouter")
    short = resolve(config, ChatRequest(model="deepseek-now", messages=SHORT))
    assert (short.alias.name, short.endpoints[0].name) == ("deepseek-now", "deepseek")
    azure = resolve(config, ChatRequest(model="azure-gpt", messages=SHORT, max_tokens=5))
    assert azure.params == {"max_completion_tokens": 5} and azure.endpoints[0].kind == "azure-openai"
