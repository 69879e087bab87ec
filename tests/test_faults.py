"""Faults a provider can throw at the engine, through real HTTP on loopback
(tests/fault_server.py) and a real SQLite cache: no hang on any reply or any
exception in a call's life, no lost result, no call paid twice, 429 storms
survived with the slow-down undone when it does not help."""
from __future__ import annotations

import asyncio
import gc
import math
import os
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from engine.config import Config, ModelAlias
from engine.gate import Gate
from engine.loopback.server import Faults, LoopbackServer
from engine.pacing import RECOVERY_SECONDS, TRIAL_REPLIES
from engine.requests import ChatRequest
from engine.retry import RetryPolicy
from engine.scheduler import Engine
from providers.base import (
    AUTH,
    BAD_REPLY,
    CONNECTION,
    OVERLOADED,
    PROMPT_TOO_LONG,
    ChatResult,
    EndpointSpec,
    Provider,
    ProviderError,
)
from tests.cli import atulving
from tests.fault_server import FaultServer, answer_for
from tests.virtual_gate import make_gate, make_job, reply, too_many

FAST_RETRY = RetryPolicy(base=0.01, cap=0.05)
RUN_LIMIT = 600.0  # seconds: a hang guard only (a run of these takes a second or two, whatever the load)


def config_for(server: FaultServer, *, client: str = "pool", kind: str = "openai", **endpoint: Any) -> Config:
    base = server.openai_base_url if kind == "openai" else server.anthropic_base_url
    spec = {"kind": kind, "base_url": base, "max_concurrency": 8, "timeout": 5.0, "max_attempts": 6,
            "max_retry_after": 1.0, "options": {"http_client": client}, **endpoint}
    # Anthropic's current version (2026-10-21) takes no temperature: its calls send the limit only.
    params = {"max_tokens": 8} if kind == "anthropic" else {"temperature": 0.0, "max_tokens": 8}
    return Config.from_dicts({"f": spec}, {"m": {"endpoint": "f", "model": "fm", "price_in": 1.0, "price_out": 2.0,
                                                 "params": params}})


def requests(n: int, salt: str = "") -> list[ChatRequest]:
    return [ChatRequest(model="m", messages=[{"role": "user", "content": f"question {salt}{i}"}], tag=i)
            for i in range(n)]


def expected(request: ChatRequest) -> str:
    import json

    return answer_for(json.dumps([dict(m) for m in request.messages], sort_keys=True))


async def run_bounded(config: Config, reqs: list[ChatRequest], **engine: Any) -> tuple[list, Engine]:
    eng = Engine(config, retry_policy=engine.pop("retry_policy", FAST_RETRY), **engine)
    async with eng:
        outcomes = await asyncio.wait_for(eng.run(reqs), RUN_LIMIT)
    return outcomes, eng


# -- replies that used to hang or be silently accepted -----------------------------------------

@pytest.mark.parametrize("client", ["pool", "aiohttp"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_string_token_counts_are_a_bad_reply_not_a_hang(client, kind):
    with FaultServer({"str-tokens": 1.0}) as server:
        outcomes, engine = await run_bounded(config_for(server, client=client, kind=kind, max_attempts=2),
                                             requests(5))
    assert all(not o.ok and o.error.kind == BAD_REPLY for o in outcomes)
    assert all("not a token count" in str(o.error) for o in outcomes), [str(o.error) for o in outcomes]
    assert engine.stats.calls == 10  # each call tried twice, then final


@pytest.mark.parametrize("fault", ["str-tokens", "null-content", "list-content", "empty-content", "html-200",
                                   "truncated", "500", "529"])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_bad_replies_are_retried_and_every_answer_equals_the_fault_free_one(fault, kind, tmp_path):
    reqs = requests(30, salt=fault)
    with FaultServer({fault: 0.3}, seed=3) as server:
        outcomes, engine = await run_bounded(config_for(server, kind=kind), reqs,
                                             cache_path=str(tmp_path / "c.sqlite"))
        assert server.stats.by_kind[fault] > 0
        assert server.stats.paid_duplicates == 0
    assert [o.text for o in outcomes] == [expected(r) for r in reqs]  # 0 lost, none silently different


@pytest.mark.parametrize("fault,says", [("null-content", "content is null"), ("list-content", "not a string"),
                                        ("empty-content", "empty but counts 3 output tokens")])
async def test_a_content_that_is_never_right_is_a_final_bad_reply_saying_which(fault, says):
    with FaultServer({fault: 1.0}) as server:
        outcomes, _ = await run_bounded(config_for(server, max_attempts=2), requests(3))
    assert all(not o.ok and o.error.kind == BAD_REPLY and says in str(o.error) for o in outcomes), \
        [str(o.error) for o in outcomes]


# -- an exception at each step of a call's life -----------------------------------------------

def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected fault")


STEPS = [
    ("providers.openai_http.OpenAIProvider.chat", None),     # the provider call itself
    ("engine.dispatch.check_usage", None),                   # reading the reply's usage
    ("engine.config.ModelAlias.cost", None),                 # pricing the call
    ("engine.limiter.EndpointLimits.settle", None),          # refunding the token reservation
    ("engine.pacing.Pacing.on_reply", None),                 # counting the reply
    ("cache.store.result_to_record", None),                  # turning it into a cache record (cache/codec.py)
    ("cache.store.ResponseCache.put", None),                 # handing it to the cache
    ("engine.limiter.EndpointLimits.reserve", None),         # reserving capacity before the call
    ("engine.dispatch.EndpointState._launch", None),         # starting the call's task
    ("engine.pacing.Pacing.on_rate_limited", {"429": 0.5}),  # after a 429
    ("engine.gate.Gate.observe", {"503": 0.5}),              # the gate's verdict on an attempt
    ("engine.limiter.EndpointLimits.learn", {"429-reset": 0.5}),  # taking the limits a reply's headers report
    ("engine.retry.RetryPolicy.delay", {"503": 0.5}),        # planning the retry
    ("engine.dispatch.Pool.push", {"503": 0.5}),             # queueing the retry (and the first try)
    ("engine.scheduler.Engine._succeeded", None),            # everything after the reply at once
]


@pytest.mark.parametrize("target,faults", STEPS, ids=[s[0].rsplit(".", 2)[-2] + "." + s[0].rsplit(".", 1)[-1]
                                                       for s in STEPS])
async def test_an_exception_at_any_step_of_a_call_ends_the_run(target, faults, tmp_path, monkeypatch):
    monkeypatch.setattr(target, _boom)
    reqs = requests(12, salt=target)
    with FaultServer(faults or {}, seed=1) as server:
        config = config_for(server, rpm=60_000, input_tpm=10_000_000)  # limits on: reserve/settle run
        engine = Engine(config, cache_path=str(tmp_path / "c.sqlite"), retry_policy=FAST_RETRY)
        try:
            async with engine:
                outcomes = await asyncio.wait_for(engine.run(reqs), RUN_LIMIT)
        except TimeoutError:
            pytest.fail(f"the run hung with {target} raising")
        except RuntimeError as exc:  # raised out of the stream itself (e.g. queueing the first try): ended
            assert "injected fault" in str(exc)
            return
    assert len(outcomes) == 12 and all(o is not None for o in outcomes)
    assert all(o.ok or o.error is not None for o in outcomes)


async def test_a_broken_price_settles_calls_instead_of_hanging():
    # The schema refuses price_in = "abc" at load (test_bad_inputs); an alias
    # built around it must still not hang a run.
    with FaultServer() as server:
        config = config_for(server)
        alias = config.models["m"]
        config.models["m"] = ModelAlias(name="m", endpoints=alias.endpoints, model=alias.model, params=alias.params,
                                        price_in="abc", price_out=1.0)  # type: ignore[arg-type]
        outcomes, _ = await run_bounded(config, requests(4), max_cost=10.0)
    assert len(outcomes) == 4 and all(not o.ok and o.error.kind == BAD_REPLY for o in outcomes)


# -- 429 storms ------------------------------------------------------------------------------

@pytest.mark.parametrize("fault", ["429", "429-ms", "429-reset", "429-none"])
async def test_a_429_storm_completes_with_nothing_lost_or_paid_twice(fault, tmp_path):
    # Each 429 names a wait of 1 s in its own header (but 429-none): max_retry_after 0.1 caps it, so the
    # storm's rounds of retries take tenths of a second instead of seconds; every capped wait is counted,
    # which shows each header's 1 s was read (how long a call waits: tests/test_gate.py, virtual clock).
    reqs = requests(60, salt=fault)
    with FaultServer({fault: 0.3}, seed=2) as server:
        outcomes, engine = await run_bounded(config_for(server, rpm=6000, max_retry_after=0.1), reqs,
                                             cache_path=str(tmp_path / "c"), retry_policy=RetryPolicy())
        assert server.stats.by_kind[fault] >= 10
        assert server.stats.paid_duplicates == 0
    assert [o.text for o in outcomes] == [expected(r) for r in reqs]
    assert engine.stats.rate_limited == server.stats.by_kind[fault]
    named = 0 if fault == "429-none" else server.stats.by_kind[fault]
    assert engine.stats.retry_after_capped == named


async def test_a_huge_retry_after_is_capped_and_reported():
    # The endpoint's rate is known (the 429s' slow-down halves it, as tests/test_gate.py shows on a virtual
    # clock): unknown, the slow-down paced the retries a second apart, 13 s of sleeping for 20 calls. A cap
    # of 0.05 s: the retries wait the cap, not the day the server asked for, and the run takes a fraction of a second.
    with FaultServer({"429-huge": 0.3}, seed=4) as server:
        outcomes, engine = await run_bounded(config_for(server, max_retry_after=0.05, rpm=60_000), requests(20),
                                             retry_policy=RetryPolicy())
    assert all(o.ok for o in outcomes)
    assert engine.stats.retry_after_capped == server.stats.by_kind["429-huge"] > 0
    assert any("asked to wait 86,400 s" in n and "waiting 0.05 s instead" in n for n in engine.stats.notices)


def _endpoint(rpm: float | None = 600) -> Gate:
    return make_gate(rpm=rpm, max_concurrency=8)


def _replies(gate: Gate, pattern: list[bool], sent_at: float, now: float) -> None:
    for limited in pattern:
        reply(gate, make_job(rpm=600), now, error=too_many(retry_after=0.0) if limited else None, sent_at=sent_at)


def test_a_slow_down_that_does_not_lower_the_429_share_is_undone():
    ep = _endpoint()
    every_third = [i % 3 == 0 for i in range(30)]  # 33% of replies are 429s, whatever our rate
    _replies(ep, every_third[:12], sent_at=0.0, now=1.0)   # the first 429 slows down to half
    assert ep.pacing.factor(1.0) == 0.5
    _replies(ep, every_third, sent_at=2.0, now=3.0)        # same share at half speed: undone
    assert ep.pacing.reverted == 1 and ep.pacing.factor(3.0) == 1.0
    _replies(ep, every_third, sent_at=4.0, now=5.0)        # the same share again: no new slow-down
    assert ep.pacing.factor(5.0) == 1.0 and ep.pacing.paused_until <= 5.0


def test_a_slow_down_that_stops_the_429s_is_kept():
    ep = _endpoint()
    _replies(ep, [i % 3 == 0 for i in range(12)], sent_at=0.0, now=1.0)
    assert ep.pacing.factor(1.0) == 0.5
    _replies(ep, [False] * TRIAL_REPLIES, sent_at=2.0, now=3.0)  # slower, no 429 any more: our speed caused them
    assert ep.pacing.reverted == 0 and ep.pacing.factor(3.0) < 1.0
    assert math.isclose(ep.pacing.factor(3.0), 0.5 + (3.0 - 1.0) / RECOVERY_SECONDS)  # and it recovers as before


async def test_a_base_url_with_a_query_string_keeps_it_after_the_path():
    with FaultServer() as server:
        config = config_for(server, base_url=server.openai_base_url + "?api-version=2024-10-21")
        outcomes, _ = await run_bounded(config, requests(2, salt="query"))
    assert all(o.ok for o in outcomes), [str(o.error) for o in outcomes]


# -- a dead endpoint, through the engine with in-process providers -----------------------------

class Scripted(Provider):
    """A provider in process: answers, or fails every call with `fails` (a dead server)."""

    def __init__(self, spec: EndpointSpec, fails: ProviderError | None = None):
        super().__init__(spec)
        self.fails = fails
        self.calls = 0

    async def chat(self, model: str, messages: Sequence[Mapping[str, str]], *,
                   params: Mapping[str, object], timeout: float, stream: bool = False) -> ChatResult:
        self.calls += 1
        await asyncio.sleep(0)
        if self.fails is not None:
            raise ProviderError(self.fails.kind, self.fails.message, status=self.fails.status)
        return ChatResult(text=f"answer to {messages[-1]['content']}", input_tokens=3, output_tokens=2)


def _cli_env() -> dict[str, str]:
    """This process's environment without a config or cache of the user's."""
    return {k: v for k, v in os.environ.items() if k not in ("TULVING_CONFIG", "TULVING_CACHE")}


def _two_endpoints(monkeypatch, dead_error: ProviderError, replicas: bool = False) -> tuple[Config, dict]:
    providers: dict[str, Scripted] = {}

    def make(spec: EndpointSpec, key: str | None) -> Scripted:
        providers[spec.name] = Scripted(spec, dead_error if spec.name == "dead" else None)
        return providers[spec.name]

    monkeypatch.setattr("engine.scheduler.make_provider", make)
    endpoint = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "max_concurrency": 4, "max_attempts": 3}
    models = {"good": {"endpoint": "okay", "model": "g"}, "bad": {"endpoint": "dead", "model": "b"}}
    if replicas:
        models["both"] = {"endpoints": ["dead", "okay"], "model": "x"}
    return Config.from_dicts({"okay": endpoint, "dead": endpoint}, models), providers


def _asks(model: str, n: int) -> list[ChatRequest]:
    return [ChatRequest(model=model, messages=[{"role": "user", "content": f"{model} {i}"}]) for i in range(n)]


@pytest.mark.parametrize("kind,status", [(OVERLOADED, 500), (CONNECTION, None), (AUTH, 401)])
async def test_a_dead_endpoint_is_given_up_while_the_healthy_one_finishes(monkeypatch, kind, status):
    config, providers = _two_endpoints(monkeypatch, ProviderError(kind, "no", status=status))
    engine = Engine(config, retry_policy=RetryPolicy(base=0.001, cap=0.002))
    async with engine:
        outcomes = await engine.run(_asks("good", 200) + _asks("bad", 200))
    good, bad = outcomes[:200], outcomes[200:]
    assert all(o.ok for o in good)
    assert all(o.error is not None and o.error.kind == kind for o in bad)
    # Not 200 calls x 3 attempts: once DOWN_AFTER calls had failed for good, the
    # rest (all but those already started, within the engine's window) were not sent.
    unsent = [o for o in bad if o.attempts == 0]
    assert len(unsent) >= 150 and all("endpoint dead is down" in str(o.error) for o in unsent)
    assert providers["dead"].calls == sum(o.attempts for o in bad) <= 3 * (200 - len(unsent))
    said = [n for n in engine.stats.notices if "is down" in n]
    assert len(said) == 1 and said[0].startswith("dead is down") and "rerun" in said[0]


async def test_a_replica_serves_the_calls_of_a_dead_one(monkeypatch):
    config, providers = _two_endpoints(monkeypatch, ProviderError(OVERLOADED, "no", status=503), replicas=True)
    async with Engine(config, retry_policy=RetryPolicy(base=0.001, cap=0.002)) as engine:
        outcomes = await engine.run(_asks("both", 300))
    failed = [o for o in outcomes if not o.ok]  # those whose every attempt met the dead one first
    assert len(failed) <= 50 and all(o.endpoint == "okay" for o in outcomes if o.ok)
    assert len([n for n in engine.stats.notices if "dead is down" in n]) == 1


async def test_the_dead_endpoint_line_is_printed_even_with_quiet(tmp_path):
    """`--quiet` takes the progress line off, not the errors: the line saying
    an endpoint is down (what failed, the calls left, the rerun) still
    reaches stderr, once, through the real CLI and a server answering 500."""
    async with LoopbackServer(in_process=True, models=["dm"], faults=Faults(rates={"500": 1.0})) as server:
        config = tmp_path / "tulving.toml"
        config.write_text(f'[endpoints.dead]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n'
                          'max_attempts = 1\nmax_concurrency = 2\n\n[models.dead-model]\nendpoint = "dead"\nmodel = "dm"\n')
        done = await atulving(tmp_path, "--quiet", "--config", str(config), "--cache", "c.sqlite", "run",
                              "--book", "synaptic-echoes-short", "--models", "dead-model", "--modes", "in-context",
                              "--judge", "builtin:judge", "--sample", "30", "--out", "out", env=_cli_env())
    assert done.returncode == 3, done.stderr
    said = [line for line in done.stderr.splitlines() if "dead is down" in line]
    assert len(said) == 1, done.stderr
    assert said[0].startswith("tulving: dead is down: ") and "waiting call" in said[0] and "rerun" in said[0]


async def test_a_failed_calls_error_keeps_no_frame_alive(monkeypatch):
    """The error of a failed call, kept in its outcome, must not keep the
    call's request body (and prompt) alive through its traceback's frames."""
    bodies: list[weakref.ref] = []

    class Body:  # stands for a request body: a provider's local while it sends it
        pass

    class Refusing(Scripted):
        async def chat(self, model, messages, *, params, timeout, stream=False):
            body = Body()
            bodies.append(weakref.ref(body))
            try:
                raise OSError("connection reset")
            except OSError as exc:
                raise ProviderError(PROMPT_TOO_LONG, "too long", status=400) from exc

    config, _ = _two_endpoints(monkeypatch, ProviderError(OVERLOADED, "unused"))
    monkeypatch.setattr("engine.scheduler.make_provider", lambda spec, key: Refusing(spec))
    async with Engine(config) as engine:
        outcomes = await engine.run(_asks("good", 20))
    gc.collect()
    assert all(o.error is not None and o.error.kind == PROMPT_TOO_LONG for o in outcomes)
    assert len(bodies) == 20 and all(ref() is None for ref in bodies)
