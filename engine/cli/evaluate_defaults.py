"""The defaults of `tulving run`: what its options show in --help and what
engine/cli/evaluate_handlers.py runs without them."""
from __future__ import annotations

DEFAULT_BOOK = "synaptic-echoes-short"
DEFAULT_JUDGE = "builtin:judge"
DEFAULT_EMBED = "text-embedding-3-small"  # the paper's
OFFLINE_EMBED = "local:minilm"
DEFAULT_READER = "builtin:reader"
# The memory modes of the default run (rag-paragraph when the offline embedder works),
# beside the no-memory floor.
DEFAULT_MODES = ("in-context", "rag-paragraph", "no-memory")
LOCAL_LLM = "local:smollm2"
# Questions the local LLM answers in the default run: it took 10 s (idle) to
# 40 s (loaded) a question on 2 cores, and the default run must finish within
# a minute.
DEFAULT_LOCAL_SAMPLE = 1
