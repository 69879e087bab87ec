"""A worker process seen from asyncio: start it, call it, cancel a call,
notice its death, close it.

    worker = WorkerProcess("providers.llama_worker")
    await worker.start()
    reply = await worker.call({"op": "chat", ...})   # raises WorkerDied
    await worker.close()

The worker is `python -m <module>` (from this copy of the package) speaking
the frames of providers/worker_pipe.py on its stdin/stdout, one reply per
call (matched by the "id" this side adds), optionally preceded by
{"id", "started": True} when it begins the call. A reader task resolves the waiting calls; nothing blocks
the event loop. When the worker's stdout ends (it crashed, was killed, or
exited) every call still waiting fails with `WorkerDied`, saying how it died
(the signal's name, e.g. "SIGSEGV", or the exit code) and whether that call
was the one running. The worker stays dead: the owner starts a new one.

A cancelled call sends {"op": "cancel", "id"} and returns at once; its late
reply is dropped. A worker that still owes replies to two cancelled calls is
taken for hung and killed.

Orphans: the worker must exit when its stdin ends (llama_worker does, at once,
even mid-call). The pipe closes when this process exits or dies, SIGKILL
included, so a worker never outlives its parent; `close()` closes stdin, waits
`grace` seconds, then kills.
"""
from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from providers.worker_pipe import encode, read_frame

log = logging.getLogger(__name__)

_ROOT = str(Path(__file__).resolve().parents[1])  # the folder holding this `providers` package
# `python -m <module>`, from this copy of the package whatever the child's
# sys.path finds first: the root goes in front only when the package would
# not come from it (in front of the standard library it could shadow it).
_BOOTSTRAP = ("import importlib.util, os, runpy, sys; root, module = sys.argv[1], sys.argv[2]; "
              "spec = importlib.util.find_spec(module.partition('.')[0]); "
              "found = [os.path.dirname(os.path.realpath(p)) "
              "for p in (spec and spec.submodule_search_locations or [])]; "
              "os.path.realpath(root) in found or sys.path.insert(0, root); del sys.argv[1:3]; "
              "runpy.run_module(module, run_name='__main__', alter_sys=True)")
STDERR_TAIL = 4096   # bytes of the worker's stderr kept for the death report
MAX_ABANDONED = 2    # cancelled calls still unanswered before the worker counts as hung


class WorkerDied(Exception):
    """The worker process ended while this call waited for its reply."""

    def __init__(self, how: str, *, running: bool, stderr: str = ""):
        super().__init__(how)
        self.how = how            # "SIGSEGV", "SIGKILL", "exit code 1", ...
        self.running = running    # the worker had started this call
        self.stderr = stderr      # the end of its stderr

    @property
    def last_line(self) -> str:
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        return lines[-1][:200] if lines else ""


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "closed its output"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _where(stderr: str) -> str:
    """Where a crash happened, from faulthandler's report: the innermost frame
    of the crashing thread, or ""."""
    _, found, after = stderr.rpartition("Current thread")
    frames = [line.strip() for line in after.splitlines()[1:] if line.strip().startswith("File ")]
    return f" in {frames[0]}" if found and frames else ""


class WorkerProcess:
    def __init__(self, module: str, *, env: Mapping[str, str] | None = None):
        self.module = module
        self._env = dict(env or {})
        self._proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._abandoned: set[int] = set()
        self._running: int | None = None
        self._stderr: collections.deque[bytes] = collections.deque()  # chunks, at most STDERR_TAIL bytes in all
        self._stderr_size = 0
        self._tasks: list[asyncio.Task[None]] = []
        self.death: str | None = None       # set once the worker is gone
        self._killed = False

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def dead(self) -> bool:
        """Gone, or going: killed here, its end not yet read."""
        return self.death is not None or self._killed

    async def start(self) -> None:
        env = dict(os.environ)
        env.update(self._env)
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _BOOTSTRAP, _ROOT, self.module, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read_replies(), name=f"worker:{self._proc.pid}:out"),
                       loop.create_task(self._read_stderr(), name=f"worker:{self._proc.pid}:err")]

    async def call(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one call and wait for its reply. Raises WorkerDied."""
        if self.dead or self._proc is None:
            how = self.death or ("killed" if self._killed else "not started")
            raise WorkerDied(how, running=False)
        stdin = self._proc.stdin
        assert stdin is not None  # started with stdin=PIPE
        call_id = next(self._ids)
        reply: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = reply
        try:
            try:
                stdin.write(encode({**message, "id": call_id}))
                await stdin.drain()
            except (ConnectionError, RuntimeError):  # the pipe broke: the reader tells how the worker died
                pass
            return await reply
        except asyncio.CancelledError:
            self._pending.pop(call_id, None)
            self._cancel(call_id)
            raise

    def _cancel(self, call_id: int) -> None:
        if self.dead:
            return
        self._abandoned.add(call_id)
        if len(self._abandoned) >= MAX_ABANDONED:
            log.warning("worker %s owes replies to %d cancelled calls: killing it", self.pid, len(self._abandoned))
            self.kill()
            return
        assert self._proc is not None and self._proc.stdin is not None  # a call was sent: started, stdin=PIPE
        try:
            self._proc.stdin.write(encode({"op": "cancel", "id": call_id}))
        except (ConnectionError, RuntimeError):
            pass

    def kill(self) -> None:
        self._killed = True
        if self._proc is not None and self._proc.returncode is None:
            try:
                self._proc.kill()
            except ProcessLookupError:
                pass

    async def _read_replies(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None  # started (with stdout=PIPE) before this task
        try:
            while True:
                message = await read_frame(proc.stdout)
                if message is None:
                    break
                call_id: int | None = message.get("id")
                if message.get("started"):
                    self._running = call_id
                    continue
                if self._running == call_id:
                    self._running = None
                self._abandoned.discard(call_id)
                reply = None if call_id is None else self._pending.pop(call_id, None)
                if reply is not None and not reply.done():
                    reply.set_result(message)
        except Exception as exc:  # noqa: BLE001 -- a garbled frame: this worker is unusable
            log.error("worker %s sent a bad frame (%s): killing it", proc.pid, exc)
            self.kill()
        returncode = await proc.wait()
        await asyncio.wait(self._tasks[1:], timeout=1.0)  # the rest of its stderr
        self.death = describe_exit(returncode)
        stderr = b"".join(self._stderr).decode("utf-8", "replace")
        if returncode != 0:
            log.warning("worker process %s (%s) died (%s)%s", proc.pid, self.module, self.death, _where(stderr))
            log.debug("worker process %s: its stderr ended with:\n%s", proc.pid, stderr)
        pending, self._pending = self._pending, {}
        for call_id, reply in pending.items():
            if not reply.done():
                reply.set_exception(WorkerDied(self.death, running=call_id == self._running, stderr=stderr))

    async def _read_stderr(self) -> None:
        assert self._proc is not None and self._proc.stderr is not None  # started (with stderr=PIPE) before this task
        stream = self._proc.stderr
        while chunk := await stream.read(65536):
            self._stderr.append(chunk)
            self._stderr_size += len(chunk)
            while self._stderr_size - len(self._stderr[0]) >= STDERR_TAIL:
                self._stderr_size -= len(self._stderr.popleft())

    async def close(self, grace: float = 5.0) -> None:
        """Close stdin (the worker exits), wait up to `grace` seconds, then kill."""
        proc = self._proc
        if proc is None:
            return
        assert proc.stdin is not None  # started with stdin=PIPE
        try:
            proc.stdin.close()
        except (ConnectionError, RuntimeError):
            pass
        if proc.returncode is None:
            try:
                async with asyncio.timeout(grace):  # not wait_for: see engine/benchmark/memory/runner.py `_within`
                    await proc.wait()
            except TimeoutError:
                self.kill()
                await proc.wait()
        await asyncio.gather(*self._tasks, return_exceptions=True)
