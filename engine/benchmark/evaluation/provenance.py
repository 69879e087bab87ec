"""What a run was made with, so a result can be audited and reproduced:
run.json's and scores.json's `provenance`.

    record = provenance(config, ["gpt-4o", "builtin:judge"], argv=sys.argv[1:], started=t0, ended=t1,
                        cache="~/.cache/tulving/cache.sqlite")

It holds Tulving's version and git commit (when run from a checkout, else
null), the command line with anything that looks like a secret replaced by
"<redacted>", start and end times (UTC ISO 8601), Python, the machine, the
versions of the packages that change results or calls, the cache file, and the
resolved configuration of every model used: endpoint name, kind and base URL
(without user info or query), the provider's model id, params and prices.
Never an API key: keys live in environment variables, which are not read here
except to redact their values from the command line.
"""
from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TypedDict
from urllib.parse import urlsplit, urlunsplit

import engine
from engine.config import Config

# The packages whose version changes what a run sends or computes.
KEY_PACKAGES = ("aiohttp", "numpy", "scipy", "openai", "anthropic", "llama-cpp-python")
PRICE_KEYS = ("price_in", "price_out", "price_cached_in", "price_cache_write", "batch_discount", "checked")
REDACTED = "<redacted>"
# Tokens shaped like provider keys (sk-..., sk-ant-..., key-..., hf_...) or long opaque secrets.
_KEY_SHAPED = re.compile(r"(sk-[A-Za-z0-9_\-]{8,}|sk_[A-Za-z0-9_\-]{8,}|hf_[A-Za-z0-9]{16,}|"
                         r"key-[A-Za-z0-9]{16,}|[A-Za-z0-9_\-]{40,})")
_SECRET_ENV = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD", re.IGNORECASE)
_SECRET_PARAM = re.compile(r"api_key|secret|password|authorization", re.IGNORECASE)
_SECRET_OPTION = re.compile(r"^--?[\w-]*(key|token|secret|password)[\w-]*$", re.IGNORECASE)


class ModelProvenance(TypedDict):
    endpoints: list[dict[str, str | None]]   # name, kind, base_url of each endpoint the alias may use
    model: str                        # the provider's model id
    params: dict[str, object]
    prices: dict[str, object]


def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def git_commit(root: Path | None = None) -> str | None:
    """The commit of the checkout Tulving runs from (with "-dirty" when it has
    uncommitted changes), None when it is not run from a checkout."""
    root = root or Path(engine.__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def package_versions(names: Iterable[str] = KEY_PACKAGES) -> dict[str, str]:
    """Installed versions of `names` (those not installed are left out)."""
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def _secret_values() -> list[str]:
    """Values of the environment variables that hold secrets (long enough to be one)."""
    return [v for k, v in os.environ.items() if _SECRET_ENV.search(k) and len(v) >= 8]


def redact_argv(argv: Sequence[str]) -> list[str]:
    """The command line with key-like tokens, values of secret environment
    variables, and the values of options named like a key replaced."""
    secrets = _secret_values()
    out: list[str] = []
    hide_next = False
    for token in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        name, eq, value = token.partition("=")
        if _SECRET_OPTION.match(name):
            out.append(f"{name}={REDACTED}" if eq else name)
            hide_next = not eq
            continue
        for secret in secrets:
            token = token.replace(secret, REDACTED)
        out.append(_KEY_SHAPED.sub(REDACTED, token))
    return out


def public_url(url: str | None) -> str | None:
    """A base URL without user info, query or fragment (where a key could hide)."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def model_provenance(config: Config, name: str) -> ModelProvenance:
    alias = config.alias(name)
    return {"endpoints": [{"name": ep.name, "kind": ep.kind, "base_url": public_url(ep.base_url)}
                          for ep in config.endpoints_of(alias)],
            "model": alias.model,
            "params": {k: v for k, v in alias.params.items() if not _SECRET_PARAM.search(k)},
            "prices": {k: getattr(alias, k) for k in PRICE_KEYS if getattr(alias, k, None) is not None}}


def provenance(config: Config, models: Iterable[str], *, argv: Sequence[str], started: str, ended: str,
               cache: str | None) -> dict[str, object]:
    """run.json's `provenance` (see the module docstring)."""
    return {
        "tulving_version": engine.__version__,
        "git_commit": git_commit(),
        "command": ["tulving", *redact_argv(argv)],
        "started": started,
        "ended": ended,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "packages": package_versions(),
        "cache": str(Path(cache).resolve()) if cache else None,
        "config": config.source,
        "models": {name: model_provenance(config, name) for name in dict.fromkeys(models)},
    }


def command_line() -> list[str]:
    """This process's arguments (the CLI's), as `provenance` takes them."""
    return list(sys.argv[1:])
