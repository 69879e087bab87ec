"""What running llama.cpp in a worker process costs per call.

    python benchmarks/llama_worker_bench.py [--calls 30] [--max-tokens 1]

The same short chat call (SmolLM2, greedy, `--max-tokens` tokens) made
alternately in this process (llama_worker.load_llama + create_chat_completion,
what the provider did before the worker) and through LocalLlamaProvider (a
frame each way over the worker's pipes, the prompt-length check, the deadline
guard). Prints the median wall time of each and of their per-round
difference, plus the first call's cost (starting the worker and loading the
model versus loading it here).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from providers.base import EndpointSpec  # noqa: E402
from providers.llama_worker import load_llama  # noqa: E402
from providers.local_llama import LocalLlamaProvider  # noqa: E402
from providers.local_models import gguf_path  # noqa: E402

MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--max-tokens", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    provider = LocalLlamaProvider(EndpointSpec(name="local", kind="local"))
    params = {"temperature": 0.0, "max_tokens": args.max_tokens}

    started = time.perf_counter()
    await provider.chat("smollm2", MESSAGES, params=params, timeout=300)
    worker_first = time.perf_counter() - started
    started = time.perf_counter()
    llm = load_llama(gguf_path("smollm2", {}), n_ctx=provider.n_ctx, n_threads=provider.n_threads,
                     n_batch=provider.n_batch, n_gpu_layers=0)
    llm.create_chat_completion(messages=MESSAGES, **params)
    inproc_first = time.perf_counter() - started

    inproc, worker = [], []
    for _ in range(args.calls):
        started = time.perf_counter()
        llm.create_chat_completion(messages=MESSAGES, **params)
        inproc.append(time.perf_counter() - started)
        started = time.perf_counter()
        await provider.chat("smollm2", MESSAGES, params=params, timeout=300)
        worker.append(time.perf_counter() - started)
    await provider.aclose()
    llm.close()

    ms = lambda values: f"{statistics.median(values) * 1000:7.1f} ms"  # noqa: E731
    print(f"SmolLM2 chat call, {args.max_tokens} output token(s), {args.calls} rounds (median wall time)")
    print(f"  in-process      {ms(inproc)}")
    print(f"  worker process  {ms(worker)}")
    print(f"  difference      {ms([w - i for w, i in zip(worker, inproc)])} per call")
    print(f"first call (start + load): in-process {inproc_first * 1000:.0f} ms, worker {worker_first * 1000:.0f} ms")


if __name__ == "__main__":
    asyncio.run(main())
