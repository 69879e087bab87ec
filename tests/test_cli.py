"""The `tulving` command line: its commands run in the test's process
(tests/cli.py: the entry point with its own environment and captured output),
and as a real subprocess (`python -m engine.cli`) where a fresh process is
the point: a server it starts, a trust store read at start-up."""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import ssl
import subprocess
import sys
from pathlib import Path

import trustme

from engine.cli.common import dry_run_report, open_engine
from engine.config import Config
from engine.loopback.server import LoopbackServer
from engine.requests import ChatRequest
from engine.scheduler import Engine
from tests import cli

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["loop-model"]

ROOT = Path(__file__).resolve().parent.parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TULVING")}
    env.update(extra)
    return env


def tulving(*args: str, **env: str) -> cli.Done:
    return cli.tulving(ROOT, *args, env=_env(**env))


async def atulving(*args: str, **env: str) -> tuple[int, str, str]:
    """The CLI while this event loop serves a loopback server."""
    done = await cli.atulving(ROOT, *args, env=_env(**env))
    return done.returncode, done.stdout, done.stderr


async def atulving_process(*args: str, **env: str) -> tuple[int, str, str]:
    """The CLI in a fresh process (its trust store read from SSL_CERT_FILE at start-up)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "engine.cli", *args, cwd=ROOT,
                                                env=_env(**env), stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


def loopback_config(path: Path, base_url: str, key_env: str | None = None) -> Path:
    key = f'key_env = "{key_env}"\n' if key_env else ""
    path.write_text(f"""
[endpoints.loop]
kind = "openai"
base_url = "{base_url}"
free = true
{key}max_concurrency = 4

[models.m]
endpoint = "loop"
model = "loop-model"
params = {{ temperature = 0.0, max_tokens = 8 }}
price_in = 1.0
""")
    return path


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("tulving: error: ")
    return lines[0]


def test_malformed_config_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[endpoints.x\nkind = 'openai'\n")
    result = tulving("--config", str(bad), "models")
    assert result.returncode == 2
    assert "not valid TOML" in one_error_line(result.stderr) and str(bad) in result.stderr

    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[endpoints.x]\nkind = 'openai'\nrpm_limit = 5\n")
    result = tulving("config", "check", TULVING_CONFIG=str(unknown))  # the config from the environment
    assert result.returncode == 2
    assert "rpm_limit" in one_error_line(result.stderr)

    client = tmp_path / "client.toml"
    client.write_text("[endpoints.x]\nkind = 'openai'\noptions = { http_client = 'requests' }\n")
    result = tulving("--config", str(client), "models")
    assert result.returncode == 2
    assert "http_client must be one of pool, aiohttp, got 'requests'" in one_error_line(result.stderr)


def test_missing_config_file(tmp_path):
    result = tulving("--config", str(tmp_path / "nope.toml"), "models")
    assert result.returncode == 2 and "not found" in one_error_line(result.stderr)


def test_missing_api_key_names_the_variable(tmp_path):
    config = loopback_config(tmp_path / "c.toml", "http://127.0.0.1:9/v1", key_env="TULVING_TEST_KEY")
    result = tulving("--config", str(config), "--quiet", "bench-latency", "--model", "m", "-n", "3")
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert "TULVING_TEST_KEY" in line and "endpoint 'loop'" in line


def test_unknown_model_is_one_line():
    result = tulving("--quiet", "bench-latency", "--model", "no-such-model", "-n", "2")
    assert result.returncode == 2
    assert "unknown model 'no-such-model'" in one_error_line(result.stderr)


def test_no_command_prints_usage():
    result = tulving()
    assert result.returncode == 2 and "usage: tulving" in result.stderr


def test_models_lists_aliases_and_whether_keys_are_set(tmp_path):
    result = tulving("models", OPENAI_API_KEY="sk-test-secret-value")
    assert result.returncode == 0
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert "gpt-4o-2024-08-06" in rows["gpt-4o"] and " yes " in rows["gpt-4o"]
    assert "no (ANTHROPIC_API_KEY)" in rows["claude-sonnet-4"]
    # each alias with its prices, where it stands and when that was checked
    assert "shuts down on 2027-01-14 -> gpt-6-luna" in rows["gpt-4o"] and " 2.5/10 " in rows["gpt-4o"]
    assert "retired on 2025-10-28 -> claude-sonnet-5-5" in rows["claude-3-5-sonnet"]
    assert rows["claude-sonnet-5-5"].split()[-2:] == ["current", "2026-11-28"]  # rechecked
    assert "sk-test-secret-value" not in result.stdout


def test_config_check_prints_the_merged_config_without_secrets(tmp_path):
    config = loopback_config(tmp_path / "c.toml", "http://127.0.0.1:9/v1", key_env="TULVING_TEST_KEY")
    result = tulving("--config", str(config), "config", "check", TULVING_TEST_KEY="very-secret-123")
    assert result.returncode == 0, result.stderr
    assert "[endpoints.loop]" in result.stdout and "[models.gpt-4o]" in result.stdout
    assert 'key_env = "TULVING_TEST_KEY"  # set' in result.stdout
    assert "very-secret-123" not in result.stdout + result.stderr


async def test_bench_latency_against_a_loopback_server(tmp_path):
    async with LoopbackServer(in_process=True, models=SERVED) as server:
        config = loopback_config(tmp_path / "c.toml", server.openai_base_url)
        code, out, err = await atulving("--config", str(config), "--quiet", "bench-latency", "--model", "m",
                                        "-n", "12", "-c", "3")
    assert code == 0, err
    assert server.stats.requests == 12
    # The throughput row: sent, ok, failed (bench-latency is `tulving bench` with its old defaults).
    assert re.search(r"^m\s+inf c3\s+12\s+12\s+0\s", out, re.M), out
    assert "E2E" in out and "p99" in out
    assert server.stats.max_in_flight <= 3


async def test_https_endpoint_with_a_key_trusted_through_ssl_cert_file(tmp_path):
    """The path a real provider takes: HTTPS, certificate checked against the
    trust store (here a throwaway CA named by SSL_CERT_FILE), key in a header."""
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    async with LoopbackServer(models=SERVED, ssl_context=context, api_keys=["sk-tls-1234567890"]) as server:
        assert server.openai_base_url.startswith("https://")
        config = loopback_config(tmp_path / "c.toml", server.openai_base_url, key_env="LOOP_KEY")
        config.write_text(config.read_text().replace("max_concurrency = 4", "max_concurrency = 4\nmax_attempts = 1"))
        args = ("--config", str(config), "--quiet", "bench-latency", "--model", "m", "-n", "6", "-c", "3")
        code, out, err = await atulving_process(*args, LOOP_KEY="sk-tls-1234567890", SSL_CERT_FILE=str(ca_file))
        assert code == 0, err
        assert re.search(r"^m\s+inf c3\s+6\s+6\s+0\s", out, re.M) and server.stats.by_status == {200: 6}
        # Without the CA the certificate is refused: nothing reaches the handlers.
        code, out, err = await atulving_process(*args, LOOP_KEY="sk-tls-1234567890",
                                                SSL_CERT_FILE=str(tmp_path / "none.pem"))
        assert code == 1 and re.search(r"^m\s+inf c3\s+6\s+0\s+6 \(connection 6\)", out, re.M), out
        assert server.stats.requests == 6


def test_serve_loopback_starts_a_server():
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve-loopback", "--port", "0"], cwd=ROOT,
                            env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("openai_base_url=http://127.0.0.1:")
    finally:
        proc.terminate()
        proc.wait(10)


async def test_dry_run_report_counts_cached_requests_without_calling(tmp_path):
    cache = str(tmp_path / "cache.sqlite")
    async with LoopbackServer(in_process=True, models=SERVED) as server:
        config = Config.load(loopback_config(tmp_path / "c.toml", server.openai_base_url))
        requests = [ChatRequest(model="m", messages=[{"role": "user", "content": f"q{i}"}]) for i in range(10)]
        assert await dry_run_report(config, cache, requests) == (10, 0)  # no cache file yet
        async with Engine(config, cache_path=cache) as engine:
            await engine.run(requests[:4])
        calls = server.stats.requests
        assert await dry_run_report(config, cache, iter(requests)) == (10, 4)
        assert server.stats.requests == calls == 4


async def test_open_engine_uses_the_global_options(tmp_path):
    config = loopback_config(tmp_path / "c.toml", "http://127.0.0.1:9/v1")
    args = argparse.Namespace(config=str(config), cache=str(tmp_path / "c.sqlite"), quiet=True, max_cost=1.5)
    async with open_engine(args) as engine:
        assert engine.max_cost == 1.5 and not engine.progress
        assert "m" in engine.config.models
    assert (tmp_path / "c.sqlite").exists()


def test_version_is_the_installed_distributions():
    from importlib.metadata import version

    done = tulving("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"tulving {version('tulving-bench')}"
    import tomllib
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version("tulving-bench") == declared  # the install is of this source tree


def test_config_check_output_is_a_config_that_reads_back_the_same(tmp_path):
    """Pasted back as TOML (it printed `key_env = 'X (not set)'` and Python
    reprs: `{'max_tokens': 4096}`, `True`), the output is a valid config
    whose check prints the same; whether a key is set is a comment."""
    config = loopback_config(tmp_path / "c.toml", "http://127.0.0.1:9/v1", key_env="TULVING_TEST_KEY")
    first = tulving("--config", str(config), "config", "check")
    assert first.returncode == 0, first.stderr
    assert 'key_env = "TULVING_TEST_KEY"  # not set' in first.stdout and "(not set)" not in first.stdout
    assert "params = { temperature = " in first.stdout and "True" not in first.stdout
    pasted = tmp_path / "pasted.toml"
    pasted.write_text(first.stdout)
    again = tulving("--config", str(pasted), "config", "check")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[1:] == first.stdout.splitlines()[1:]  # all but the "# config: FILE" line


def test_book_stats_of_a_packaged_book_prints_without_out(tmp_path):
    result = subprocess.run([sys.executable, "-m", "engine.cli", "book", "stats", "synaptic-echoes-short"],
                            cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("synaptic-echoes-short: 19 chapters from 20 events")
    assert "not saved" in result.stdout and not list(tmp_path.iterdir())  # nothing written anywhere


def test_the_getting_started_and_readme_examples_name_no_retired_model():
    """Every alias the newcomer's pages pass to --models, --judge, --model or
    --embed-model is one `tulving models` lists as callable (they used
    claude-3-5-sonnet, claude-sonnet-4 and o3-mini, retired)."""
    from engine.config import Config

    config = Config.load()
    named = set()
    for page in (ROOT / "docs" / "getting-started.md", ROOT / "README.md"):
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.splitlines():
                if "finetune" in line:  # a base model id to fine-tune, not an alias
                    continue
                for value in re.findall(r"--(?:models?|judge|embed-model) (\S+)", line):
                    named.update(value.split(","))
    known = {name for name in named if name in config.models}
    assert {"gpt-6.1-sol", "claude-sonnet-5-5"} <= known
    assert [name for name in sorted(known) if config.retirement(config.models[name])] == []
