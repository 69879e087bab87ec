"""Per-model call settings: how each model is called (system prompt or not,
the name of the output-token limit), checked through the real resolver, and
the alias keys that carry a model's standing with its provider."""
from __future__ import annotations

import pytest

from engine.config import Config, ConfigError
from engine.requests import ChatRequest
from engine.resolve import resolve

ENDPOINTS = {"api": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}}
MESSAGES = [{"role": "system", "content": "You are an expert."}, {"role": "user", "content": "When?"}]


def config(**alias: object) -> Config:
    table = {"endpoint": "api", "model": "m", "params": {"temperature": 1.0, "max_tokens": 4096}, **alias}
    return Config.from_dicts(ENDPOINTS, {"m": table, "other": {"endpoint": "api", "model": "o"}})


def body(cfg: Config, **request: object) -> tuple[dict[str, object], list[dict[str, str]]]:
    resolved = resolve(cfg, ChatRequest(model="m", messages=MESSAGES, **request))  # type: ignore[arg-type]
    assert resolved.messages is not None
    return resolved.params, resolved.messages


def test_by_default_the_limit_and_system_prompt_go_as_written():
    params, messages = body(config())
    assert params == {"temperature": 1.0, "max_tokens": 4096}
    assert [m["role"] for m in messages] == ["system", "user"]


def test_max_completion_tokens_models_get_the_limit_under_that_name():
    params, _ = body(config(token_param="max_completion_tokens"))
    assert params == {"temperature": 1.0, "max_completion_tokens": 4096}
    params, _ = body(config(token_param="max_completion_tokens"), max_tokens=256)
    assert params == {"temperature": 1.0, "max_completion_tokens": 256}


def test_token_param_none_sends_no_limit():
    params, _ = body(config(token_param="none"), max_tokens=256)
    assert params == {"temperature": 1.0}


def test_without_system_prompt_only_the_user_message_is_sent():
    params, messages = body(config(system_prompt=False))
    assert messages == [{"role": "user", "content": "When?"}]
    assert params == {"temperature": 1.0, "max_tokens": 4096}


def test_a_reasoning_model_gets_the_user_message_only_and_no_sampling_params():
    params, messages = body(config(reasoning=True), temperature=0.5, max_tokens=100)
    assert messages == [{"role": "user", "content": "When?"}]
    assert params == {}


def test_the_settings_are_part_of_what_the_cache_key_hashes():
    plain = resolve(config(), ChatRequest(model="m", messages=MESSAGES)).key
    renamed = resolve(config(token_param="max_completion_tokens"), ChatRequest(model="m", messages=MESSAGES)).key
    assert plain != renamed


@pytest.mark.parametrize(("alias", "says"), [
    ({"token_param": "max_output_tokens"}, "token_param must be one of max_tokens, max_completion_tokens, none"),
    ({"system_prompt": "no"}, "system_prompt must be true or false"),
    ({"retired": "2025-13-01"}, "retired is not a calendar date"),
    ({"checked": "yesterday"}, "checked must be a date YYYY-MM-DD"),
    ({"long_prompt_tokens": 60000}, "needs both long_prompt_tokens and long_prompt_model"),
    ({"long_prompt_tokens": 60000, "long_prompt_model": "nowhere"}, "names 'nowhere', which is not another declared"),
    ({"replacement": ""}, "replacement must be a non-empty string"),
])
def test_malformed_settings_are_one_line_errors(alias: dict[str, object], says: str):
    with pytest.raises(ConfigError) as caught:
        config(**alias)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_dates_and_routes_are_kept():
    import datetime
    alias = config(retired=datetime.date(2025, 10, 22), replacement="other", checked="2026-11-26",
                   long_prompt_tokens=60000, long_prompt_model="other").alias("m")
    assert (alias.retired, alias.replacement, alias.checked) == ("2025-10-22", "other", "2026-11-26")
    assert (alias.long_prompt_tokens, alias.long_prompt_model) == (60000, "other")
