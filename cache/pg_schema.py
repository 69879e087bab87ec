"""The PostgreSQL cache's schema, its version, and the one-line errors of
connecting to it (cache/postgres.py uses them; `tulving cache copy` too).

Every table lives in the PostgreSQL schema `tulving` of the database the URL
names (so a shared database's own tables are never in the way); the columns
are the SQLite store's (cache/store.py, cache/batches.py) with PostgreSQL
types. `schema_version` holds one row: the version of this layout; a
database written by a newer Tulving is refused in one line.

    psql "$URL" -c "SELECT model, count(*) FROM tulving.entries GROUP BY model"
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from cache.location import redact
from cache.store import CacheError, _Entry

if TYPE_CHECKING:
    import asyncpg

SCHEMA_VERSION = 1
SCHEMA_NAME = "tulving"
_CREATE_LOCK = 0x7475_6C76  # advisory lock id ("tulv"): one process creates the schema at a time

DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA_NAME};
SET search_path TO {SCHEMA_NAME};
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    op TEXT NOT NULL,
    model TEXT NOT NULL,
    kind TEXT,
    base_url TEXT,
    created_at TEXT NOT NULL,
    response TEXT NOT NULL,
    vectors BYTEA,
    vector_dtype TEXT,
    vector_count INTEGER,
    identity TEXT NOT NULL,
    checksum TEXT
);
CREATE INDEX IF NOT EXISTS entries_by_model ON entries (op, model);
CREATE INDEX IF NOT EXISTS entries_by_time ON entries (created_at);
CREATE TABLE IF NOT EXISTS blobs (digest TEXT PRIMARY KEY, size INTEGER NOT NULL, text TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, owner TEXT NOT NULL, lease_until TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY,
    endpoint TEXT NOT NULL,
    kind TEXT NOT NULL,
    base_url TEXT,
    model TEXT,
    state TEXT NOT NULL,
    counts TEXT,
    requests INTEGER NOT NULL,
    submitted_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batch_keys (batch_id TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (batch_id, key));
CREATE INDEX IF NOT EXISTS batch_keys_by_key ON batch_keys (key);
CREATE TABLE IF NOT EXISTS spending (
    run TEXT NOT NULL,
    invocation TEXT NOT NULL,
    label TEXT NOT NULL,
    spent_usd DOUBLE PRECISION NOT NULL,
    calls INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (run, invocation)
);
"""
# The newest table of DDL: a database of this version without it (made by a
# Tulving before the spending ledger) gains it when opened; the version stays,
# as older Tulvings ignore the table.
NEWEST_TABLE = "spending"

INSERT_ENTRIES = (
    "INSERT INTO entries (key, op, model, kind, base_url, created_at, response, vectors, vector_dtype, vector_count, "
    "identity, checksum) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], "
    "$7::text[], $8::bytea[], $9::text[], $10::int[], $11::text[], $12::text[]) ON CONFLICT (key) DO NOTHING")
INSERT_BLOBS = ("INSERT INTO blobs (digest, size, text) SELECT * FROM unnest($1::text[], $2::int[], $3::text[]) "
                "ON CONFLICT (digest) DO NOTHING")
_Blobs = dict[str, tuple[str, int]]  # digest -> (text, bytes)


class CacheUnavailable(CacheError):
    """The database went away mid-run and did not come back in time:
    results could not be stored there (exit 5, as for a full disk)."""

    exit_code = 5


def connect_error(url: str, exc: BaseException) -> CacheError:
    """The one line for a database the URL does not reach: which, and why
    (never the password)."""
    reason = str(exc).strip() or type(exc).__name__
    password = _password(url)
    if password:
        reason = reason.replace(password, "***")
    name = type(exc).__name__
    if name == "InvalidPasswordError" or "password authentication failed" in reason:
        hint = "check the user and password (in the URL, $PGPASSWORD or ~/.pgpass)"
    elif name == "InvalidCatalogNameError":
        hint = "create the database first (createdb), or name an existing one"
    elif isinstance(exc, (OSError, TimeoutError)):
        hint = "is PostgreSQL running there, and is the host and port right?"
    else:
        hint = "check the URL (postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE)"
    return CacheError(f"cannot open the cache database {redact(url)}: {' '.join(reason.split())}; {hint}")


def _password(url: str) -> str | None:
    from urllib.parse import parse_qs, urlsplit

    try:
        parts = urlsplit(url)
        if parts.password:
            return parts.password
        given = parse_qs(parts.query).get("password")
        return given[0] if given else None
    except ValueError:
        return None


async def ensure_schema(conn: asyncpg.Connection, url: str) -> None:
    """Create the tables on first use (one process at a time: an advisory
    lock), or check that the version found is one this Tulving reads."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _CREATE_LOCK)
        await conn.execute(DDL)
        version = await conn.fetchval("SELECT max(version) FROM schema_version")
        if version is None:
            await conn.execute("INSERT INTO schema_version (version) VALUES ($1)", SCHEMA_VERSION)
        elif version > SCHEMA_VERSION:
            raise CacheError(f"the cache database {redact(url)} was written by a newer Tulving (schema version "
                             f"{version}, this one reads {SCHEMA_VERSION}): upgrade Tulving")


async def check_schema(conn: asyncpg.Connection, url: str) -> None:
    """Before creating anything: a newer schema is refused without taking
    the creation lock (an older Tulving must not touch a newer layout)."""
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{SCHEMA_NAME}.schema_version")
    if exists:
        version = await conn.fetchval(f"SELECT max(version) FROM {SCHEMA_NAME}.schema_version")
        if version is not None and version > SCHEMA_VERSION:
            raise CacheError(f"the cache database {redact(url)} was written by a newer Tulving (schema version "
                             f"{version}, this one reads {SCHEMA_VERSION}): upgrade Tulving")
        newest = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{SCHEMA_NAME}.{NEWEST_TABLE}")
        if version == SCHEMA_VERSION and newest:
            return
    await ensure_schema(conn, url)


async def open_pool(url: str, *, max_size: int = 4) -> asyncpg.Pool:
    """A pool of connections to `url`, the schema made or checked; a
    CacheError (one line) when the database cannot be reached."""
    try:
        import asyncpg
    except ImportError:
        raise CacheError("a postgresql:// cache needs the asyncpg driver: pip install 'tulving-bench[postgres]'") from None
    try:
        first = await asyncpg.connect(url, timeout=10)
        try:
            await check_schema(first, url)
        finally:
            await first.close()
        # While the server is away the pool logs a traceback each time it fails to reconnect;
        # the cache says the outage in one line of its own (cache/postgres.py).
        logging.getLogger("asyncpg.pool").setLevel(logging.ERROR)
        pool = await asyncpg.create_pool(url, min_size=1, max_size=max_size, timeout=10,
                                         server_settings={"search_path": SCHEMA_NAME})
    except CacheError:
        raise
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise connect_error(url, exc) from None
    assert pool is not None  # create_pool returns the pool once initialised
    return pool


async def insert_rows(conn: asyncpg.Connection, entries: Sequence[_Entry], blobs: _Blobs,
                      replace: Sequence[str] = ()) -> int:
    """Store entries (ENTRY_COLUMNS order) and chunks; existing keys are
    kept (`replace`: keys whose damaged rows are deleted first). Returns the
    entries inserted. The caller holds the transaction."""
    if replace:
        await conn.execute("DELETE FROM entries WHERE key = ANY($1::text[])", list(replace))
    if blobs:
        digests = list(blobs)
        await conn.execute(INSERT_BLOBS, digests, [blobs[d][1] for d in digests], [blobs[d][0] for d in digests])
    if not entries:
        return 0
    columns = [list(column) for column in zip(*entries, strict=True)]
    status = await conn.execute(INSERT_ENTRIES, *columns)
    return int(status.rsplit(" ", 1)[-1])
