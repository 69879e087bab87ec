"""llama.cpp's own OpenAI-compatible server (`python -m llama_cpp.server`, from
llama-cpp-python[server], in the test extra) serving the SmolLM2 GGUF the
offline default ships: a real server nobody here wrote, started on a free
loopback port (with llama.cpp's AMX-crashing extra buffer types off: SERVE)
and stopped after use.

    with LlamaServer() as server:      # fails (never skips) when it cannot start
        server.base_url                # "http://127.0.0.1:<port>/v1"
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from providers.local_models import gguf_path

# `python -m llama_cpp.server` with llama.cpp's extra buffer types off: their AMX
# matmul segfaults on Intel CPUs with AMX at the first prompt (exit 139 on this
# machine's Xeon with amx_int8, 2026-11-28; see providers/llama_worker.py load_llama,
# which the engine's own worker uses). The server has no option for it, so the
# struct llama-cpp-python fills for every model it loads is patched first.
SERVE = """
import runpy
import llama_cpp.llama_cpp as low_level
default_params = low_level.llama_model_default_params
def without_extra_bufts():
    params = default_params()
    if hasattr(params, "use_extra_bufts"):
        params.use_extra_bufts = False
    return params
low_level.llama_model_default_params = without_extra_bufts
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""
START_TIMEOUT = 120.0  # seconds to load the model and answer /v1/models (a loaded 2-core machine)
N_CTX = 8192


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServerError(RuntimeError):
    """The server could not start: the message holds the end of its log."""


class LlamaServer:
    def __init__(self, log: Path, model: Path | None = None, n_ctx: int = N_CTX):
        self.model = model or gguf_path("smollm2", {})
        self.n_ctx, self.log = n_ctx, log
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> LlamaServer:
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", SERVE, "--model", str(self.model), "--host", "127.0.0.1",
                 "--port", str(self.port), "--n_ctx", str(self.n_ctx), "--n_threads", "2"],
                stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LlamaServerError(f"llama_cpp.server exited with {self.process.returncode}: {self._tail()}")
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise LlamaServerError(f"llama_cpp.server did not answer /v1/models within {START_TIMEOUT:g} s: "
                               f"{self._tail()}")

    def _tail(self) -> str:
        try:
            return " | ".join(self.log.read_text(errors="replace").splitlines()[-8:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
