"""The local model's worker process: llama.cpp, away from the engine.

    python -m providers.llama_worker      (started by providers/local_llama.py)

A crash in llama.cpp's native code (a SIGSEGV, an abort, the kernel's
out-of-memory kill) takes down this process only; the provider sees the pipe
close, fails the call it held with a classified error and starts a new worker
for the next call. The worker keeps its loaded models, and each model its KV
cache, between calls: a question asked right after another on the same long
context re-evaluates only the tokens after their common prefix.

Protocol (frames of providers/worker_pipe.py; stdin in, a private copy of
stdout out; fd 1 itself is pointed at stderr so that native code printing to
stdout cannot corrupt the frames):

  in   {"op": "chat", "id", "path", "load": {n_ctx, n_threads, n_batch,
        n_gpu_layers}, "messages", "kwargs", "timeout"}
       {"op": "cancel", "id"}            stop that call at its next token
  out  {"id", "started": True}           the call is now running (before loading)
       {"id", "ok": True, "result": {...}, "reused", "loaded", "extra_bufts"}
       {"id", "ok": False, "kind", "message"}   a ProviderError
       {"id", "ok": False, "exception"}         anything else, as "Type: text"

Calls run one at a time, in arrival order; a reader thread takes cancels as
they come. End of stdin (the provider closed it, or its process died) ends the
worker at once, whatever it is doing: no orphan outlives its parent.

Test hook: with TULVING_TEST_CRASH_ON=<marker> in its environment, the worker
sends itself SIGSEGV when a call's messages contain <marker> (after loading,
where llama.cpp would crash); tests/test_llama_worker*.py use it.
"""
from __future__ import annotations

import faulthandler
import inspect
import os
import queue
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypedDict

from providers.base import BAD_REPLY, BAD_REQUEST, CONFIG, PROMPT_TOO_LONG, TIMEOUT, ProviderError
from providers.worker_pipe import read_frame_blocking, write_frame

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

INSTALL_HINT = "the local provider needs llama-cpp-python: pip install 'tulving-bench[local]'"
CRASH_HOOK_ENV = "TULVING_TEST_CRASH_ON"


# -- loading ------------------------------------------------------------------------
def load_llama(path: Path, *, n_ctx: int, n_threads: int, n_batch: int, n_gpu_layers: int,
               extra_bufts: bool = False, verbose: bool = False) -> Any:
    """A llama_cpp.Llama for `path`, by default without llama.cpp's extra
    buffer types.

    Why: with extra buffer types (llama.cpp's default) the CPU backend repacks
    weights at load into a layout for the CPU's widest matrix unit. On Intel
    CPUs with AMX (Sapphire Rapids and later: most current cloud servers) that
    is the AMX buffer type, and its matmul on the repacked Q4_1 weights
    (`ggml_backend_amx_mul_mat` in libggml-cpu) segfaults as soon as SmolLM2
    evaluates a prompt: every run and the test suite died with SIGSEGV. Without
    extra buffer types the weights stay in plain CPU buffers and every x86-64
    CPU takes the ordinary AVX/AVX2/AVX-512 kernels. The cost, measured with
    benchmarks/llama_speed_bench.py, is in the README ("Local models").

    llama-cpp-python 0.3.x has no Llama() keyword for it, so the struct Llama
    fills (llama_model_default_params) is patched for the duration of the load;
    a version that has the keyword gets it. Either way the struct actually
    passed to llama.cpp (`llm.model_params`) is checked afterwards.
    Raises ImportError, or ValueError/RuntimeError/OSError for a bad file.
    """
    import llama_cpp
    import llama_cpp.llama_cpp as low_level
    from llama_cpp import Llama

    kwargs: dict[str, Any] = dict(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                  n_batch=n_batch, n_gpu_layers=n_gpu_layers, verbose=verbose)
    default_params = low_level.llama_model_default_params
    has_field = hasattr(default_params(), "use_extra_bufts")
    if "use_extra_bufts" in inspect.signature(Llama.__init__).parameters:
        kwargs["use_extra_bufts"] = extra_bufts
    elif has_field:
        def params_with_our_choice() -> Any:  # a llama_model_params ctypes struct
            params = default_params()
            params.use_extra_bufts = extra_bufts
            return params

        low_level.llama_model_default_params = params_with_our_choice
    try:
        llm = Llama(**kwargs)
    finally:
        low_level.llama_model_default_params = default_params
    if has_field and bool(llm.model_params.use_extra_bufts) != extra_bufts:
        llm.close()
        raise RuntimeError(f"llama-cpp-python {llama_cpp.__version__} did not take use_extra_bufts="
                           f"{extra_bufts} (the AMX crash guard); report it")
    return llm


@dataclass
class _Model:
    """One loaded GGUF model and what is needed to count its prompts."""

    path: Path
    llm: Any                       # llama_cpp.Llama
    formatter: Any                 # llama_chat_format.Jinja2ChatFormatter, or None
    n_ctx: int


class LoadOptions(TypedDict):
    """A chat call's "load" entry: load_llama's keywords."""

    n_ctx: int
    n_threads: int
    n_batch: int
    n_gpu_layers: int


def _load(path: Path, load: LoadOptions) -> _Model:
    try:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter
    except ImportError:
        raise ProviderError(CONFIG, INSTALL_HINT) from None
    try:
        llm = load_llama(path, **load)
    except ImportError:
        raise ProviderError(CONFIG, INSTALL_HINT) from None
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


def _prompt_tokens(model: _Model, messages: list[dict[str, str]]) -> list[int]:
    """The prompt as create_chat_completion will feed it to the model."""
    if model.formatter is not None:
        try:
            rendered = model.formatter(messages=messages)
        except Exception as exc:  # jinja2 errors and the template's raise_exception
            raise ProviderError(BAD_REQUEST, f"the chat template of {model.path.name} rejected the "
                                             f"messages: {exc}") from None
        tokens: list[int] = model.llm.tokenize(rendered.prompt.encode("utf-8"),
                                               add_bos=not rendered.added_special, special=True)
        return tokens
    # No template in the file: llama-cpp-python falls back to a built-in
    # format; the contents alone are a lower bound of its length.
    text = "\n".join(m["content"] for m in messages)
    tokens = model.llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    return tokens


# -- serving ------------------------------------------------------------------------
class Worker:
    def __init__(self, out: BinaryIO):
        self.out = out
        self.models: dict[Path, _Model] = {}
        self.crash_marker = os.environ.get(CRASH_HOOK_ENV) or None
        self._lock = threading.Lock()        # current / cancelled, shared with the reader thread
        self._current: int | None = None
        self._cancelled_ids: set[int] = set()
        self._cancel = threading.Event()

    def cancel(self, call_id: int) -> None:  # reader thread
        with self._lock:
            if call_id == self._current:
                self._cancel.set()
            else:
                self._cancelled_ids.add(call_id)

    def serve(self, call: dict[str, Any]) -> None:
        call_id = call["id"]
        with self._lock:
            if call_id in self._cancelled_ids:  # cancelled while it waited behind another call
                self._cancelled_ids.discard(call_id)
                write_frame(self.out, {"id": call_id, "ok": False, "kind": TIMEOUT, "message": "cancelled"})
                return
            self._current = call_id
            self._cancel.clear()
        write_frame(self.out, {"id": call_id, "started": True})
        try:
            reply = self._chat(call)
        except ProviderError as exc:
            reply = {"ok": False, "kind": exc.kind, "message": exc.message}
        except Exception as exc:  # noqa: BLE001 -- the provider classifies it
            traceback.print_exc()
            reply = {"ok": False, "exception": f"{type(exc).__name__}: {exc}"}
        with self._lock:
            self._current = None
        reply["id"] = call_id
        write_frame(self.out, reply)

    def _chat(self, call: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + call["timeout"]
        path = Path(call["path"])
        model = self.models.get(path)
        loaded = model is None
        if model is None:
            model = self.models[path] = _load(path, call["load"])
        messages, kwargs = call["messages"], call["kwargs"]
        if self.crash_marker and any(self.crash_marker in m["content"] for m in messages):
            os.kill(os.getpid(), signal.SIGSEGV)  # the test hook: die as llama.cpp would

        tokens = _prompt_tokens(model, messages)
        wanted = kwargs.get("max_tokens") or 0
        if len(tokens) + wanted > model.n_ctx or len(tokens) >= model.n_ctx:
            raise ProviderError(PROMPT_TOO_LONG, f"prompt has {len(tokens)} tokens, the model's context is "
                                                 f"{model.n_ctx} (with max_tokens={wanted}): shorten it or "
                                                 f"raise options.n_ctx")
        import numpy as np
        from llama_cpp import LogitsProcessorList

        # llama.cpp calls logits processors from a C callback that swallows
        # exceptions; to stop a generation past its deadline (or cancelled by
        # the provider) the guard forces the end-of-sequence token.
        llm = model.llm
        eos = llm.token_eos()
        cancel = self._cancel
        stopped = threading.Event()

        def guard(_input_ids: npt.NDArray[np.intc], scores: npt.NDArray[np.single]
                  ) -> npt.NDArray[np.single]:  # called once per generated token
            if cancel.is_set() or time.monotonic() > deadline:
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
        latency = time.monotonic() - started
        if stopped.is_set():
            what = "was cancelled" if cancel.is_set() else "stopped at its deadline"
            raise ProviderError(TIMEOUT, f"local generation {what} ({latency:.1f} s)")
        try:
            choice = reply["choices"][0]
            result = {"text": choice["message"]["content"] or "",
                      "finish_reason": choice.get("finish_reason") or "stop",
                      "input_tokens": int((reply.get("usage") or {}).get("prompt_tokens", len(tokens))),
                      "output_tokens": int((reply.get("usage") or {}).get("completion_tokens", 0)),
                      "latency": latency, "request_id": reply.get("id")}
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ProviderError(BAD_REPLY, f"unexpected llama-cpp-python reply: {exc!r}") from None
        return {"ok": True, "result": result, "reused": reused, "loaded": loaded,
                "extra_bufts": bool(getattr(llm.model_params, "use_extra_bufts", False))}


def main() -> None:
    # The frames get a private copy of stdout; fd 1 becomes stderr so that
    # anything native code prints cannot land inside a frame.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    faulthandler.enable()  # a native crash leaves a Python stack on stderr
    # OpenMP threads that spin while idle fight the event loop and the
    # embedding thread for 2 cores: measured 32 s -> 10 s for a 1,300-token
    # prompt under load. Must be set before llama.cpp starts OpenMP.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    worker = Worker(out)
    calls: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
    stdin = sys.stdin.buffer

    def read() -> None:
        try:
            while True:
                message = read_frame_blocking(stdin)
                if message is None:  # the provider closed the pipe or died: stop now, mid-call or not
                    os._exit(0)
                if message.get("op") == "cancel":
                    worker.cancel(message["id"])
                else:
                    calls.put(message)
        except BaseException:  # a garbled frame: without this thread the worker would hang
            traceback.print_exc()
            os._exit(1)

    threading.Thread(target=read, name="frames-in", daemon=True).start()
    while True:
        worker.serve(calls.get())


if __name__ == "__main__":
    main()
