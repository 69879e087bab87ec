"""The response cache named by the config file's [cache] section, through the
CLI (in this process, tests/cli.py) against a real PostgreSQL server: the URL in the file,
the password from the variable `password_env` names or from a password file
($PGPASSFILE), never from the file; `--cache` overrides it; a password
written in the file, or a named variable left unset, is one line."""
from __future__ import annotations

import json
import os
from pathlib import Path

from cache.location import split_password
from tests import cli
from tests.test_run_cli import REPO

SAMPLE = "12"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No cache named by the environment, no password in it, the user's folders in tmp_path."""
    e = {k: v for k, v in os.environ.items()
         if k not in ("TULVING_CONFIG", "TULVING_CACHE", "PGPASSWORD", "PGPASSFILE", "CACHE_PW")}
    e.update(PYTHONPATH=str(REPO), XDG_CACHE_HOME=str(tmp_path / "xdg-cache"),
             XDG_CONFIG_HOME=str(tmp_path / "xdg-config"), HOME=str(tmp_path / "home"), **extra)
    return e


def _tulving(tmp_path: Path, environ: dict[str, str], *args: str) -> cli.Done:
    """The command in this process (tests/cli.py), with exactly `environ` as its environment."""
    return cli.tulving(tmp_path, *args, env=environ)


def _run(tmp_path: Path, environ: dict[str, str], out: str, *global_args: str) -> cli.Done:
    return _tulving(tmp_path, environ, "--quiet", "--config", "tulving.toml", *global_args, "run", "--book",
                    "synaptic-echoes-short", "--models", "builtin:reader", "--modes", "in-context", "--judge",
                    "builtin:judge", "--sample", SAMPLE, "--out", out)


def _calls(tmp_path: Path, out: str) -> int:
    return int(json.loads((tmp_path / out / "run.json").read_text())["engine"]["calls"])


def _config(tmp_path: Path, text: str) -> None:
    (tmp_path / "tulving.toml").write_text(text)


def test_the_config_names_a_postgresql_cache_with_its_password_in_a_variable(tmp_path, pg_url):
    url, password = split_password(pg_url)
    assert password
    _config(tmp_path, f'[cache]\nurl = "{url}"\npassword_env = "CACHE_PW"\n')
    environ = _env(tmp_path, CACHE_PW=password)
    first = _run(tmp_path, environ, "first")
    assert first.returncode == 0, first.stderr
    assert _calls(tmp_path, "first") > 0
    again = _run(tmp_path, environ, "again")  # the same database: every answer is cached
    assert again.returncode == 0, again.stderr
    assert _calls(tmp_path, "again") == 0
    assert not (tmp_path / "xdg-cache").exists()  # the default SQLite cache was never made
    over = _run(tmp_path, environ, "over", "--cache", "own.sqlite")  # --cache overrides the file
    assert over.returncode == 0, over.stderr
    assert _calls(tmp_path, "over") == _calls(tmp_path, "first") and (tmp_path / "own.sqlite").exists()
    check = _tulving(tmp_path, environ, "--config", "tulving.toml", "config", "check")
    assert check.returncode == 0, check.stderr
    assert f'url = "{url}"' in check.stdout and 'password_env = "CACHE_PW"  # set' in check.stdout
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.name != "tulving.toml":
            assert password.encode() not in path.read_bytes(), path
    assert password not in first.stderr + again.stderr + check.stdout


def test_the_password_may_come_from_a_password_file(tmp_path, pg_url):
    url, password = split_password(pg_url)
    _config(tmp_path, f'[cache]\nurl = "{url}"\n')
    no_password = _run(tmp_path, _env(tmp_path), "refused")
    assert no_password.returncode == 2
    [line] = no_password.stderr.strip().splitlines()
    assert line.startswith("tulving: error: cannot open the cache database") and "$PGPASSWORD or ~/.pgpass" in line
    passfile = tmp_path / "pgpass"
    passfile.write_text(f"*:*:*:*:{password}\n")
    passfile.chmod(0o600)
    result = _run(tmp_path, _env(tmp_path, PGPASSFILE=str(passfile)), "run")
    assert result.returncode == 0, result.stderr
    assert _calls(tmp_path, "run") > 0


def test_a_relative_sqlite_path_is_the_config_files_folders(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "tulving.toml").write_text('[cache]\nurl = "team.sqlite"\n')
    result = _tulving(tmp_path, _env(tmp_path), "--quiet", "--config", "conf/tulving.toml", "run", "--book",
                      "synaptic-echoes-short", "--models", "builtin:reader", "--modes", "in-context", "--judge",
                      "builtin:judge", "--sample", SAMPLE, "--out", "out")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "conf" / "team.sqlite").exists() and not (tmp_path / "team.sqlite").exists()


def test_a_password_in_the_file_or_an_unset_variable_is_one_line(tmp_path):
    _config(tmp_path, '[cache]\nurl = "postgresql://tulving:hunter2@127.0.0.1:1/tulving"\n')
    result = _run(tmp_path, _env(tmp_path), "out")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert "holds a password" in line and "hunter2" not in result.stderr + result.stdout
    _config(tmp_path, '[cache]\nurl = "postgresql://tulving@127.0.0.1:1/tulving"\npassword_env = "CACHE_PW"\n')
    result = _run(tmp_path, _env(tmp_path), "out")
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert line == ("tulving: error: the [cache] section says the database password is in $CACHE_PW, "
                    "which is not set")
    _config(tmp_path, '[cache]\nurl = "postgresql://tulving@127.0.0.1:1/tulving"\nuser = "x"\n')
    result = _tulving(tmp_path, _env(tmp_path), "--config", "tulving.toml", "config", "check")
    assert result.returncode == 2 and "[cache] has unknown key(s) ['user']" in result.stderr
    assert not (tmp_path / "out").exists() and not any(p.name.startswith("postgresql") for p in tmp_path.iterdir())
