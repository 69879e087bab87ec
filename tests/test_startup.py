"""Start-up: `tulving --help`, `--version` and a config error load
none of the heavy libraries, and only the named command's module is imported.

Each case runs the real entry point (tulving_bench.main, what the `tulving`
console script calls) in a fresh interpreter, then reports which of the
heavy top-level modules that process imported. Behaviour, not timing:
benchmarks/startup_bench.py times it.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.cli.commands import COMMANDS
from engine.cli.main import build_parser
from engine.loopback.server import LoopbackServer

REPO = Path(__file__).resolve().parents[1]

# What none of the three must import: the scientific stack, HTTP clients, the
# SDKs, plotting, the local models, and asyncio (more than the rest together).
HEAVY = ("numpy", "scipy", "aiohttp", "openai", "anthropic", "orjson", "matplotlib", "llama_cpp", "tokenizers",
         "asyncio", "uvloop", "pyarrow", "asyncpg")

# Runs `tulving ARGS...` through the entry point, then writes the heavy
# modules the process imported to $STARTUP_MODULES_OUT (JSON).
RUNNER = """
import json, os, sys
sys.argv = ["tulving", *sys.argv[1:]]
import tulving_bench
try:
    code = tulving_bench.main()
except SystemExit as exc:
    code = exc.code
heavy = set(json.loads(os.environ["STARTUP_HEAVY"]))
loaded = sorted({name.split(".")[0] for name in sys.modules} & heavy)
with open(os.environ["STARTUP_MODULES_OUT"], "w") as out:
    json.dump(loaded, out)
sys.exit(code)
"""


def tulving(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """(the finished process, the heavy modules it imported)."""
    report = tmp_path / "modules.json"
    env = dict(os.environ, STARTUP_HEAVY=json.dumps(HEAVY), STARTUP_MODULES_OUT=str(report),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TULVING_CONFIG", None)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "no-config")  # no user config file is read
    proc = subprocess.run([sys.executable, "-c", RUNNER, *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    return proc, json.loads(report.read_text())


def test_help_lists_every_command_and_imports_nothing_heavy(tmp_path):
    proc, heavy = tulving(tmp_path, "--help")
    assert proc.returncode == 0, proc.stderr
    for command in COMMANDS:
        assert f"    {command.name}" in proc.stdout
    assert heavy == []


def test_version_imports_nothing_heavy(tmp_path):
    proc, heavy = tulving(tmp_path, "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("tulving ") and len(proc.stdout.split()) == 2
    assert heavy == []


@pytest.mark.parametrize("content, message", [
    ("[endpoints.x\n", "is not valid TOML"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_a_malformed_config_is_one_line_before_anything_heavy(tmp_path, content, message):
    bad = tmp_path / "bad.toml"
    if isinstance(content, bytes):
        bad.write_bytes(content)
    else:
        bad.write_text(content)
    proc, heavy = tulving(tmp_path, "run", "--config", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("tulving: error: ") and message in proc.stderr
    assert heavy == []


def _first_command_of_each_module() -> list[str]:
    """One command per command module (a module registers all of its commands
    at once, so one of them shows what that module imports). serve-loopback's
    options are the loopback server's own: its --help loads the server."""
    firsts: dict[str, str] = {}
    for command in COMMANDS:
        if command.name != "serve-loopback":
            firsts.setdefault(command.module, command.name)
    return sorted(firsts.values())


@pytest.mark.parametrize("command", _first_command_of_each_module())
def test_every_command_s_help_and_a_bad_config_import_nothing_heavy(tmp_path, command):
    """`tulving COMMAND --help`, and `tulving --config BAD.toml COMMAND`, for a
    command of every module: the config error is one line, and neither loads
    the engine, the HTTP clients or numpy (benchmarks/startup_bench.py times them)."""
    proc, heavy = tulving(tmp_path, command, "--help")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: tulving"), proc.stderr
    assert heavy == []
    bad = tmp_path / "bad.toml"
    bad.write_text("[endpoints.x\n")
    # a command that takes a file gets one that does not exist: the config is read first
    needs = {"cache": ["cache", "stats"], "bundle": ["bundle", "no-run"], "score": ["score", "no.jsonl"]}
    proc, heavy = tulving(tmp_path, "--config", str(bad), *needs.get(command, [command]))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "is not valid TOML" in proc.stderr, proc.stderr
    assert heavy == []


def test_a_bad_bench_option_is_refused_before_anything_heavy(tmp_path):
    proc, heavy = tulving(tmp_path, "bench", "--models", "m", "--rate", "-1")
    assert proc.returncode == 2 and proc.stderr.startswith("tulving: error: ") and "--rate" in proc.stderr
    assert heavy == []


def test_generate_s_help_names_the_itermax_the_generator_uses():
    """The help is written without loading the generator: it must say its default."""
    from engine.benchmark.generation.chapters import DEFAULT_ITERMAX
    from engine.cli.generate import ITERMAX_HELP

    assert f"(default {DEFAULT_ITERMAX})" in ITERMAX_HELP


def test_a_command_help_and_a_usage_error_import_nothing_heavy(tmp_path):
    proc, heavy = tulving(tmp_path, "run", "--help")
    assert proc.returncode == 0 and "--models" in proc.stdout and "--shard" in proc.stdout
    assert heavy == []
    proc, heavy = tulving(tmp_path, "no-such-command")
    assert proc.returncode == 2 and "invalid choice: 'no-such-command'" in proc.stderr
    assert heavy == []


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


@pytest.mark.parametrize("module", sorted({c.module for c in COMMANDS}))
def test_each_module_registers_exactly_its_commands_of_the_table(module):
    """The table (what --help shows) and the modules (what runs) agree:
    names, order and help. With the module chosen, the CLI's parser holds its
    real parsers; the other commands are placeholders without options."""
    mine = [c for c in COMMANDS if c.module == module]
    registered = argparse.ArgumentParser()
    importlib.import_module(module).register(registered.add_subparsers())
    sub = _subparsers(registered)
    assert [a.dest for a in sub._choices_actions] == [c.name for c in mine]
    assert [a.help for a in sub._choices_actions] == [c.help for c in mine]
    full = _subparsers(build_parser(mine[0].name))
    assert list(full.choices) == [c.name for c in COMMANDS]
    for command in COMMANDS:
        assert bool(full.choices[command.name]._actions) == (command.module == module), command.name


async def test_a_remote_only_run_never_imports_plotting_or_local_models(tmp_path):
    """The "first call" side of start-up: a run of remote models only (here
    the loopback server) loads neither matplotlib nor llama-cpp nor the
    local embedder's tokenizers, before its first call or after."""
    config = tmp_path / "tulving.toml"
    async with LoopbackServer(models=["m", "judge"]) as server:
        config.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n\n'
                          '[models.m]\nendpoint = "loop"\nmodel = "m"\n\n'
                          '[models.j]\nendpoint = "loop"\nmodel = "judge"\n')
        proc, heavy = await asyncio.to_thread(
            tulving, tmp_path, "--quiet", "--config", str(config), "--cache", "c.sqlite", "run",
            "--models", "m", "--modes", "in-context", "--judge", "j", "--sample", "2", "--out", "out")
    assert proc.returncode in (0, 3), proc.stderr  # 3: the loopback's judge replies may not parse
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["engine"]["calls"] > 0  # it did call the server
    assert not {"matplotlib", "llama_cpp", "tokenizers"} & set(heavy), heavy
