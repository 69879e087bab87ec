"""The local model's speed with and without llama.cpp's extra buffer types.

    python benchmarks/llama_speed_bench.py [--runs 5] [--prompt-tokens 1000] [--gen-tokens 64]

`use_extra_bufts` lets llama.cpp repack weights at load into a CPU-specific
layout (AMX tiles on Sapphire Rapids and later, interleaved blocks for AVX2 /
NEON). The local provider turns it off because the AMX path crashes (see
providers/llama_worker.py); this measures what that costs. Each of `--runs`
rounds runs both settings, in alternating order so that a change in the
machine's load hits both, each in a fresh process: load SmolLM2, evaluate the
same prompt, generate `--gen-tokens` tokens greedily (end-of-sequence
ignored). Prints prompt and generation tokens/s (the best round, as other load
only slows a round down; the median; the slowest) and where llama.cpp put the
weights with each setting (its load log). A setting whose process dies (with
extra buffer types on an AMX CPU: the SIGSEGV) is reported as such.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from providers.worker_process import describe_exit  # noqa: E402

TEXT = " ".join(f"On day {i} the archivist of the harbour town sorted {i * 3} letters and two maps."
                for i in range(1, 400))


def measure(extra_bufts: bool, prompt_tokens: int, gen_tokens: int, threads: int) -> dict:
    """One process, one load, one round (the child side)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import numpy as np

    from providers.llama_worker import load_llama
    from providers.local_models import gguf_path

    llm = load_llama(gguf_path("smollm2", {}), n_ctx=4096, n_threads=threads, n_batch=512, n_gpu_layers=0,
                     extra_bufts=extra_bufts, verbose=True)  # llama.cpp logs where the weights went
    assert bool(llm.model_params.use_extra_bufts) is extra_bufts
    tokens = llm.tokenize(TEXT.encode(), add_bos=True)[:prompt_tokens]
    llm.reset()
    started = time.perf_counter()
    llm.eval(tokens)
    prompt_s = time.perf_counter() - started
    n_vocab = llm.n_vocab()
    started = time.perf_counter()
    for _ in range(gen_tokens):  # greedy; the last position's logits (llama-cpp-python keeps no others)
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))
        llm.eval([int(np.argmax(logits))])
    gen_s = time.perf_counter() - started
    llm.close()
    return {"prompt_tps": len(tokens) / prompt_s, "gen_tps": gen_tokens / gen_s, "prompt_tokens": len(tokens)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child == "on", args.prompt_tokens, args.gen_tokens, args.threads)))
        return

    runs: dict[str, list[dict]] = {"on": [], "off": []}
    buffers: dict[str, list[str]] = {"on": [], "off": []}
    crashed: dict[str, str] = {}  # setting -> how its process died (the AMX crash, on an AMX CPU)
    for i in range(args.runs):
        for setting in ("on", "off") if i % 2 == 0 else ("off", "on"):
            if setting in crashed:
                continue
            out = subprocess.run([sys.executable, __file__, "--child", setting, "--prompt-tokens",
                                  str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens), "--threads",
                                  str(args.threads)], capture_output=True, text=True)
            buffers[setting] = [line.strip() for line in out.stderr.splitlines()
                                if "model buffer size" in line or "preferred buffer type" in line]
            if out.returncode != 0:
                crashed[setting] = describe_exit(out.returncode)
                continue
            runs[setting].append(json.loads(out.stdout.strip().splitlines()[-1]))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?")
    amx = " with AMX" if " amx_tile" in Path("/proc/cpuinfo").read_text() else ", no AMX"
    print(f"SmolLM2-135M Q4_1, {cpu}{amx}, {args.threads} threads, {args.prompt_tokens}-token prompt, "
          f"{args.gen_tokens} generated tokens, {args.runs} runs per setting")
    print(f"{'use_extra_bufts':<16}{'prompt tok/s: best, median (min)':<36}{'generation tok/s: best, median (min)'}")
    best = {}
    for setting in ("on", "off"):
        if setting in crashed:
            print(f"{setting:<16}the process died ({crashed[setting]})")
            continue
        p = [r["prompt_tps"] for r in runs[setting]]
        g = [r["gen_tps"] for r in runs[setting]]
        best[setting] = (max(p), max(g))  # the least disturbed run: other load only slows a run down
        print(f"{setting:<16}{max(p):>6.0f}, {statistics.median(p):>4.0f}  ({min(p):.0f}){'':<16}"
              f"{max(g):>6.1f}, {statistics.median(g):>5.1f}  ({min(g):.1f})")
    for setting in ("on", "off"):
        print(f"weights with use_extra_bufts {setting}:", *buffers[setting], sep="\n  ")
    if len(best) == 2:
        (p_on, g_on), (p_off, g_off) = best["on"], best["off"]
        print(f"off / on (best runs): prompt {p_off / p_on:.2f}x, generation {g_off / g_on:.2f}x")


if __name__ == "__main__":
    main()
