"""The engine's own tools: `models`, `config check` and `serve-loopback`
(`bench` / `bench-latency`: engine/cli/bench.py)."""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from dataclasses import fields

from engine.cli import probe
from engine.cli.common import load_config
from engine.loopback import cli as loopback_cli


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("models", help="list model aliases, their endpoints and whether keys are set")
    p.add_argument("--probe", action="store_true",
                   help="send one minimal request per remote endpoint whose key is set (or none needed) and "
                        "show the rate limits its reply reports (without it, nothing is sent)")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("config", help="configuration tools")
    config_sub = p.add_subparsers(dest="config_command", metavar="ACTION")
    check = config_sub.add_parser("check", help="validate the config and print it merged (no secrets)")
    check.set_defaults(func=_cmd_config_check)
    p.set_defaults(func=lambda args: _usage(p))

    p = sub.add_parser("serve-loopback", add_help=False,
                       help="serve the OpenAI/Anthropic APIs on loopback, to try the engine without keys "
                            "(options: see `tulving serve-loopback --help`)")
    p.add_argument("server_args", nargs=argparse.REMAINDER)
    p.set_defaults(func=_cmd_serve_loopback)


def _cmd_models(args: argparse.Namespace) -> int:
    config = load_config(args)
    rows = [("alias", "endpoint", "model", "kind", "key set")]
    for name in sorted(config.models):
        alias = config.models[name]
        for ep_name in alias.endpoints:
            ep = config.endpoints[ep_name]
            key = "-" if not ep.key_env else ("yes" if os.environ.get(ep.key_env) else f"no ({ep.key_env})")
            rows.append((name, ep_name, alias.model, ep.kind, key))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return asyncio.run(probe.probe_all(config)) if args.probe else 0


def _cmd_config_check(args: argparse.Namespace) -> int:
    config = load_config(args)
    print(f"# config: {config.source} (valid)")
    for name in sorted(config.endpoints):
        ep = config.endpoints[name]
        print(f"[endpoints.{name}]")
        for f in fields(ep):
            value = getattr(ep, f.name)
            if f.name == "name" or value is None or (f.name == "options" and not value):
                continue
            if f.name == "key_env":  # the variable's name only, never its value
                value = f"{value} ({'set' if os.environ.get(value) else 'not set'})"
            print(f"{f.name} = {value!r}")
        print()
    for name in sorted(config.models):
        alias = config.models[name]
        print(f"[models.{name}]")
        print(f"endpoints = {list(alias.endpoints)!r}")
        print(f"model = {alias.model!r}")
        if alias.params:
            print(f"params = {dict(alias.params)!r}")
        for attr in ("price_in", "price_out", "context_tokens"):
            if getattr(alias, attr) is not None:
                print(f"{attr} = {getattr(alias, attr)!r}")
        if alias.reasoning:
            print("reasoning = true")
        print()
    return 0


def _cmd_serve_loopback(args: argparse.Namespace) -> int:
    return loopback_cli.main(args.server_args)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2
