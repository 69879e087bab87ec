"""Calls today's models accept (checked 2026-11-28): no sampling parameters
where the API version or the model refuses them, an output limit that leaves
room for a thinking model's thinking; and the loopback refusing what the APIs
refuse. Over HTTP on loopback."""
from __future__ import annotations

import aiohttp
import pytest

from engine.config import Config
from engine.loopback.server import LoopbackServer
from engine.requests import ChatRequest
from engine.resolve import resolve
from providers.anthropic_http import AnthropicProvider
from providers.base import EndpointSpec, ProviderError
from providers.models_anthropic import THINKING_TOKENS

USER = [{"role": "user", "content": "When did Ava meet Leo?"}]


async def post(url: str, body: dict, **headers: str) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=headers) as reply:
        return reply.status, await reply.json()


async def test_the_current_anthropic_version_refuses_sampling_parameters_and_tulving_sends_none():
    async with LoopbackServer() as server:
        url = server.anthropic_base_url + "/v1/messages"
        body = {"model": "claude-sonnet-5-5", "max_tokens": 16, "messages": USER}
        status, error = await post(url, {**body, "temperature": 1.0}, **{"anthropic-version": "2026-10-21"})
        assert status == 400 and error["error"]["message"] == "temperature: Extra inputs are not permitted"
        status, _ = await post(url, body, **{"anthropic-version": "2026-10-21"})
        assert status == 200
        # On the old version a Claude 5 model still refuses a non-default value.
        status, error = await post(url, {**body, "temperature": 0.2}, **{"anthropic-version": "2023-06-01"})
        assert status == 400 and "temperature" in error["error"]["message"]
        provider = AnthropicProvider(EndpointSpec(name="a", kind="anthropic", base_url=server.anthropic_base_url))
        try:  # the paper's temperature 1.0 is the default: left out, the call goes through
            result = await provider.chat("claude-sonnet-5-5", USER, params={"temperature": 1.0, "max_tokens": 16},
                                         timeout=10)
            assert result.text
            with pytest.raises(ProviderError) as refused:  # any other value: one line, before any call
                await provider.chat("claude-sonnet-5-5", USER, params={"temperature": 0.2}, timeout=10)
        finally:
            await provider.aclose()
        assert "2023-06-01" in str(refused.value) and "\n" not in str(refused.value)


async def test_gpt6_is_sent_no_temperature_and_the_loopback_refuses_one():
    async with LoopbackServer() as server:
        url = server.openai_base_url + "/chat/completions"
        status, error = await post(url, {"model": "gpt-6.1-sol", "messages": USER, "temperature": 1.0})
        assert status == 400 and error["error"]["param"] == "temperature"
        status, _ = await post(url, {"model": "gpt-6.1-sol", "messages": USER, "temperature": 0.5,
                                     "reasoning_effort": "none"})
        assert status == 200  # sampling is allowed only without reasoning
    config = Config.load()
    for name in ("gpt-6.1-sol", "gpt-6.1-terra", "gpt-6-luna"):
        params = resolve(config, ChatRequest(model=name, messages=USER)).params
        assert params == {"max_completion_tokens": 4096}, name


def test_models_that_always_think_get_room_for_it_and_claude_5_no_sampling():
    config = Config.load()
    for name in ("claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-5-5"):
        params = resolve(config, ChatRequest(model=name, messages=USER)).params
        assert params == {"max_tokens": 4096 + THINKING_TOKENS}, name
