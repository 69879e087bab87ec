"""The config file's [cache] section: which response cache commands use when
neither --cache nor $TULVING_CACHE names one.

    [cache]
    url = "postgresql://tulving@dbhost/tulving"   # or a SQLite file: "~/caches/team.sqlite"
    password_env = "TULVING_CACHE_PASSWORD"       # the variable holding the database password

A config file is often shared or committed, so it never holds the password:
a URL with one is refused in one line. The password comes from the variable
`password_env` names, else from $PGPASSWORD or the password file
(~/.pgpass, or the one $PGPASSFILE names), where the driver looks for it.
A relative SQLite path is taken from the config file's folder.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from cache.location import is_postgres_url, redact, split_password
from engine.errors import TulvingError

# Every key of the [cache] table: (type, default, meaning), for `tulving config reference`.
CACHE_KEYS: dict[str, tuple[str, str, str]] = {
    "url": ("postgresql:// URL or SQLite path", "$TULVING_CACHE, else ~/.cache/tulving/cache.sqlite",
            "the response cache (--cache overrides it); a URL holds no password"),
    "password_env": ("string", "none", "environment variable holding the database password (else $PGPASSWORD "
                     "or the password file, ~/.pgpass or $PGPASSFILE)"),
}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CacheSectionError(TulvingError):
    """A malformed [cache] section; the message is one line."""


@dataclass(frozen=True, slots=True)
class CacheSettings:
    url: str | None = None           # a postgresql:// URL (no password) or an absolute SQLite path
    password_env: str | None = None  # the variable holding the database password

    def password(self) -> str | None:
        """The password from `password_env` (None when no variable is named);
        a named variable that is unset is one line."""
        if self.password_env is None:
            return None
        value = os.environ.get(self.password_env)
        if not value:
            raise CacheSectionError(f"the [cache] section says the database password is in ${self.password_env}, "
                                    f"which is not set")
        return value


def cache_settings(data: dict[str, object], source: Path) -> CacheSettings:
    """The [cache] table of the config file `source` (already read), checked."""
    table = data.get("cache")
    if table is None:
        return CacheSettings()
    if not isinstance(table, dict):
        raise CacheSectionError(f"{source}: cache must be a table ([cache] with url = ...), got {table!r}")
    unknown = set(table) - set(CACHE_KEYS)
    if unknown:
        raise CacheSectionError(f"{source}: [cache] has unknown key(s) {sorted(unknown)} (expected url, password_env)")
    return CacheSettings(url=_url(table.get("url"), source), password_env=_env_name(table.get("password_env"), source))


def _url(value: object, source: Path) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or any(ord(c) < 32 for c in value):
        raise CacheSectionError(f"{source}: [cache] url must be a postgresql:// URL or a file path, "
                                f"got {redact(value) if isinstance(value, str) else value!r}")
    if is_postgres_url(value):
        if split_password(value)[1] is not None:
            raise CacheSectionError(f"{source}: [cache] url {redact(value)} holds a password: remove it from the "
                                    f"file and give it in the variable password_env names, $PGPASSWORD or "
                                    f"~/.pgpass ($PGPASSFILE)")
        return value
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else source.parent / path)


def _env_name(value: object, source: Path) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _ENV_NAME.fullmatch(value):
        raise CacheSectionError(f"{source}: [cache] password_env must be an environment variable's name, "
                                f"got {value!r}")
    return value
