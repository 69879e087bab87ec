"""A real PostgreSQL server for the tests: $TULVING_TEST_PG_URL (a superuser
URL; .ci/run starts a throwaway cluster and sets it), or a cluster of the
tests' own (initdb in a temp folder, a free port on 127.0.0.1, password
authentication), made from Debian's postgresql binaries when present.

Without either, the tests that need PostgreSQL skip, except in CI
(CI=true), where they FAIL: a skip must never hide a failure there.

    url = pg_server            # session: the server (a superuser URL)
    url = pg_url               # a fresh database on it, dropped afterwards
    cluster = own_pg_cluster   # a cluster of its own, for tests that stop and start it
"""
from __future__ import annotations

import asyncio
import atexit
import functools
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

PASSWORD = "pg-test-Secr3t"


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _folder() -> Path:
    """A folder the postgres user can reach (pytest's tmp_path is root's alone)."""
    return Path(tempfile.mkdtemp(prefix="tulving-pg-"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """initdb + pg_ctl in `base`, run as the postgres user when we are root
    (initdb refuses root)."""

    def __init__(self, base: Path):
        bin_dir = _bin_dir()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL binaries (initdb): apt-get install postgresql")
        self.bin, self.base, self.port = bin_dir, base, _free_port()
        self.data = base / "data"
        self.url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=120)

    def init(self) -> Cluster:
        """A new cluster, started: a copy of the session's initdb'ed one (initdb
        takes seconds, a copy of its data folder a fraction of one)."""
        self.base.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
        self._run("cp", "-a", str(_template_data()), str(self.data))  # owner and 0700 kept
        return self.start()

    def initdb(self) -> None:
        """initdb into `data`: the superuser postgres, PASSWORD for TCP."""
        self.base.mkdir(parents=True, exist_ok=True)
        (self.base / "pw").write_text(PASSWORD + "\n")
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
            shutil.chown(self.base / "pw", "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", f"--pwfile={self.base / 'pw'}",
                  "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8")

    def start(self) -> Cluster:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.base / "log"), "-w", "-o",
                  f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        return self

    def stop(self, mode: str = "immediate") -> None:
        """pg_ctl stop: "immediate" (as if it crashed) or "fast" (as an administrator stops it)."""
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")


@functools.cache
def _template_data() -> Path:
    """A data folder initdb'ed once per session (never started), which each
    cluster copies; removed at exit."""
    template = Cluster(_folder())
    atexit.register(shutil.rmtree, template.base, ignore_errors=True)
    template.initdb()
    return template.data


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


async def _admin(url: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is needed in CI: {why}")
    pytest.skip(f"no PostgreSQL: {why}")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    given = os.environ.get("TULVING_TEST_PG_URL")
    if given:
        yield given
        return
    if _bin_dir() is None:
        _unavailable("set TULVING_TEST_PG_URL, or install Debian's postgresql package")
    cluster = Cluster(_folder())
    try:
        cluster.init()
    except (subprocess.CalledProcessError, OSError) as exc:
        _unavailable(f"could not start a cluster ({exc})")
    try:
        yield cluster.url
    finally:
        cluster.stop()
        shutil.rmtree(cluster.base, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh database (created by the server's superuser), dropped after the test."""
    name = f"tulving_test_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(pg_server, f"CREATE DATABASE {name}"))
    try:
        yield with_database(pg_server, name)
    finally:
        asyncio.run(_admin(pg_server, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture
def own_pg_cluster() -> Iterator[Cluster]:
    """A cluster of the test's own, which it may stop and start again."""
    if _bin_dir() is None:
        _unavailable("install Debian's postgresql package")
    cluster = Cluster(_folder())
    cluster.init()
    try:
        yield cluster
    finally:
        try:
            cluster.stop()
        except subprocess.CalledProcessError:
            pass  # already stopped by the test
        shutil.rmtree(cluster.base, ignore_errors=True)
