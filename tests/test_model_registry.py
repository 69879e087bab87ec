"""The dated model registry through the real interfaces: a retired alias stops
the CLI before any call (a loopback server counts what reached it), a dry run
still prices it; a 404 model-not-found from the loopback is a final error
naming the replacement; the loopback refuses what the real APIs refuse;
`tulving models --remote` marks what the key cannot use; ad-hoc ids take the
registry's settings or inferred ones; docs/models.md is the registry's table."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import aiohttp
import pytest

from engine.cli.models_table import models_markdown
from engine.config import Config
from engine.loopback.server import LoopbackServer
from engine.requests import ChatRequest
from engine.scheduler import Engine
from tests.test_cli import ROOT, atulving, tulving

RETIRED_LINE = ("claude-3-5-sonnet (claude-3-5-sonnet-20240620) was retired by Anthropic on 2025-10-28: use "
                "claude-sonnet-5-5 (or declare the alias in your config to call it anyway, e.g. through a proxy "
                "that still serves it)")


def _over_loopback(tmp_path: Path, server: LoopbackServer, models: str = "") -> Path:
    """The public endpoints' names pointed at the loopback: the shipped aliases keep their settings
    (but the rate limits: Anthropic's 40,000 input tokens a minute would pace two in-context
    prompts of the short book over 20 s, and the subject here is the aliases)."""
    path = tmp_path / "tulving.toml"
    unlimited = "rpm = 1000000\ninput_tpm = 1000000000\noutput_tpm = 1000000000\n"
    path.write_text(f'[endpoints.anthropic]\nbase_url = "{server.anthropic_base_url}"\nfree = true\nkey_env = "LOOP_KEY"\n'
                    f'max_attempts = 3\n{unlimited}\n'
                    f'[endpoints.openai]\nbase_url = "{server.openai_base_url}"\nfree = true\nkey_env = "LOOP_KEY"\n'
                    f'max_attempts = 3\n{unlimited}\n{models}')
    return path


async def test_a_retired_alias_stops_every_command_before_any_call(tmp_path):
    async with LoopbackServer(in_process=True) as server:
        config = str(_over_loopback(tmp_path, server))
        for command in (["run", "--models", "claude-3-5-sonnet", "--sample", "2", "--out", str(tmp_path / "r")],
                        ["run", "--models", "builtin:reader", "--judge", "claude-3-5-sonnet", "--sample", "2",
                         "--out", str(tmp_path / "r")],
                        ["bench", "--models", "o3-mini", "-n", "2"],
                        ["generate", "--events", "3", "--model", "claude-3-5-sonnet", "--out", str(tmp_path / "book")]):
            code, out, err = await atulving("--config", config, "--cache", str(tmp_path / "c.sqlite"), *command,
                                            LOOP_KEY="k")
            assert code == 2, (command, err)
            assert err.strip().splitlines()[-1].removeprefix("tulving: error: ") in (
                RETIRED_LINE, "o3-mini (o3-mini) was retired by OpenAI on 2026-10-23: use gpt-6.1-sol (or declare "
                              "the alias in your config to call it anyway, e.g. through a proxy that still serves it)")
        assert server.stats.requests == 0
        # a dry run prices it, and says it is retired
        code, out, err = await atulving("--config", config, "run", "--models", "claude-3-5-sonnet", "--sample", "2",
                                        "--dry-run", LOOP_KEY="k")
        assert code == 0 and f"note: {RETIRED_LINE}" in err and "claude-3-5-sonnet  answer" in out
        assert server.stats.requests == 0


async def test_a_declared_alias_of_a_retired_name_is_the_users(tmp_path):
    async with LoopbackServer(in_process=True, models=["claude-3-5-sonnet-20240620"]) as server:
        declared = ('[models.claude-3-5-sonnet]\nendpoint = "anthropic"\nmodel = "claude-3-5-sonnet-20240620"\n'
                    'params = { max_tokens = 20 }\n')
        config = str(_over_loopback(tmp_path, server, declared))
        code, out, err = await atulving("--config", config, "--cache", str(tmp_path / "c.sqlite"), "run",
                                        "--models", "claude-3-5-sonnet", "--sample", "2", "--out", str(tmp_path / "r"), LOOP_KEY="k")
    assert code == 0, err
    assert server.stats.requests >= 2


async def test_a_404_for_the_model_is_final_and_names_the_replacement(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOP_KEY", "k")
    async with LoopbackServer(in_process=True) as server:
        # declared by the user (so not stopped up front), but the server has retired the id
        declared = ('[models.old-sonnet]\nendpoint = "anthropic"\nmodel = "claude-3-5-sonnet-20240620"\n\n'
                    '[models.odd]\nendpoint = "openai"\nmodel = "o1-2024-12-17"\n')
        config = Config.load(_over_loopback(tmp_path, server, declared))
        async with Engine(config, cache_path=None, progress=False) as engine:
            outcomes = await engine.run([ChatRequest(model=m, messages=[{"role": "user", "content": "hi"}])
                                         for m in ("old-sonnet", "odd")])
        assert server.stats.requests == 2  # one attempt each: final, not retried
    sonnet, odd = (o.error for o in outcomes)
    assert sonnet is not None and sonnet.status == 404 and not sonnet.retryable
    assert sonnet.message.endswith("model: claude-3-5-sonnet-20240620 [not_found_error] -- claude-3-5-sonnet "
                                   "(retired by Anthropic on 2025-10-28): use claude-sonnet-5-5, or "
                                   "`tulving models --remote` lists the models this key can use")
    assert odd is not None and "does not exist or you do not have access to it. [model_not_found] -- o1 " \
                               "(retired by OpenAI on 2026-10-23): use gpt-6.1-sol" in odd.message


async def test_the_default_loopback_refuses_a_made_up_id_as_the_real_apis_do(tmp_path, monkeypatch):
    """Without `models=`, the loopback serves only the registry's current ids:
    a made-up one is a final one-line 404 through both providers."""
    monkeypatch.setenv("LOOP_KEY", "k")
    async with LoopbackServer(in_process=True) as server:
        declared = ('[models.mine-gpt]\nendpoint = "openai"\nmodel = "made-up-gpt"\n\n'
                    '[models.mine-claude]\nendpoint = "anthropic"\nmodel = "made-up-claude"\n')
        config = Config.load(_over_loopback(tmp_path, server, declared))
        async with Engine(config, cache_path=None, progress=False) as engine:
            outcomes = await engine.run([ChatRequest(model=m, messages=[{"role": "user", "content": "hi"}])
                                         for m in ("mine-gpt", "mine-claude")])
        assert server.stats.requests == 2  # one attempt each: final, not retried
    gpt, claude = (o.error for o in outcomes)
    hint = "`tulving models --remote` lists the models this key can use"
    assert gpt is not None and gpt.status == 404 and not gpt.retryable and "\n" not in gpt.message
    assert "The model `made-up-gpt` does not exist or you do not have access to it. [model_not_found]" in gpt.message
    assert gpt.message.endswith(hint)
    assert claude is not None and claude.status == 404 and not claude.retryable and "\n" not in claude.message
    assert "model: made-up-claude [not_found_error]" in claude.message and claude.message.endswith(hint)


async def _post(url: str, body: dict[str, object], **headers: str) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def test_the_loopback_refuses_what_the_real_apis_refuse():
    user = [{"role": "user", "content": "hi"}]
    async with LoopbackServer(models=["test-model"]) as server:
        chat = server.openai_base_url + "/chat/completions"
        status, body = await _post(chat, {"model": "made-up", "messages": user})
        assert status == 404 and body["error"] == {
            "message": "The model `made-up` does not exist or you do not have access to it.",
            "type": "invalid_request_error", "param": None, "code": "model_not_found"}
        status, body = await _post(server.anthropic_base_url + "/v1/messages",
                                   {"model": "claude-3-5-sonnet-20240620", "max_tokens": 5, "messages": user})
        assert status == 404 and body["error"] == {"type": "not_found_error",
                                                   "message": "model: claude-3-5-sonnet-20240620"}
        status, body = await _post(chat, {"model": "gpt-6.1-terra", "messages": user, "max_tokens": 5})
        assert status == 400 and body["error"]["code"] == "unsupported_parameter"
        assert body["error"]["message"] == ("Unsupported parameter: 'max_tokens' is not supported with this model. "
                                            "Use 'max_completion_tokens' instead.")
        status, body = await _post(chat, {"model": "gpt-5-2025-08-07", "messages": user, "temperature": 0.2,
                                          "max_completion_tokens": 5})
        assert status == 400 and body["error"]["code"] == "unsupported_value"
        assert body["error"]["param"] == "temperature"
        # GPT-6 reasons unless told not to, and then takes no temperature at all (checked 2026-11-28).
        status, body = await _post(chat, {"model": "gpt-6.1-terra", "messages": user, "temperature": 1,
                                          "max_completion_tokens": 5})
        assert status == 400 and body["error"]["code"] == "unsupported_parameter"
        for model, extra in (("gpt-6.1-terra", {"max_completion_tokens": 5}),
                             ("gpt-5-2025-08-07", {"max_completion_tokens": 5, "temperature": 1}),
                             ("test-model", {"max_tokens": 5, "temperature": 0.2})):
            status, body = await _post(chat, {"model": model, "messages": user, **extra})
            assert status == 200, body


async def test_models_remote_marks_what_the_key_cannot_use(tmp_path):
    async with LoopbackServer(in_process=True, models=["my-own-model"]) as server:
        config = _over_loopback(tmp_path, server, '[models.mine]\nendpoint = "openai"\nmodel = "my-own-model"\n')
        broken = tmp_path / "broken.toml"
        broken.write_text(config.read_text() + '\n[endpoints.gone]\nkind = "openai"\n'
                                               'base_url = "http://127.0.0.1:9/v1"\n\n'
                                               '[models.far]\nendpoint = "gone"\nmodel = "x"\n')
        code, out, err = await atulving("--config", str(broken), "models", "--remote", LOOP_KEY="k")
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert rows["mine"].rstrip().endswith("listed") and rows["claude-sonnet-5-5"].rstrip().endswith("listed")
    assert rows["gpt-4o"].rstrip().endswith("listed")  # gpt-4o-2024-08-06 is still served
    assert rows["o1"].rstrip().endswith("not listed") and rows["claude-3-haiku"].rstrip().endswith("not listed")
    assert rows["far"].rstrip().endswith("-")
    assert [line for line in err.splitlines() if line.startswith("note: gone: model list unreachable")]


def test_ad_hoc_ids_take_the_registrys_settings_or_inferred_ones():
    config = Config.load()
    known = config.alias("openai/gpt-4o-2024-08-06")
    assert (known.price_in, known.shutdown, known.replacement) == (2.5, "2027-01-14", "gpt-6-luna")
    assert config.alias("openai/o4-mini").reasoning and not config.alias("openai/o4-mini").sends_system
    assert config.alias("openai/gpt-5.4").token_param == "max_completion_tokens"
    assert config.alias("openai/gpt-4.1-mini").token_param == "max_completion_tokens"
    # A model the provider serves under several names is priced under each (checked 2026-11-28: OpenAI
    # serves gpt-5 and its snapshot gpt-5-2025-08-07), whatever the host, and the name asked is the name sent.
    assert config.alias("openai/gpt-4o").token_param is None and config.alias("openai/gpt-4o").price_in == 2.5
    gpt5 = config.alias("openai/gpt-5")
    assert (gpt5.model, gpt5.price_in, gpt5.price_out) == ("gpt-5", 1.25, 10.0)
    assert config.alias("openai/gpt-6.1-sol-2026-09-29").price_in == 2.0  # the snapshot a reply names
    assert config.alias("anthropic/claude-haiku-4-5").price_in == 1.0  # the undated name of -20251001
    assert not config.alias("openai/team-gpt").priced  # a proxy's own name: unknown, asked about
    assert config.retirement(config.alias("anthropic/claude-sonnet-4-20250514")) is not None


def test_an_unpriced_paid_alias_under_max_cost_refuses_to_start():
    result = tulving("--max-cost", "1", "run", "--models", "openai/gpt-9", "--sample", "2", "--out", "/tmp/none")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "tulving: error: --max-cost cannot bound openai/gpt-9: it has no price; declare an alias for it with "
        "price_in and price_out (USD per million tokens) under [models.NAME]")
    # a free (builtin) model needs no price
    result = tulving("--max-cost", "1", "run", "--models", "builtin:reader", "--sample", "1", "--dry-run")
    assert result.returncode == 0, result.stderr


def test_every_leaderboard_row_of_openai_and_anthropic_is_an_alias_with_a_date():
    config = Config.load()
    board = (ROOT / "engine/benchmark/data/published/leaderboard.json").read_text()
    rows = set(re.findall(r'"model": "([^"]+)"', board))
    ours = {r for r in rows if r.startswith(("gpt", "o1", "o3", "claude"))}
    assert ours == {"gpt-5", "gpt-5-mini", "gpt-4o", "gpt-4o-mini", "o3-mini", "o1", "o1-mini", "gpt-4.1-nano",
                    "claude-sonnet-4", "claude-3-haiku", "claude-3-5-sonnet"}
    for name in ours:
        alias = config.alias(name)
        assert alias.checked and alias.priced and (alias.retired or alias.shutdown), name
        assert alias.replacement in config.models and config.alias(alias.replacement).retired_on() is None, name
    assert config.alias("claude-3-5-sonnet").model == "claude-3-5-sonnet-20240620"


def test_docs_models_md_is_the_registrys_table():
    page = (ROOT / "docs" / "models.md").read_text()
    assert page == models_markdown(Config.load()), (
        f"docs/models.md drifted: regenerate it with `{sys.executable} -m engine.cli models --markdown "
        f"> docs/models.md`")


@pytest.mark.parametrize("name", ["gpt-6.1-sol", "claude-sonnet-5-5"])
def test_current_models_resolve_to_what_their_api_accepts(name):
    from engine.resolve import resolve
    config = Config.load()
    params = resolve(config, ChatRequest(model=name, messages=[{"role": "user", "content": "x"}])).params
    assert "max_tokens" in params or "max_completion_tokens" in params
    if name.startswith("gpt"):
        assert "max_tokens" not in params and params.get("temperature", 1) == 1
