"""Running a command's coroutine so that SIGTERM stops it as Ctrl-C does.

    result = lifecycle.run(main_coroutine())   # instead of asyncio.run

SIGTERM (what `timeout`, schedulers and process managers send) must stop a
run the orderly way: the main task is cancelled, engines close and the cache
is flushed, and the command exits 143. The CLI's SIGTERM handler
(engine/cli/main.py) calls `terminate()`, which cancels the running command's main
task directly. It used to send itself SIGINT and let asyncio's runner cancel
the task, but a process started with SIGINT ignored (any background job of a
non-interactive shell: `tulving run ... &`, some CI runners) has no SIGINT
handler, so the SIGTERM was swallowed and the run went on to exit 0.
"""
from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # asyncio is imported by `run`: `tulving --help` and the SIGTERM handler need none of it
    import asyncio

    from engine.scheduler import Engine

T = TypeVar("T")


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into the same orderly stop as Ctrl-C."""


# (loop, main task) of the command coroutines running now, innermost last.
_running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[object]]] = []
_terminating = False


# The engines the command opened (common.open_engine): what an interrupted run kept.
_engines: list[Engine] = []


def reset() -> None:
    """Forget an earlier SIGTERM and the engines (one CLI invocation's state, tests call main() repeatedly)."""
    global _terminating
    _terminating = False
    _engines.clear()


def watch(engine: Engine) -> Engine:
    """Remember an engine the command opens, for `kept_line` if it is interrupted."""
    _engines.append(engine)
    return engine


def kept_line() -> str:
    """After Ctrl-C or SIGTERM: what the command's engines kept and how to go
    on ("" when it opened none): the replies received are in the cache, and
    the same command, run again, takes them from there instead of paying again."""
    if not _engines:
        return ""
    replies = sum(e.stats.succeeded for e in _engines)
    caches = sorted({str(e.cache_path) for e in _engines if e.cache_path})
    if not replies:
        return "no reply had arrived yet"
    where = f" in the cache {caches[0]}" if len(caches) == 1 else " in the cache"
    return (f"the {replies:,} {'reply' if replies == 1 else 'replies'} received are kept{where}: rerun the same "
            f"command to resume (they are not paid again)" if caches else
            f"{replies:,} replies received, but no cache keeps them: a rerun calls again")


def terminating() -> bool:
    return _terminating


def terminate() -> bool:
    """Ask the running command to stop (from the SIGTERM handler, in the main
    thread). True when a command coroutine was running and is cancelled now;
    False when none is (the caller then stops the synchronous code itself)."""
    global _terminating
    _terminating = True
    if not _running:
        return False
    loop, task = _running[-1]
    if task.done():
        return False
    task.cancel()
    loop.call_soon_threadsafe(lambda: None)  # wake the loop if it sleeps in select()
    return True


def install_uvloop() -> None:
    """Run the command's coroutines on uvloop's event loop when uvloop is
    installed. Called when a command starts its first coroutine, not before:
    asyncio alone costs more than the rest of `tulving --help` or of a config
    error (tests/test_startup.py)."""
    import asyncio

    try:
        import uvloop
    except ImportError:
        return
    if not isinstance(asyncio.get_event_loop_policy(), uvloop.EventLoopPolicy):
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def run_briefly(main: Coroutine[object, None, T]) -> T:
    """`asyncio.run(main)` on the CLI's event loop, for the short commands
    (cache copy, batches, models --probe/--remote): SIGTERM interrupts them
    as Ctrl-C does (engine/cli/main.py), without `run`'s orderly cancellation."""
    import asyncio

    install_uvloop()
    return asyncio.run(main)


def run(main: Coroutine[object, None, T]) -> T:
    """`asyncio.run(main)`, stoppable by `terminate()`: raises `Terminated`
    once the main task has unwound (its `finally` and `async with` blocks ran)."""
    import asyncio

    install_uvloop()

    async def tracked() -> T:
        task = asyncio.current_task()
        assert task is not None  # inside asyncio.run: there is a current task
        entry = (asyncio.get_running_loop(), task)
        _running.append(entry)
        try:
            return await main
        finally:
            _running.remove(entry)

    try:
        result = asyncio.run(tracked())
    except asyncio.CancelledError:
        if _terminating:
            raise Terminated() from None
        raise
    if _terminating:  # the stop was asked for, even if the work finished meanwhile
        raise Terminated()
    return result
