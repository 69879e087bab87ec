"""The engine's own tools: `models`, `config check`, `config reference` and `serve-loopback`
(`bench` / `bench-latency`: engine/cli/bench.py)."""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from engine.cli import lifecycle
from engine.cli.commands import command_help
from engine.cli.config_file import default_config, load_config

if TYPE_CHECKING:
    from engine.config import Config
    from providers.kinds import ProviderKind

# The rest is imported by the command that needs it: `--help` and a bad
# config answer before the engine, the providers or the loopback server load
# (tests/test_startup.py).


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("models", help=command_help("models"))
    p.add_argument("--probe", action="store_true",
                   help="send one minimal request per remote endpoint whose key is set (or none needed) and "
                        "show the rate limits its reply reports (without it, nothing is sent)")
    p.add_argument("--remote", action="store_true",
                   help="ask each endpoint whose key is set for its model list (GET /v1/models) and mark the "
                        "aliases this key cannot use")
    p.add_argument("--markdown", action="store_true",
                   help="print the table of the built-in OpenAI and Anthropic aliases as Markdown (docs/models.md)")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("config", help=command_help("config"))
    config_sub = p.add_subparsers(dest="config_command", metavar="ACTION")
    check = config_sub.add_parser("check", help="validate the config and print it merged (no secrets)")
    check.set_defaults(func=_cmd_config_check)
    init = config_sub.add_parser("init", help=f"write a commented starter config (default {default_config()}; "
                                               "never overwrites)")
    init.add_argument("path", nargs="?", help="where to write it (default: the user's config file, read when "
                                              "neither --config nor TULVING_CONFIG is given)")
    init.set_defaults(func=_cmd_config_init)
    reference = config_sub.add_parser("reference", help="print the configuration reference (Markdown): every "
                                                        "endpoint and model key, and each provider kind's options")
    reference.set_defaults(func=_cmd_config_reference)
    p.set_defaults(func=lambda args: _usage(p))

    p = sub.add_parser("serve-loopback", add_help=False,
                       help=command_help("serve-loopback"))
    p.add_argument("server_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_serve_loopback)


def _cmd_models(args: argparse.Namespace) -> int:
    from engine.cli import probe
    from engine.cli.models_table import models_markdown, price_cell
    from engine.cli.remote_models import availability, remote_models
    from engine.config import Config

    if args.markdown:
        print(models_markdown(Config.load()), end="")
        return 0
    config = load_config(args)
    listed: dict[str, set[str]] = {}
    if args.remote:
        listed, failures = lifecycle.run_briefly(remote_models(config))
        for line in failures:
            print(f"note: {line}", file=sys.stderr)
    header = ("alias", "endpoint", "model", "kind", "key set", "$/M in/out", "status", "checked")
    rows: list[tuple[str, ...]] = [header + (("this key",) if args.remote else ())]
    for name in sorted(config.models):
        alias = config.models[name]
        for ep_name in alias.endpoints:
            ep = config.endpoints[ep_name]
            key = "-" if not ep.key_env else ("yes" if os.environ.get(ep.key_env) else f"no ({ep.key_env})")
            row = (name, ep_name, alias.model, ep.kind, key, price_cell(config, name),
                   _not_installed(ep.kind, alias.model) or alias.status(), alias.checked or "-")
            rows.append(row + ((availability(config, name, listed),) if args.remote else ()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for cells in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(cells, widths)).rstrip())
    return lifecycle.run_briefly(probe.probe_all(config)) if args.probe else 0


def _not_installed(kind: str, model: str) -> str | None:
    """What an offline alias lacks on this machine (its runtime or its weights), or None."""
    from providers.local_models import (
        MINILM_INSTALL,
        MINILM_NAMES,
        MINILM_PACKAGE,
        SMOLLM2_INSTALL,
        SMOLLM2_NAME,
        SMOLLM2_PACKAGE,
        package_dir,
    )

    if kind == "local":
        try:
            runtime = importlib.util.find_spec("llama_cpp") is not None
        except (ImportError, ValueError):
            runtime = False
        if not runtime:
            return "not installed: pip install 'tulving-bench[local]'"
        if model.lower() == SMOLLM2_NAME and package_dir(SMOLLM2_PACKAGE) is None:
            return f"not installed: {SMOLLM2_INSTALL}"
    if kind == "local-embed" and model.lower() in MINILM_NAMES and package_dir(MINILM_PACKAGE) is None:
        return f"not installed: {MINILM_INSTALL}"
    return None


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_value(value: object) -> str:
    """`value` written as TOML: strings quoted as TOML basic strings, true and
    false, dates bare, lists as arrays, mappings as inline tables."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (datetime.date, datetime.datetime)):
        return value.isoformat()
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{toml_key(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }" \
            if value else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a TOML basic string


def toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def _cmd_config_check(args: argparse.Namespace) -> int:
    """The configuration as read, in TOML: the output, saved to a file, is a
    config that reads back the same (whether a key is set: a comment, never
    the key)."""
    config = load_config(args)
    print(f"# config: {config.source} (valid); this output is itself a config file")
    for name in sorted(config.endpoints):
        ep = config.endpoints[name]
        print(f"[endpoints.{toml_key(name)}]")
        for f in fields(ep):
            value = getattr(ep, f.name)
            if f.name == "name" or value is None or (f.name == "options" and not value):
                continue
            note = ""
            if f.name == "key_env":  # the variable's name only, never its value
                note = f"  # {'set' if os.environ.get(value) else 'not set'}"
            print(f"{f.name} = {toml_value(value)}{note}")
        print()
    for name in sorted(config.models):
        _print_model(config, name)
    _print_cache_section(config)
    return 0


def _print_model(config: Config, name: str) -> None:
    alias = config.models[name]
    print(f"[models.{toml_key(name)}]")
    print(f"endpoints = {toml_value(list(alias.endpoints))}")
    print(f"model = {toml_value(alias.model)}")
    if alias.params:
        print(f"params = {toml_value(dict(alias.params))}")
    for attr in ("price_in", "price_cached_in", "price_cache_write", "price_out", "batch_discount",
                 "context_tokens", "token_param", "retired", "shutdown", "replacement", "checked"):
        if getattr(alias, attr) is not None:
            print(f"{attr} = {toml_value(getattr(alias, attr))}")
    if alias.reasoning:
        print("reasoning = true")
    print()


def _print_cache_section(config: Config) -> None:
    """The [cache] section as read: the URL (never a password: none is allowed
    there) and the password variable's name, never its value."""
    cache = config.cache
    if cache.url is None and cache.password_env is None:
        return
    print("[cache]")
    if cache.url is not None:
        print(f"url = {toml_value(cache.url)}")
    if cache.password_env is not None:
        print(f"password_env = {toml_value(cache.password_env)}  "
              f"# {'set' if os.environ.get(cache.password_env) else 'not set'}")
    print()


STARTER = """\
# Tulving configuration (TOML), merged over the built-in defaults: `tulving config check`
# prints the result, `tulving config reference` lists every key.
# Read when neither --config nor TULVING_CONFIG names another file.
# API keys never go here: an endpoint names the environment variable that holds its key.

# An endpoint: where and how to reach a provider account or server.
# [endpoints.my-vllm]
# kind = "openai"                      # openai | anthropic | ... (tulving config reference)
# base_url = "http://localhost:8000/v1"
# key_env = "MY_VLLM_KEY"              # the variable's name, not the key
# max_concurrency = 16
# rpm = 600                            # requests per minute
# options = { batch = false }          # a server without the batch API

# A model alias: what `--models` names. Prices are USD per million tokens;
# without them a run cannot tell what it costs, and --max-cost cannot stop it.
# [models.my-model]
# endpoint = "my-vllm"
# model = "meta-llama/Llama-3.1-8B-Instruct"
# params = { temperature = 1.0, max_tokens = 4096 }
# price_in = 0.0
# price_out = 0.0
# price_cached_in = 0.0                # input read from the provider's prompt cache (default price_in)
# price_cache_write = 0.0              # input written to it (default price_in)
# batch_discount = 0.5                 # share of the price a batch-API call costs

# The response cache, when neither --cache nor TULVING_CACHE names one: a SQLite
# file, or a PostgreSQL database shared by a team (never the password here).
# [cache]
# url = "postgresql://tulving@dbhost/tulving"
# password_env = "TULVING_CACHE_PASSWORD"   # else $PGPASSWORD or ~/.pgpass
"""


def _cmd_config_init(args: argparse.Namespace) -> int:
    from engine.errors import TulvingError

    path = Path(args.path) if args.path else default_config()
    if path.exists():
        raise TulvingError(f"{path} exists: edit it, or remove it to write a new starter (nothing was changed)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("x", encoding="utf-8") as fh:  # "x": never overwrite, even in a race
        fh.write(STARTER)
    print(f"wrote {path}: uncomment and edit; `tulving config check` validates it")
    return 0


def _cmd_config_reference(args: argparse.Namespace) -> int:
    from engine.errors import TulvingError
    from providers.base import ProviderError
    from providers.kinds import registry

    try:
        kinds = registry().all()
    except ProviderError as exc:
        raise TulvingError(exc.message) from None
    print(reference_markdown(kinds), end="")
    return 0


def reference_markdown(kinds: list[ProviderKind]) -> str:
    """The configuration reference, generated from the config's key tables and
    each kind's option schema, so it cannot drift from what the config accepts."""
    from engine.cache_section import CACHE_KEYS
    from engine.config import ENDPOINT_KEYS, MODEL_KEYS

    lines = ["# Configuration reference", "",
             "Generated by `tulving config reference` from the schema the config is checked against; "
             "do not edit by hand.", "",
             "A config file is TOML with sections `[endpoints.NAME]` and `[models.NAME]`, merged over "
             "the built-in defaults (`tulving config check` prints the result), and an optional `[cache]`.", ""]
    lines += _key_table("Endpoint keys (`[endpoints.NAME]`)", ENDPOINT_KEYS)
    lines += _key_table("Model alias keys (`[models.NAME]`)", MODEL_KEYS)
    lines += _key_table("Response cache keys (`[cache]`)", CACHE_KEYS)
    lines += ["## Provider kinds", "",
              "Each kind is registered through the Python entry point group `tulving.providers`. "
              "An endpoint's `options` are checked against its kind's options below.", ""]
    for kind in kinds:
        lines += _kind_section(kind)
    return "\n".join(lines).rstrip("\n") + "\n"


def _key_table(title: str, keys: dict[str, tuple[str, str, str]]) -> list[str]:
    rows = [f"## {title}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    rows += [f"| `{key}` | {kind} | {default} | {doc} |" for key, (kind, default, doc) in keys.items()]
    return [*rows, ""]


def _kind_section(kind: ProviderKind) -> list[str]:
    caps = kind.capabilities
    can = [name for name, on in (("chat", caps.chat), ("embeddings", caps.embeddings), ("streaming", caps.stream),
                                 ("prompt caching", caps.prompt_cache), ("batch API", kind.can_batch),
                                 ("model listing", caps.list_models),
                                 ("rate-limit headers", caps.rate_limit_headers),
                                 ("fine-tuning", caps.fine_tuning)) if on]
    lines = [f"### `{kind.name}`", "", f"{kind.doc}.", "", f"Capabilities: {', '.join(can) or 'none'}.", ""]
    if not kind.options:
        return [*lines, "No options.", ""]
    lines += ["| option | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for option in kind.options:
        default = "unset" if option.default is None else f"`{json.dumps(option.default)}`"
        unit = f" ({option.unit})" if option.unit else ""
        lines.append(f"| `{option.name}` | {option.type}{unit} | {default} | {option.describe_range() or 'any'} "
                     f"| {option.doc} |")
    return [*lines, ""]


def _cmd_serve_loopback(args: argparse.Namespace) -> int:
    from engine.loopback import cli as loopback_cli

    lifecycle.install_uvloop()  # the server's loop unless --uvloop asks for it explicitly, as before
    return loopback_cli.main(args.server_args, prog="tulving serve-loopback")


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2
