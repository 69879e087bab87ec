"""Requests a provider billed against what `tulving run` counted, side by
side, on the loopback server (nothing leaves this machine):

1. Gemini Batch Mode whose results come back without their keys and out of
   order (the loopback's --gemini-batch-drop-keys --gemini-batch-reorder, the
   faults googleapis/python-genai#2008 and #1909 report): lines the server ran
   and billed, batches it received, against the run's paid lines and dollars.
2. OpenRouter, which reports each call's cost in `usage.cost`: the server's
   billed dollars against the run's counted dollars and the price table's.

    python benchmarks/paid_vs_counted.py [--book synaptic-echoes-short]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.loopback.compat import OPENROUTER_COST_PER_TOKEN  # noqa: E402
from engine.loopback.server import LoopbackServer  # noqa: E402

GEMINI = ('[endpoints.gem]\nkind = "gemini"\nbase_url = "{url}"\nmax_attempts = 3\n'
          'options = {{ batch_poll = 0.02, batch_poll_max = 0.05 }}\n\n'
          '[models.gem-reader]\nendpoint = "gem"\nmodel = "gemini-2.5-flash"\nsystem_prompt = false\n'
          'params = {{ temperature = 0.0, max_tokens = 32 }}\nprice_in = 0.30\nprice_out = 2.50\n')
OPENROUTER = ('[endpoints.or]\nkind = "openrouter"\nbase_url = "{url}"\nmax_attempts = 3\n\n'
              '[models.or-reader]\nendpoint = "or"\nmodel = "reader"\nparams = {{ max_tokens = 32 }}\n'
              'price_in = 0.90\nprice_out = 0.90\n')


async def tulving(folder: Path, config: str, model: str, book: str, *extra: str) -> tuple[int, dict, str]:
    (folder / "tulving.toml").write_text(config)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "engine.cli", "--quiet", "--config", "tulving.toml", "--cache", "c.sqlite", "run",
        "--book", book, "--models", model, "--modes", "in-context", "--judge", "builtin:judge", "--out", "run",
        *extra, cwd=folder, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    [row] = [r for r in json.loads((folder / "run" / "scores.json").read_text())["spending"] if r["model"] == model]
    return proc.returncode or 0, row, err.decode()


async def gemini(book: str) -> None:
    async with LoopbackServer(models=["gemini-2.5-flash"]) as server:
        server.gemini.batch_drop_keys = server.gemini.batch_reorder = True
        with tempfile.TemporaryDirectory() as tmp:
            code, row, err = await tulving(Path(tmp), GEMINI.format(url=server.gemini_base_url), "gem-reader", book,
                                           "--batch")
        stats = server.stats
        billed = (stats.input_tokens * 0.30 + stats.output_tokens * 2.50) / 1e6 * 0.5
        batches = sum(n for path, n in stats.by_path.items() if path.endswith(":batchGenerateContent"))
    print(f"gemini --batch, keys dropped and order reversed (exit {code}):")
    print(f"  server: {stats.batch_requests['succeeded']} lines run and billed in {batches} batch(es), "
          f"${billed:.6f} at the batch price")
    print(f"  run:    {row['calls']} calls, {row['paid_no_answer']} paid without an answer, "
          f"${row['spent_usd']:.6f} counted")
    print("  " + (err.strip().splitlines() or [""])[-1])


async def openrouter(book: str) -> None:
    async with LoopbackServer(models=["reader"], compat="openrouter") as server:
        with tempfile.TemporaryDirectory() as tmp:
            code, row, _ = await tulving(Path(tmp), OPENROUTER.format(url=server.openai_base_url), "or-reader", book)
        stats = server.stats
        billed = (stats.input_tokens + stats.output_tokens) * OPENROUTER_COST_PER_TOKEN
        calls = stats.by_path.get("/v1/chat/completions", 0)
    print(f"openrouter, usage.cost on every reply (exit {code}):")
    print(f"  server: {calls} requests billed, ${billed:.6f} in usage.cost")
    print(f"  run:    {row['calls']} calls, ${row['spent_usd']:.6f} counted (reported ${row['reported_usd']:.6f}; "
          f"the price table says ${row['table_usd']:.6f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--book", default="synaptic-echoes-short")
    args = parser.parse_args()
    asyncio.run(gemini(args.book))
    asyncio.run(openrouter(args.book))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
