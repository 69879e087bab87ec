"""Which processes claim calls in one SQLite cache file, so that a process
alone on the file need not write a claim row per call.

A claim row per call (cache/store.py `_claim_rows`) costs about 10 us of
CPU a call on the claims thread, a tenth of a zero-latency call
(docs/measured.md). It only matters when another process shares the file.
So a cache that claims first joins a `sessions` table (format version
unchanged: created when first used):

    sessions (owner TEXT PRIMARY KEY, place TEXT NOT NULL, pid INTEGER NOT NULL,
              lease_until REAL NOT NULL, shared INTEGER NOT NULL)

- Joining alone (no live session but its own): `shared = 0`, the process
  is *solo*: `claim` takes its keys in memory, writing nothing.
- Joining beside others: `shared = 1`, and before its first claim it waits
  until every other live session has `shared = 1` (`unacked`).
- A solo process looks for newcomers every WATCH_SECONDS (`others_present`);
  finding one, it writes claim rows for every key it holds in memory and
  sets `shared = 1` in one transaction (`go_shared`), then claims as usual.

No call is paid twice: the newcomer claims nothing until the solo process
has written down what it holds, and the solo process decides "solo" for a
key only before it has published that it is not. A session lapses like a
claim (its lease is renewed while its process lives); one whose process is
gone from this machine (same host and pid namespace, no such pid) is
dropped at once, with its claims (`release_dead`, looked for whenever a claim
finds keys claimed by another process), so a run killed with SIGKILL holds up
neither the next one nor one running beside it.
"""
from __future__ import annotations

import os
import socket
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager

import orjson

SESSIONS_SCHEMA = ("CREATE TABLE IF NOT EXISTS sessions (owner TEXT PRIMARY KEY, place TEXT NOT NULL, "
                   "pid INTEGER NOT NULL, lease_until REAL NOT NULL, shared INTEGER NOT NULL)")
WATCH_SECONDS = 0.1  # how often a solo process looks for a newcomer (the newcomer waits this long, at most)


def this_place() -> str:
    """The machine and pid namespace of this process: a pid means this
    process's neighbour only when the place is the same."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}|{namespace}"


@contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """A `BEGIN IMMEDIATE` transaction (the write lock taken at once), committed or rolled back."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite may have rolled back already (a failed write)
            conn.execute("ROLLBACK")
        raise


def _gone(place: str, pid: int, here: str) -> bool:
    if place != here or pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def _drop_dead(conn: sqlite3.Connection, owner: str, now: float) -> list[tuple[str, int]]:
    """Delete lapsed sessions and those of processes gone from this machine;
    the others' (owner's excluded) shared flags."""
    conn.execute("DELETE FROM sessions WHERE lease_until < ?", (now,))
    here = this_place()
    live: list[tuple[str, int]] = []
    for other, place, pid, shared in conn.execute(
            "SELECT owner, place, pid, shared FROM sessions WHERE owner != ?", (owner,)).fetchall():
        if _gone(place, pid, here):  # its claims go with it (release_dead)
            conn.execute("DELETE FROM claims WHERE owner = ?", (other,))
            conn.execute("DELETE FROM sessions WHERE owner = ?", (other,))
        else:
            live.append((other, shared))
    return live


def release_dead(conn: sqlite3.Connection, owner: str) -> int:
    """Drop the sessions of processes gone from this machine (killed, even
    with SIGKILL), and their claims with them, at once rather than when
    their leases lapse (up to `lease` seconds of nothing sent by the
    survivor); inside the caller's write transaction. Returns how many
    claims were released."""
    here = this_place()
    released = 0
    for other, place, pid in conn.execute("SELECT owner, place, pid FROM sessions WHERE owner != ?",
                                          (owner,)).fetchall():
        if _gone(place, pid, here):
            released += conn.execute("DELETE FROM claims WHERE owner = ?", (other,)).rowcount
            conn.execute("DELETE FROM sessions WHERE owner = ?", (other,))
    return released


def join(conn: sqlite3.Connection, owner: str, lease: float) -> bool:
    """Add this cache's session; True when no other live session exists
    (the process is solo). The table exists (SESSIONS_SCHEMA, made at open)."""
    now = time.time()
    with _immediate(conn):
        alone = not _drop_dead(conn, owner, now)
        conn.execute("INSERT OR REPLACE INTO sessions (owner, place, pid, lease_until, shared) VALUES (?, ?, ?, ?, ?)",
                     (owner, this_place(), os.getpid(), now + lease, 0 if alone else 1))
    return alone


def unacked(conn: sqlite3.Connection, owner: str) -> int:
    """How many other live sessions are still solo (hold keys they have not written down)."""
    with _immediate(conn):
        return sum(1 for _, shared in _drop_dead(conn, owner, time.time()) if not shared)


def others_present(conn: sqlite3.Connection, owner: str) -> bool:
    """Whether another live session has joined (a read, no lock)."""
    row = conn.execute("SELECT 1 FROM sessions WHERE owner != ? AND lease_until >= ? LIMIT 1",
                       (owner, time.time())).fetchone()
    return row is not None


def go_shared(conn: sqlite3.Connection, owner: str, lease: float, held: list[str], *, by_json: bool = True) -> None:
    """Write a claim row for every key this solo process holds and mark its
    session shared, in one transaction (what a newcomer waits for).
    `by_json`: the keys go in as one JSON array (False: an SQLite without
    JSON functions, row by row)."""
    now = time.time()
    with _immediate(conn):
        if held and by_json:
            keys = orjson.dumps(held)
            conn.execute("DELETE FROM claims WHERE lease_until < ? AND key IN (SELECT value FROM json_each(?))",
                         (now, keys))
            conn.execute("INSERT OR IGNORE INTO claims (key, owner, lease_until) SELECT value, ?, ? FROM json_each(?)",
                         (owner, now + lease, keys))
        elif held:
            conn.executemany("DELETE FROM claims WHERE lease_until < ? AND key = ?", [(now, k) for k in held])
            conn.executemany("INSERT OR IGNORE INTO claims (key, owner, lease_until) VALUES (?, ?, ?)",
                             [(k, owner, now + lease) for k in held])
        conn.execute("UPDATE sessions SET shared = 1, lease_until = ? WHERE owner = ?", (now + lease, owner))


def renew(conn: sqlite3.Connection, owner: str, lease: float) -> None:
    conn.execute("UPDATE sessions SET lease_until = ? WHERE owner = ?", (time.time() + lease, owner))


def leave(conn: sqlite3.Connection, owner: str) -> None:
    conn.execute("DELETE FROM sessions WHERE owner = ?", (owner,))
