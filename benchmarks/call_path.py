"""The path of one uncached chat call, as the interpreter walks it: which of
Tulving's files it enters, in first-entry order, and how many calls go back up
the layers (a frame of a lower layer calling into a higher one).

The loopback server runs in a child process, so only the client's path is
traced: scheduler -> dispatch -> provider -> HTTP pool -> cache, and back to
the stream as an Outcome. Then the same for a call sent by batch (`--batch`:
the server ends each batch at its first poll), and for a call whose first
attempt is answered 429 (its server fails its first call so): how many
file-to-file hops the whole path makes (a call from one of Tulving's files
into another), and how many of them switch between the engine
(engine/scheduler.py) and the dispatcher (engine/dispatch.py).

    python benchmarks/call_path.py
"""
from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from engine_bench import ServerProcess, config_for  # noqa: E402
from test_layers import layer_of  # noqa: E402

from engine.config import Config  # noqa: E402
from engine.requests import ChatRequest  # noqa: E402
from engine.scheduler import Engine  # noqa: E402


def _module(filename: str) -> str | None:
    path = Path(filename)
    try:
        rel = path.resolve().relative_to(ROOT)
    except ValueError:
        return None
    if rel.parts[0] not in ("engine", "providers", "cache") or rel.suffix != ".py":
        return None
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


HOPS: list[tuple[str, str]] = []  # (caller, callee) of every call between two of Tulving's files


async def one_call(base_url: str, cache: Path, batch: bool = False, limited_url: str | None = None
                   ) -> tuple[list[str], list[tuple[str, str]], list[tuple[str, str]]]:
    options = {"options": {"batch_poll": 0.01, "batch_poll_max": 0.02}} if batch else {}
    config = config_for(base_url, concurrency=4, **options)
    model = "m"
    if limited_url is not None:  # the traced call goes to a server that answers its first call 429
        config = Config.from_dicts(
            {"loop": {"kind": "openai", "base_url": base_url, "max_concurrency": 4},
             "limited": {"kind": "openai", "base_url": limited_url, "max_concurrency": 4, "max_retry_after": 0.05}},
            {"m": {"endpoint": "loop", "model": "bench", "params": {"max_tokens": 64}},
             "l": {"endpoint": "limited", "model": "bench", "params": {"max_tokens": 64}}})
        model = "l"
    request = ChatRequest(model=model, messages=[{"role": "user", "content": "the path of one call"}])
    HOPS.clear()
    async with Engine(config, cache_path=str(cache), batch=batch) as engine:
        await engine.run([ChatRequest(model="m", messages=[{"role": "user", "content": "warm up"}])])
        if limited_url is not None:  # its endpoint opened before the trace (its first call is the traced one)
            engine._endpoint(config.endpoints["limited"])
        entered: list[str] = []
        upward: list[tuple[str, str]] = []
        back: list[tuple[str, str, str]] = []  # (caller, callee, function): into a file entered earlier

        def profile(frame, event, arg):  # noqa: ANN001 -- sys.setprofile's signature
            if event != "call":
                return
            callee = _module(frame.f_code.co_filename)
            if callee is None:
                return
            caller = _module(frame.f_back.f_code.co_filename) if frame.f_back is not None else None
            if caller is not None and caller != callee:
                HOPS.append((caller, callee))
            if callee not in entered:
                entered.append(callee)
            elif caller is not None and caller != callee and caller in entered \
                    and entered.index(callee) < entered.index(caller) and not frame.f_code.co_name.startswith("<"):
                back.append((caller, callee, frame.f_code.co_name))
            lc, le = (layer_of(caller) if caller else None), layer_of(callee)
            if lc is not None and le is not None and le[0] > lc[0]:
                upward.append((caller, callee))

        sys.setprofile(profile)
        try:
            outcomes = await engine.run([request])
        finally:
            sys.setprofile(None)
        assert outcomes[0].ok and not outcomes[0].cached
        assert limited_url is None or outcomes[0].attempts == 2, outcomes[0]
    return entered, sorted(set(upward)), sorted({(f"{a}", f"{b}.{fn}") for a, b, fn in back})


def report(how: str, entered: list[str], upward: list[tuple[str, str]], back: list[tuple[str, str]]) -> None:
    print(f"one uncached chat call {how} entered {len(entered)} of Tulving's files:")
    for module in entered:
        print("  ", module.replace(".", "/") + ".py")
    print(f"calls back up the layers: {len(upward)}")
    for caller, callee in upward:
        print(f"   {caller} -> {callee}")
    print(f"calls back into a file the path entered earlier (distinct caller -> function): {len(back)}")
    for caller, callee in back:
        print(f"   {caller} -> {callee}")
    engine_dispatch = {("engine.scheduler", "engine.dispatch"), ("engine.dispatch", "engine.scheduler")}
    print(f"file-to-file hops: {len(HOPS)}, of which between engine/scheduler.py and engine/dispatch.py: "
          f"{sum(hop in engine_dispatch for hop in HOPS)}")


def main() -> None:
    with ServerProcess("--batch-polls", "1") as server, ServerProcess("--fail-first", "1:429") as limited, \
            tempfile.TemporaryDirectory() as tmp:
        report("(direct)", *asyncio.run(one_call(server.base_url, Path(tmp) / "direct.sqlite")))
        report("(by batch)", *asyncio.run(one_call(server.base_url, Path(tmp) / "batch.sqlite", batch=True)))
        report("(direct, its first attempt answered 429)",
               *asyncio.run(one_call(server.base_url, Path(tmp) / "limited.sqlite", limited_url=limited.base_url)))


if __name__ == "__main__":
    main()
