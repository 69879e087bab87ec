"""Build the shipped embedding table (providers/embed_table.py): the vectors
all-MiniLM-L6-v2 gives for a published book's RAG chunks (both modes) and its
questions, computed here with the numpy encoder the `local-embed` endpoint
runs. Rerun it when the book, the chunking or the question set changes
(tests/test_local_embed.py fails until then).

    python benchmarks/build_embed_table.py [--books synaptic-echoes-short ...]

Size: 384 float32 a text, ~1.5 KB; the default short book's 596 texts make
~0.9 MB, the long book would add ~3 MB (1,966 texts).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.benchmark.evaluation.rag import index_texts  # noqa: E402
from engine.benchmark.generation.published import SHORT, load_book  # noqa: E402
from providers import embed_table  # noqa: E402
from providers.local_embed import MiniLMEncoder  # noqa: E402
from providers.local_models import minilm_dir  # noqa: E402


def main(args: argparse.Namespace) -> None:
    texts: dict[bytes, str] = {}
    for name in args.books:
        for text in index_texts(load_book(name)):
            texts.setdefault(embed_table.text_key(text), text)
    folder = minilm_dir("all-MiniLM-L6-v2", {})
    encoder = MiniLMEncoder(folder)
    ordered = list(texts.values())
    start = time.perf_counter()
    vectors, _ = encoder.encode(ordered)
    tokens = [len(ids) for ids in encoder.token_ids(ordered)]
    seconds = time.perf_counter() - start
    table = embed_table.build(embed_table.model_digest(folder), ordered, vectors, tokens)
    table.save(args.out)
    print(f"{len(ordered)} texts ({sum(tokens)} tokens) of {', '.join(args.books)} embedded in {seconds:.1f} s; "
          f"{args.out}: {args.out.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--books", nargs="+", default=[SHORT])
    parser.add_argument("--out", type=Path, default=embed_table.TABLE_PATH)
    main(parser.parse_args())
