"""How much prefix ordering saves on the local llama.cpp model.

llama.cpp keeps only the previous sequence's KV cache, so questions about the
same book context are cheap when asked back to back and expensive when
interleaved with other contexts. This runs the same requests -- C contexts of
about T tokens from the published book, Q short questions each -- three ways:

  interleaved  provider called directly: ctx1 q1, ctx2 q1, ..., ctx1 q2, ...
  grouped      provider called directly: ctx1 q1..qQ, ctx2 q1..qQ, ...
  engine       the interleaved list handed to the Engine (no cache), whose
               dispatcher picks the waiting call sharing the longest prefix

    python benchmarks/prefix_order_bench.py [--contexts 3 --questions 4 --tokens 1500]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.benchmark.datadir import published_book_dir  # noqa: E402
from engine.config import Config  # noqa: E402
from engine.requests import ChatRequest  # noqa: E402
from engine.scheduler import Engine  # noqa: E402
from providers.base import EndpointSpec  # noqa: E402
from providers.local_llama import LocalLlamaProvider  # noqa: E402
from providers.local_models import gguf_path  # noqa: E402

QUESTIONS = ["Who is the first person named?", "Where does the first scene take place?",
             "What activity is described?", "What happens at the end?",
             "Which date is mentioned?", "Who else is there?"]
SYSTEM = "Answer the question about the text in a few words."


def contexts(count: int, tokens: int, tokenize) -> list[str]:
    """`count` book excerpts of about `tokens` tokens, from distant parts."""
    paragraphs = [p for p in (published_book_dir() / "book.txt").read_text().split("\n\n") if p.strip()]
    step = len(paragraphs) // count
    out = []
    for c in range(count):
        chunk: list[str] = []
        for paragraph in paragraphs[c * step:]:
            if len(tokenize("\n\n".join(chunk + [paragraph]))) > tokens:
                break
            chunk.append(paragraph)
        out.append("\n\n".join(chunk))
    return out


def messages(context: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"{context}\n\nQuestion: {question}"}]


async def timed_direct(provider: LocalLlamaProvider, order: list[tuple[int, int]], ctxs: list[str],
                       max_tokens: int) -> float:
    # An unrelated call first, so that no context is in the KV cache.
    await provider.chat("smollm2", [{"role": "user", "content": "Hello."}], params={"max_tokens": 1}, timeout=600)
    start = time.perf_counter()
    for c, q in order:
        await provider.chat("smollm2", messages(ctxs[c], QUESTIONS[q]),
                            params={"temperature": 0.0, "max_tokens": max_tokens}, timeout=1800)
    return time.perf_counter() - start


async def timed_engine(order: list[tuple[int, int]], ctxs: list[str], max_tokens: int) -> tuple[float, int]:
    requests = [ChatRequest(model="local:smollm2", messages=messages(ctxs[c], QUESTIONS[q]), max_tokens=max_tokens,
                            tag=(c, q)) for c, q in order]
    async with Engine(Config.load()) as engine:
        # Load the model outside the timing, as the direct runs do.
        await engine.run([ChatRequest(model="local:smollm2", messages=[{"role": "user", "content": "Hello."}],
                                      max_tokens=1)])
        start = time.perf_counter()
        outcomes = await engine.run(requests)
        elapsed = time.perf_counter() - start
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise SystemExit(f"engine run failed: {failed[0].error}")
    return elapsed, len(outcomes)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, default=3)
    parser.add_argument("--questions", type=int, default=4, choices=range(1, len(QUESTIONS) + 1))
    parser.add_argument("--tokens", type=int, default=1500, help="tokens per context")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens per answer")
    parser.add_argument("--no-engine", action="store_true", help="skip the run through the Engine")
    args = parser.parse_args()

    provider = LocalLlamaProvider(EndpointSpec(name="local", kind="local"))
    # The model runs in the provider's worker process (loaded by timed_direct's
    # first call, outside the timings); here only its tokenizer.
    from llama_cpp import Llama

    llm = Llama(str(gguf_path("smollm2", {})), vocab_only=True, verbose=False)
    ctxs = contexts(args.contexts, args.tokens, lambda s: llm.tokenize(s.encode(), add_bos=False))
    sizes = [len(llm.tokenize(c.encode(), add_bos=False)) for c in ctxs]
    interleaved = [(c, q) for q in range(args.questions) for c in range(args.contexts)]
    grouped = sorted(interleaved)
    print(f"{args.contexts} contexts of {sizes} tokens x {args.questions} questions, "
          f"max_tokens {args.max_tokens}, n_threads {provider.n_threads}")

    before = provider.stats.reused_prefix_tokens
    t_inter = await timed_direct(provider, interleaved, ctxs, args.max_tokens)
    reused_inter = provider.stats.reused_prefix_tokens - before
    before = provider.stats.reused_prefix_tokens
    t_group = await timed_direct(provider, grouped, ctxs, args.max_tokens)
    reused_group = provider.stats.reused_prefix_tokens - before
    await provider.aclose()
    n = len(interleaved)
    print(f"interleaved (direct): {t_inter:7.1f} s  {t_inter / n:5.2f} s/request  prefix tokens reused {reused_inter}")
    print(f"grouped     (direct): {t_group:7.1f} s  {t_group / n:5.2f} s/request  prefix tokens reused {reused_group}")
    print(f"speed-up grouped vs interleaved: {t_inter / t_group:.1f}x")
    if not args.no_engine:
        t_engine, count = await timed_engine(interleaved, ctxs, args.max_tokens)
        print(f"engine, interleaved input: {t_engine:7.1f} s  {t_engine / count:5.2f} s/request  "
              f"speed-up vs interleaved {t_inter / t_engine:.1f}x")


if __name__ == "__main__":
    asyncio.run(main())
