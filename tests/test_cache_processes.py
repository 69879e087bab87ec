"""The cache file shared by real processes: keys computed elsewhere, two
writers at once, a writer killed with SIGKILL mid-run."""
from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from cache.keys import request_key
from cache.store import ResponseCache
from engine.config import Config
from engine.requests import ChatRequest
from engine.resolve import resolve
from providers.base import ChatResult

REPO = Path(__file__).resolve().parents[1]

# A writer: `python -c WRITER path prefix count` puts `count` rows (count 0:
# forever), flushing every 100 and printing how many are committed.
WRITER = r"""
import asyncio, sys
from cache.keys import request_key
from cache.store import ResponseCache
from providers.base import ChatResult

path, prefix, count = sys.argv[1], sys.argv[2], int(sys.argv[3])

def identity(i):
    return {"op": "chat", "kind": "builtin", "base_url": None, "model": prefix,
            "params": {"temperature": 1.0}, "messages": [{"role": "user", "content": f"{prefix} question {i}"}],
            "draw": 0}

async def main():
    async with ResponseCache(path, batch_rows=64) as cache:
        i = 0
        while count == 0 or i < count:
            cache.put(request_key(identity(i)), identity(i), ChatResult(text=f"{prefix} answer {i}"))
            i += 1
            if i % 100 == 0:
                await cache.flush()
                print(i, flush=True)
            if i % 10 == 0:
                await asyncio.sleep(0)
    print("done", flush=True)

asyncio.run(main())
"""


def writer_keys(prefix: str, n: int) -> list[str]:
    return [request_key({"op": "chat", "kind": "builtin", "base_url": None, "model": prefix,
                         "params": {"temperature": 1}, "messages": [{"role": "user", "content": f"{prefix} question {i}"}],
                         "draw": 0}) for i in range(n)]


def start_writer(path: Path, prefix: str, count: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, str(path), prefix, str(count)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def integrity(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


def test_the_key_is_the_same_in_another_process():
    request = ChatRequest(model="gpt-4o", messages=[{"role": "user", "content": "Where was Jackson Ramos? é"}],
                          temperature=1, stop=("\n",), draw=3)
    here = resolve(Config.load(None), request).key
    script = ("from engine.config import Config; from engine.requests import ChatRequest; "
              "from engine.resolve import resolve; "
              "r = ChatRequest(model='gpt-4o', messages=[{'role': 'user', 'content': 'Where was Jackson Ramos? é'}], "
              "temperature=1.0, stop=['\\n'], draw=3); print(resolve(Config.load(None), r).key)")
    for seed in ("1", "987"):
        out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert out.stdout.strip() == here


async def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    path = tmp_path / "shared.sqlite"
    writers = [start_writer(path, prefix, 3000) for prefix in ("alpha", "beta")]
    for w in writers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
        assert out.strip().endswith("done")
    assert integrity(path) == "ok"
    async with ResponseCache(path) as cache:
        for prefix in ("alpha", "beta"):
            keys = writer_keys(prefix, 3000)
            found = await cache.get_many(keys)
            assert len(found) == 3000
            assert found[keys[2999]] == ChatResult(text=f"{prefix} answer 2999")


async def test_a_writer_killed_mid_run_leaves_an_intact_file(tmp_path):
    path = tmp_path / "shared.sqlite"
    doomed = start_writer(path, "doomed", 0)  # writes until killed
    try:
        assert int(doomed.stdout.readline()) >= 100  # it is writing
        survivor = start_writer(path, "survivor", 2000)
        out, err = survivor.communicate(timeout=120)
        assert survivor.returncode == 0, err
        committed = 0
        deadline = time.monotonic() + 60
        while committed < 1000 and time.monotonic() < deadline:
            committed = int(doomed.stdout.readline())
        doomed.send_signal(signal.SIGKILL)  # mid-write: it never stops putting rows
        doomed.wait(timeout=30)
        assert doomed.returncode == -signal.SIGKILL
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait()
    assert integrity(path) == "ok"
    async with ResponseCache(path) as cache:
        assert len(await cache.get_many(writer_keys("survivor", 2000))) == 2000
        # Everything the killed writer had flushed is there.
        assert len(await cache.get_many(writer_keys("doomed", committed))) == committed
        cache.put("k" * 64, {"op": "chat", "model": "after"}, ChatResult(text="still writable"))
    assert integrity(path) == "ok"
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM entries WHERE model = 'after'").fetchone()[0] == 1


# A claimer: claims `count` keys of `prefix` beside the test's own cache, says so, then waits to be killed.
CLAIMER = r"""
import asyncio, sys
from cache.store import ResponseCache
from tests.test_cache_processes import writer_keys

async def main():
    async with ResponseCache(sys.argv[1]) as cache:
        mine = await cache.claim(writer_keys(sys.argv[2], int(sys.argv[3])))
        print(len(mine), flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_the_claims_of_a_process_killed_are_released_at_once(tmp_path):
    path = tmp_path / "c.sqlite"
    keys = writer_keys("held", 20)
    async with ResponseCache(path) as survivor:
        await survivor.claim(writer_keys("own", 1))  # joins first: solo, then shared beside the claimer
        claimer = subprocess.Popen([sys.executable, "-c", CLAIMER, str(path), "held", "20"], cwd=REPO,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert claimer.stdout is not None  # read off the loop: the survivor must answer the newcomer meanwhile
            assert (await asyncio.to_thread(claimer.stdout.readline)).strip() == "20"
            assert await survivor.claim(keys) == set()  # held by a live process: not ours
            claimer.send_signal(signal.SIGKILL)
            claimer.wait(timeout=30)
        finally:
            if claimer.poll() is None:
                claimer.kill()
        # Its session and its claims go at once, not after the lease (LEASE seconds): all 20 are ours now.
        assert survivor.lease >= 10 and await survivor.claim(keys) == set(keys)
