"""The local model's worker process, with the real SmolLM2 model: the AMX
crash guard, a worker killed or crashing mid-call, cancellation across the
process boundary, a hung worker, and no orphan processes."""
from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from providers import worker_process
from providers.base import CONFIG, CONNECTION, CRASHED, EndpointSpec, ProviderError
from providers.llama_worker import CRASH_HOOK_ENV, load_llama
from providers.local_llama import LocalLlamaProvider
from providers.local_models import gguf_path

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is the [local] extra")

REPO = Path(__file__).resolve().parents[1]
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
# Greedy SmolLM2 keeps counting to max_tokens: ~35 s for 1,500 tokens on 2 busy cores.
LONG = [{"role": "user", "content": "Write the numbers from 1 to 2000, separated by commas, with nothing else."}]
SHORT_PARAMS = {"temperature": 0.0, "max_tokens": 4}


def provider() -> LocalLlamaProvider:
    return LocalLlamaProvider(EndpointSpec(name="local", kind="local"))


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone; or reaped between open and read (ESRCH)
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def wait_gone(pid: int, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < end:
        await asyncio.sleep(0.05)
    return not alive(pid)


async def running_worker(p: LocalLlamaProvider, seconds: float = 60.0) -> int:
    """The pid of the worker once it has started its call (model loaded or loading)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for worker in p._workers.values():
            if worker._running is not None:
                return worker.pid
        await asyncio.sleep(0.05)
    raise AssertionError("the worker never started the call")


def test_models_load_without_extra_buffer_types():
    """The AMX crash guard: llama.cpp's default is on, the struct passed to it says off."""
    assert llama_cpp.llama_model_default_params().use_extra_bufts is True  # so "off" below is our doing
    llm = load_llama(gguf_path("smollm2", {}), n_ctx=512, n_threads=1, n_batch=64, n_gpu_layers=0)
    try:
        assert llm.model_params.use_extra_bufts is False
    finally:
        llm.close()
    assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is True  # the patch is undone


async def test_the_worker_reports_the_setting_it_loaded_with():
    p = provider()
    try:
        reply = await p.chat("smollm2", QUESTION, params=SHORT_PARAMS, timeout=120)
        assert reply.text.strip()
        assert p.model_params == {gguf_path("smollm2", {}): {"use_extra_bufts": False}}
        assert p.stats.worker_starts == 1 and p.stats.loads == 1
        [pid] = p.worker_pids.values()
        assert pid != os.getpid() and alive(pid)
    finally:
        await p.aclose()
    assert not alive(pid)  # closed, and reaped


async def test_a_worker_killed_mid_call_fails_that_call_and_the_next_call_gets_a_fresh_worker():
    p = provider()
    try:
        call = asyncio.create_task(p.chat("smollm2", LONG, params={"temperature": 0.0, "max_tokens": 1500},
                                          timeout=300))
        pid = await running_worker(p)
        os.kill(pid, signal.SIGKILL)  # what the out-of-memory killer does
        with pytest.raises(ProviderError) as err:
            await asyncio.wait_for(call, 30)
        assert err.value.kind == CONNECTION and err.value.retryable
        assert "SIGKILL (out of memory?)" in str(err.value) and "\n" not in str(err.value)
        assert await wait_gone(pid)

        after = await p.chat("smollm2", QUESTION, params=SHORT_PARAMS, timeout=120)
        assert after.text.strip()
        assert p.stats.worker_starts == 2 and p.stats.worker_deaths == 1 and p.stats.loads == 1
        assert list(p.worker_pids.values()) != [pid]
    finally:
        await p.aclose()


async def test_a_worker_killed_while_idle_is_replaced_for_the_next_call():
    """That call never ran on the dead worker: it goes to a fresh one, no error."""
    p = provider()
    try:
        await p.chat("smollm2", QUESTION, params=SHORT_PARAMS, timeout=120)
        [pid] = p.worker_pids.values()
        os.kill(pid, signal.SIGKILL)
        while alive(pid):  # blocking: the provider cannot read the worker's end before the next call
            time.sleep(0.01)
        after = await p.chat("smollm2", QUESTION, params=SHORT_PARAMS, timeout=120)
        assert after.text.strip()
        assert p.stats.worker_deaths == 1 and p.stats.worker_starts == 2 and p.stats.calls == 2
    finally:
        await p.aclose()


async def test_a_call_that_crashes_the_worker_is_retryable_once_then_final(monkeypatch):
    monkeypatch.setenv(CRASH_HOOK_ENV, "CRASH-MARKER")
    marked = [{"role": "user", "content": "CRASH-MARKER: what is the capital of France?"}]
    p = provider()
    try:
        with pytest.raises(ProviderError) as first:
            await p.chat("smollm2", marked, params=SHORT_PARAMS, timeout=120)
        assert first.value.kind == CONNECTION and first.value.retryable
        assert "died (SIGSEGV) during this call" in str(first.value)
        with pytest.raises(ProviderError) as second:
            await p.chat("smollm2", marked, params=SHORT_PARAMS, timeout=120)
        assert second.value.kind == CRASHED and not second.value.retryable
        assert "2 times" in str(second.value)
        # Another request is a first death again, and unmarked ones are answered.
        with pytest.raises(ProviderError) as other:
            await p.chat("smollm2", marked, params={"temperature": 0.0, "max_tokens": 5}, timeout=120)
        assert other.value.kind == CONNECTION
        answer = await p.chat("smollm2", QUESTION, params=SHORT_PARAMS, timeout=120)
        assert answer.text.strip()
        assert p.stats.worker_deaths == 3 and p.stats.worker_starts == 4 and p.stats.calls == 1
    finally:
        await p.aclose()


async def test_cancelling_a_call_stops_the_generation_in_the_worker(monkeypatch):
    """The worker answers the cancelled call with its cancellation (its
    generation stopped at the next token) before it answers the next call:
    behind a generation left running, the next call would wait out its 1,500 tokens."""
    frames: list[dict] = []
    read = worker_process.read_frame

    async def recording(stream):
        frame = await read(stream)
        frames.append(frame)
        return frame

    monkeypatch.setattr(worker_process, "read_frame", recording)
    p = provider()
    try:
        call = asyncio.create_task(p.chat("smollm2", LONG, params={"temperature": 0.0, "max_tokens": 1500},
                                          timeout=300))
        pid = await running_worker(p)
        await asyncio.sleep(1.0)  # generating by now
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        after = await p.chat("smollm2", QUESTION, params=SHORT_PARAMS, timeout=600)
        assert after.text.strip()
        replies = [f for f in frames if f is not None and not f.get("started")]
        assert replies[-2]["ok"] is False and "was cancelled" in replies[-2]["message"], replies
        assert replies[-1]["ok"] is True
        assert p.worker_pids[gguf_path("smollm2", {})] == pid  # the same worker, model still loaded
        # The cancelled call loaded the model (its reply is dropped); this one found it loaded.
        assert p.stats.loads == 0 and p.stats.worker_deaths == 0
    finally:
        await p.aclose()


async def test_a_worker_that_stops_answering_is_killed_after_two_cancelled_calls():
    p = provider()
    try:
        await p.chat("smollm2", QUESTION, params=SHORT_PARAMS, timeout=120)
        [pid] = p.worker_pids.values()
        os.kill(pid, signal.SIGSTOP)  # hung: reads nothing, answers nothing
        for _ in range(2):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):  # what the engine does at the attempt timeout
                    await p.chat("smollm2", QUESTION, params=SHORT_PARAMS, timeout=0.5)
        assert await wait_gone(pid)
        after = await p.chat("smollm2", QUESTION, params=SHORT_PARAMS, timeout=120)
        assert after.text.strip() and p.stats.worker_starts == 2
    finally:
        await p.aclose()


async def test_load_errors_from_the_worker_stay_one_line_config_errors(tmp_path):
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"GGUF" + b"\0" * 100)
    p = provider()
    try:
        with pytest.raises(ProviderError) as err:
            await p.chat(str(bogus), QUESTION, params=SHORT_PARAMS, timeout=60)
        assert err.value.kind == CONFIG and str(bogus) in str(err.value) and "\n" not in str(err.value)
        assert p.stats.worker_deaths == 0
    finally:
        await p.aclose()


PARENT = textwrap.dedent(f"""
    import asyncio, sys, time
    from providers.base import EndpointSpec
    from providers.local_llama import LocalLlamaProvider

    async def main():
        p = LocalLlamaProvider(EndpointSpec(name="local", kind="local"))
        call = asyncio.ensure_future(p.chat("smollm2", {LONG!r}, params={{"temperature": 0.0, "max_tokens": 4000}},
                                            timeout=600))
        while not p.worker_pids:
            await asyncio.sleep(0.05)
        print(*p.worker_pids.values(), flush=True)
        await call  # killed in the middle of it

    asyncio.run(main())
""")


async def test_a_worker_does_not_outlive_its_parent():
    """The parent is SIGKILLed mid-call (no aclose): its worker exits too."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", PARENT, cwd=REPO,
                                                stdout=asyncio.subprocess.PIPE,
                                                env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        worker = int(line)
        await asyncio.sleep(1.0)  # loading or generating
        assert alive(worker)
    finally:
        proc.kill()
        await proc.wait()
    # Well before its generation (~100 s) could end and a write to the dead pipe kill it.
    assert await wait_gone(worker, 5.0), f"worker {worker} outlived its parent"
