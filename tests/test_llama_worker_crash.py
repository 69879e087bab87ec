"""A native crash in the middle of a run (the worker's test hook sends it
SIGSEGV on a marked prompt), through the real engine, the real SmolLM2 worker
and the SQLite cache on disk: the run ends normally with the other answers,
the crash is one classified error, and a rerun asks the model only for it."""
from __future__ import annotations

import pytest

from engine.config import Config
from engine.requests import ChatRequest
from engine.scheduler import Engine
from providers.base import CONNECTION, CRASHED
from providers.llama_worker import CRASH_HOOK_ENV

pytest.importorskip("llama_cpp", reason="llama-cpp-python is the [local] extra")

MARKER = "ZQX-CRASH-HOOK"
CONTEXT = " ".join(f"On day {i} the archivist of the harbour town sorted {i * 3} letters and two maps."
                   for i in range(1, 25))
QUESTIONS = ["How many maps?", f"Who sorted the letters? {MARKER}", "Which town?", "What did the archivist do?",
             "On which day were 30 letters sorted?"]


def requests(model: str = "local:smollm2") -> list[ChatRequest]:
    return [ChatRequest(model=model, messages=[{"role": "user", "content": f"{CONTEXT}\n\nQuestion: {q}"}],
                        max_tokens=6, temperature=0.0, tag=str(i)) for i, q in enumerate(QUESTIONS)]


def local_endpoint(engine: Engine):
    return engine._endpoints["local"].provider


def config(tmp_path, max_attempts: int) -> Config:
    path = tmp_path / "tulving.toml"
    path.write_text(f"[endpoints.local]\nmax_attempts = {max_attempts}\n")
    return Config.load(path)


@pytest.mark.parametrize("max_attempts", [1, 2])
async def test_a_worker_crash_mid_run_fails_only_its_call_and_a_rerun_asks_only_it(tmp_path, monkeypatch,
                                                                                  max_attempts):
    cache = str(tmp_path / "cache.sqlite")
    monkeypatch.setenv(CRASH_HOOK_ENV, MARKER)
    async with Engine(config(tmp_path, max_attempts), cache_path=cache) as engine:
        first = await engine.run(requests())
        stats = engine.stats
        provider = local_endpoint(engine)
        assert provider.stats.worker_deaths == max_attempts
        assert provider.stats.reused_prefix_tokens > 0  # prefix reuse goes on around the crash
    crashed = first[1]
    assert not crashed.ok and crashed.attempts == max_attempts
    # The first death is retryable (the built-in local endpoint makes one
    # attempt); the same call killing a second worker is final.
    assert crashed.error.kind == (CONNECTION if max_attempts == 1 else CRASHED)
    assert "SIGSEGV" in str(crashed.error)
    assert [o.ok for o in first] == [True, False, True, True, True]
    assert all(o.text.strip() for o in first if o.ok)
    assert stats.errors == {crashed.error.kind: 1} and stats.succeeded == 4
    assert stats.calls == 4 + max_attempts and stats.retries == max_attempts - 1

    monkeypatch.delenv(CRASH_HOOK_ENV)
    async with Engine(config(tmp_path, max_attempts), cache_path=cache) as engine:
        second = await engine.run(requests())
        assert engine.stats.calls == 1 and engine.stats.cache_hits == 4
        assert local_endpoint(engine).stats.calls == 1
    assert all(o.ok for o in second)
    assert [o.cached for o in second] == [True, False, True, True, True]
    assert [o.text for o in second if o.cached] == [o.text for o in first if o.ok]
