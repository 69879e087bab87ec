"""Provider kinds: one `ProviderKind` per endpoint kind, read from the entry
point group `tulving.providers` (providers/kinds.py). The built-in kinds load
through the installed distribution's entry points; a third-party kind declared
by a tiny distribution on sys.path is found by `tulving config check` and
serves calls; every endpoint option is checked against its kind's schema at
load; the configuration reference is generated from that schema."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import fields
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

import pytest

from engine.config import ENDPOINT_KEYS, Config, ConfigError
from engine.requests import ChatRequest
from engine.scheduler import Engine
from providers.anthropic_batch import AnthropicBatchApi
from providers.anthropic_http import AnthropicProvider
from providers.base import CONFIG, EndpointSpec, ProviderError
from providers.kinds import (
    GROUP,
    KindRegistry,
    batch_api_for,
    batch_capable,
    make_provider,
    registry,
    set_registry,
)
from providers.local_embed import LocalEmbedProvider
from providers.openai_batch import OpenAIBatchApi
from providers.openai_http import OpenAIProvider

ROOT = Path(__file__).resolve().parent.parent
BUILT_IN = ["anthropic", "azure-openai", "builtin", "deepseek", "gemini", "local", "local-embed", "openai", "openrouter",
            "xai"]

# A third-party kind, as a plugin distribution would ship it.
PLUGIN = '''
from providers.base import ChatResult, Provider
from providers.kinds import BOOL, Option, ProviderKind


class EchoProvider(Provider):
    kind = "echo"

    async def chat(self, model, messages, *, params, timeout, stream=False):
        text = messages[-1]["content"]
        return ChatResult(text=text.upper() if self.spec.options.get("shout") else text)


ECHO = ProviderKind(name="echo", provider="echo_plugin:EchoProvider", doc="repeats the last message",
                    options=(Option("shout", BOOL, "reply in capitals", default=False),))
'''


def cli(*argv: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *argv], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **(env or {})}, timeout=120)


def write_plugin(folder: Path) -> Path:
    """A tiny installed distribution: a module and a .dist-info whose
    entry_points.txt declares the kind `echo`."""
    folder.mkdir(exist_ok=True)
    (folder / "echo_plugin.py").write_text(PLUGIN)
    info = folder / "echo_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\necho = echo_plugin:ECHO\n")
    return folder


def test_the_built_in_kinds_come_from_the_distributions_entry_points():
    declared = sorted(ep.name for ep in entry_points(group=GROUP))
    assert declared == BUILT_IN
    assert registry().names() == BUILT_IN
    assert type(make_provider(EndpointSpec(name="o", kind="openai"), None)) is OpenAIProvider
    assert type(make_provider(EndpointSpec(name="a", kind="anthropic"), "k")) is AnthropicProvider
    assert type(make_provider(EndpointSpec(name="e", kind="local-embed"), None)) is LocalEmbedProvider


def test_the_batch_api_of_an_endpoint_comes_from_its_kind():
    assert type(batch_api_for(EndpointSpec(name="o", kind="openai"), None)) is OpenAIBatchApi
    assert type(batch_api_for(EndpointSpec(name="a", kind="anthropic"), "k")) is AnthropicBatchApi
    assert batch_api_for(EndpointSpec(name="l", kind="local"), None) is None
    off = EndpointSpec(name="v", kind="openai", options={"batch": False})
    assert batch_api_for(off, None) is None and not batch_capable(off)
    limited = Config.from_dicts({"o": {"kind": "openai", "options": {"batch_max_requests": 7}}}, {})
    api = batch_api_for(limited.endpoints["o"], None)
    assert api is not None and api.max_requests == 7


def test_capabilities_say_what_a_kind_does():
    kinds = {kind.name: kind for kind in registry().all()}
    assert {name for name, k in kinds.items() if k.can_batch} == {"openai", "anthropic", "gemini"}
    assert {name for name, k in kinds.items() if k.capabilities.stream} == {
        "openai", "anthropic", "gemini", "xai", "deepseek", "openrouter", "azure-openai"}
    assert {name for name, k in kinds.items() if k.capabilities.embeddings} == {"openai", "local-embed", "azure-openai"}
    assert not kinds["local-embed"].capabilities.chat and kinds["builtin"].default_models


def test_an_unknown_kind_is_one_line_listing_the_known_ones():
    with pytest.raises(ConfigError) as err:
        Config.from_dicts({"e": {"kind": "nope"}}, {})
    assert str(err.value) == f"dict: [endpoints.e] has unknown kind 'nope' (known: {', '.join(BUILT_IN)})"
    with pytest.raises(ProviderError, match="unknown endpoint kind 'nope'") as perr:
        make_provider(EndpointSpec(name="e", kind="nope"), None)
    assert perr.value.kind == CONFIG


def test_without_package_metadata_the_error_says_to_install():
    with pytest.raises(ProviderError, match=r"run `pip install -e \.`"):
        KindRegistry.from_entry_points([])
    bad = EntryPoint(name="odd", value="json:dumps", group=GROUP)
    with pytest.raises(ProviderError, match="is not a ProviderKind named 'odd'"):
        KindRegistry.from_entry_points([bad])


async def test_an_injected_kind_serves_calls(tmp_path, monkeypatch):
    write_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    found = [EntryPoint(name="echo", value="echo_plugin:ECHO", group=GROUP), *entry_points(group=GROUP)]
    previous = set_registry(KindRegistry.from_entry_points(found))
    try:
        config = Config.from_dicts({"e": {"kind": "echo", "options": {"shout": True}}},
                                   {"m": {"endpoint": "e", "model": "x"}})
        with pytest.raises(ConfigError, match="options.shout must be true or false"):
            Config.from_dicts({"e": {"kind": "echo", "options": {"shout": "loud"}}}, {})
        async with Engine(config) as engine:
            [outcome] = await engine.run([ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}])])
        assert outcome.ok and outcome.result.text == "HI"
    finally:
        set_registry(previous)


def test_a_third_party_distribution_adds_a_kind_to_config_check_and_the_reference(tmp_path):
    plugin = write_plugin(tmp_path / "site")
    (tmp_path / "tulving.toml").write_text('[endpoints.mine]\nkind = "echo"\noptions = { shout = true }\n'
                                           '[models.m]\nendpoint = "mine"\nmodel = "x"\n')
    env = {"PYTHONPATH": os.pathsep.join([str(plugin), str(ROOT)])}
    checked = cli("--config", str(tmp_path / "tulving.toml"), "config", "check", env=env, cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    assert '[endpoints.mine]\nkind = "echo"\n' in checked.stdout and "options = { shout = true }" in checked.stdout
    reference = cli("config", "reference", env=env, cwd=tmp_path)
    assert "### `echo`" in reference.stdout and "| `shout` | bool |" in reference.stdout
    plain = cli("--config", str(tmp_path / "tulving.toml"), "config", "check", cwd=tmp_path)
    assert plain.returncode == 2 and "has unknown kind 'echo'" in plain.stderr


@pytest.mark.parametrize("value,needle", [
    ("-1", "options.batch_poll must be a positive number of seconds, got -1"),
    ('"soon"', "options.batch_poll must be a finite number, got 'soon'"),
])
def test_config_check_reports_a_bad_batch_poll_in_one_line(tmp_path, value, needle):
    (tmp_path / "tulving.toml").write_text(f'[endpoints.e]\nkind = "openai"\noptions = {{ batch_poll = {value} }}\n')
    done = cli("--config", str(tmp_path / "tulving.toml"), "config", "check", cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("tulving: error: ") and "[endpoints.e]" in lines[0] and needle in lines[0]


@pytest.mark.parametrize("kind,options,needle", [
    ("local", {"stream": True}, "options.stream: local endpoints cannot stream (only anthropic, azure-openai, deepseek, gemini, openai, openrouter, xai"),
    ("builtin", {"batch": True}, "options.batch is not an option of builtin endpoints (only of anthropic, gemini, openai)"),
    ("openai", {"anthropic_version": "x"}, "options.anthropic_version is not an option of openai endpoints"),
    ("local", {"n_ctxx": 5}, "unknown option options.n_ctxx for local endpoints (known: model_path, n_ctx,"),
    ("local", {"n_ctx": 0}, "options.n_ctx must be a whole number >= 1, got 0"),
    ("local", {"n_gpu_layers": -2}, "options.n_gpu_layers must be a whole number >= -1, got -2"),
    ("openai", {"batch_queue_tokens": 2.5}, "options.batch_queue_tokens must be a whole number, got 2.5"),
    ("anthropic", {"batch_max_bytes": 0}, "options.batch_max_bytes must be a whole number >= 1, got 0"),
    ("openai", {"batch": "no"}, 'options.batch must be true, false or "auto"'),
    ("openai", {"http_client": "curl"}, "options.http_client must be one of pool, aiohttp"),
    ("local-embed", {"model_dir": 3}, "options.model_dir must be a string, got 3"),
])
def test_every_option_is_checked_against_its_kinds_schema(kind, options, needle):
    with pytest.raises(ConfigError) as err:
        Config.from_dicts({"e": {"kind": kind, "options": options}}, {})
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_checked_options_are_typed():
    spec = Config.from_dicts({"e": {"kind": "openai", "options": {"batch_poll": 2, "read_timeout": 5}}},
                             {}).endpoints["e"]
    assert spec.options == {"batch_poll": 2.0, "read_timeout": 5.0}
    assert all(type(v) is float for v in spec.options.values())


def test_config_load_does_not_depend_on_what_was_imported_first(tmp_path):
    (tmp_path / "tulving.toml").write_text('[models.r]\nendpoint = "builtin"\nmodel = "reader"\n')
    program = textwrap.dedent(f"""
        import json, sys
        {{first}}
        from engine.config import Config
        assert "engine.benchmark.builtin" not in sys.modules or {{imported}}
        config = Config.load({str(tmp_path / "tulving.toml")!r})
        print(json.dumps([sorted(config.endpoints), sorted(config.models),
                          config.alias("builtin:reader").model, config.alias("r").endpoints]))
    """)
    outputs = []
    for first, imported in (("", "False"), ("import engine.benchmark.evaluation", "True")):
        done = subprocess.run([sys.executable, "-c", program.format(first=first, imported=imported)],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert done.returncode == 0, done.stderr
        outputs.append(json.loads(done.stdout))
    assert outputs[0] == outputs[1]
    assert "builtin" in outputs[0][0] and "builtin:reader" in outputs[0][1] and outputs[0][2] == "reader"


def test_every_endpoint_key_is_documented():
    assert set(ENDPOINT_KEYS) == {f.name for f in fields(EndpointSpec)} - {"name"}


def test_the_committed_reference_is_the_commands_output():
    done = cli("config", "reference")
    assert done.returncode == 0, done.stderr
    committed = (ROOT / "docs" / "reference" / "options.md").read_text()
    assert committed == done.stdout, "docs/reference/options.md is stale: run `tulving config reference`"
    for kind in registry().all():
        assert f"### `{kind.name}`" in committed
        assert all(f"| `{option.name}` |" in committed for option in kind.options)


def test_a_kind_names_its_classes_without_importing_them():
    # A missing optional dependency only matters when its kind is used: no
    # kind declaration imports its provider module.
    program = ("import sys; from providers.kinds import registry; registry(); "
               "print(sorted(m for m in sys.modules if m in ('providers.local_llama', 'providers.local_embed', "
               "'engine.benchmark.builtin.provider')))")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
