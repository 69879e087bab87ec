"""`tulving ARGS...` run by the tests in their own process: the command line's
entry point (engine/cli/main.py `main(argv)`, what the console script calls)
with the command's own working directory, environment and captured output,
its exit code returned as a process's would be.

    done = tulving(tmp_path, "--cache", "c.sqlite", "run", "--sample", "3", env=env)
    done = await atulving(...)        # from a test's event loop (the command runs its own loop in a thread)
    done.returncode, done.stdout, done.stderr

A command run so costs what it does, not a Python start and the import of
numpy, scipy, aiohttp and the engine (about half a second of CPU each time on
2 shared cores, and most tests run several). The tests whose subject is the
process itself (start-up imports, signals, a kill, a native crash, a module
hidden from a fresh interpreter, a trust store read at start-up) still start
`python -m engine.cli`.

What a command changes in the process is put back after it: the working
directory, sys.argv (run.json records it), the environment (the CLI moves a URL's password to $PGPASSWORD),
the event loop policy (commands run on uvloop), stdout and stderr. One
command at a time (a lock): they share the process's cwd and environment.
"""
from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from engine.cli.main import main

_one_at_a_time = threading.Lock()


@dataclass
class Done:
    """A finished command, shaped as subprocess.CompletedProcess is read."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def _process_state(cwd: Path | str, env: Mapping[str, str] | None, args: tuple[str, ...]) -> Iterator[None]:
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_policy = asyncio.get_event_loop_policy()
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        os.chdir(cwd)
        sys.argv = ["tulving", *args]  # what run.json records as the command
        yield
    finally:
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        asyncio.set_event_loop_policy(saved_policy)


def tulving(cwd: Path | str, *args: str, env: Mapping[str, str] | None = None) -> Done:
    """Run one command in this process. Called from a running event loop (a
    synchronous helper inside an async test), the command runs in a thread
    while this one waits: the test's loop stands still meanwhile, so a server
    it serves needs `atulving` instead."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _tulving(cwd, args, env)
    done: list[Done] = []
    thread = threading.Thread(target=lambda: done.append(_tulving(cwd, args, env)), name="tulving-cli")
    thread.start()
    thread.join()
    if not done:
        raise RuntimeError(f"tulving {' '.join(args)} raised (see the thread's traceback above)")
    return done[0]


class _Stream(io.TextIOWrapper):
    """A captured stdout or stderr with a binary buffer, as a process's has
    (commands write bytes to sys.stdout.buffer)."""

    def __init__(self) -> None:
        self.written = io.BytesIO()
        super().__init__(self.written, encoding="utf-8", write_through=True)

    def text(self) -> str:
        """What `subprocess.run(..., text=True)` would read: UTF-8, universal newlines."""
        self.flush()
        return self.written.getvalue().decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


def _tulving(cwd: Path | str, args: tuple[str, ...], env: Mapping[str, str] | None) -> Done:
    out, err = _Stream(), _Stream()
    with _one_at_a_time, _process_state(cwd, env, args), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors and --help
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return Done(list(args), int(code or 0), out.text(), err.text())


async def atulving(cwd: Path | str, *args: str, env: Mapping[str, str] | None = None) -> Done:
    """`tulving` from a test's event loop: the command, which runs an event loop
    of its own, runs in a worker thread while the test's loop (e.g. an
    in-process loopback server) keeps serving."""
    return await asyncio.to_thread(_tulving, cwd, args, env)
