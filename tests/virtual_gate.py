"""An endpoint's gate (engine/gate.py) on a clock the test advances: no
server, no event loop, no sleeping; every `now` is given.

    gate = make_gate(rpm=600)
    job = make_job()
    gate.admit(job, now, in_flight=0)                 # Start / Wait / Refuse
    verdict = reply(gate, job, now, error=too_many(retry_after=2.0))   # RetryAt / DONE
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from engine.batching import Parking
from engine.budget import Budget
from engine.call import AttemptOutcome, Job
from engine.config import Config
from engine.gate import Gate, Verdict
from engine.requests import ChatRequest
from engine.resolve import resolve_many
from engine.retry import RetryPolicy
from providers.base import RATE_LIMITED, ChatResult, ErrorKind, ProviderError, RateLimitInfo

NO_JITTER = RetryPolicy(base=1.0, cap=60.0, jitter=0.0)


class Notes:
    """The gate's notices, as the engine would print them (every line kept)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def notice(self, message: str, *, key: Hashable = None, every: float = 10.0) -> None:
        self.lines.append(message)


def config(max_attempts: int = 3, max_cost_prices: bool = True, **endpoint: Any) -> Config:
    spec = {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "max_concurrency": 16,
            "max_attempts": max_attempts, "max_retry_after": 60.0, **endpoint}
    alias = {"endpoint": "e", "model": "m-1", "params": {"max_tokens": 10}}
    if max_cost_prices:
        alias.update(price_in=1.0, price_out=2.0)
    return Config.from_dicts({"e": spec}, {"m": alias})


def make_gate(now: float = 0.0, budget: Budget | None = None, notes: Notes | None = None,
              retry_policy: RetryPolicy = NO_JITTER, **endpoint: Any) -> Gate:
    cfg = config(**endpoint)
    spec = cfg.endpoints["e"]
    return Gate(spec, budget or Budget(), notes or Notes(), retry_policy,
                max_concurrency=max(1, int(spec.max_concurrency)), now=now)


_SEQ = iter(range(10**9))


def make_job(text: str = "a question", input_estimate: int = 10, output_estimate: int = 10, held: bool = False,
             **endpoint: Any) -> Job:
    """A call to alias "m" (endpoint "e", configured by `endpoint`)."""
    resolved = resolve_many(config(**endpoint), [ChatRequest(model="m", messages=[{"role": "user", "content": text}])])
    return Job(resolved=resolved[0], seq=next(_SEQ), input_estimate=input_estimate,
               output_estimate=output_estimate, holder=Parking() if held else None)


def too_many(retry_after: float | None = None, limits: RateLimitInfo | None = None) -> ProviderError:
    return ProviderError(RATE_LIMITED, "slow down", status=429, retry_after=retry_after, rate_limits=limits)


def failure(kind: ErrorKind, status: int | None = 500) -> ProviderError:
    return ProviderError(kind, f"{kind} reply", status=status)


def reply(gate: Gate, job: Job, now: float, *, error: ProviderError | None = None, sent_at: float | None = None,
          usage: tuple[int, int] = (10, 5), limits: RateLimitInfo | None = None) -> Verdict:
    """An attempt of `job` (sent at `sent_at`, default just before `now`) ending at `now`."""
    started = now - 0.01 if sent_at is None else sent_at
    if error is not None:
        return gate.observe(job, AttemptOutcome(error=error, started=started), now)
    result = ChatResult(text="an answer", input_tokens=usage[0], output_tokens=usage[1], rate_limits=limits)
    return gate.observe(job, AttemptOutcome(result=result, usage=usage, started=started), now)


def send(gate: Gate, job: Job, now: float, in_flight: int = 0) -> None:
    """Admit `job` now (it must start) and count the attempt."""
    verdict = gate.admit(job, now, in_flight)
    assert type(verdict).__name__ == "Start", verdict
