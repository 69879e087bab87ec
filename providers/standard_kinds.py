"""The kinds this distribution ships: openai, anthropic, local, local-embed
(the built-in benchmark models declare theirs in engine/benchmark/builtin/kind.py).

Each is registered by an entry point of group `tulving.providers` in
pyproject.toml, as a third-party kind would be. This module imports no
provider: the classes are named as "module:Class" and imported when used.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

from providers.http_pool import TIMEOUT_OPTIONS
from providers.kinds import (
    BOOL,
    INT,
    NUMBER,
    STRING,
    STRINGS,
    TABLE,
    Capabilities,
    Option,
    OptionError,
    ProviderKind,
)
from providers.models_anthropic import ANTHROPIC_MODELS
from providers.models_openai import OPENAI_MODELS

ANTHROPIC_API_VERSION = "2023-06-01"
# The HTTP clients an endpoint may use (providers/http_client.py); named here so
# that reading the kinds does not import aiohttp.
HTTP_CLIENTS = ("pool", "aiohttp")
DEFAULT_N_CTX = 8192

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# Headers the HTTP client owns: overriding them breaks framing or routing.
_RESERVED_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "content-type"}


def _check_headers(headers: object) -> None:
    assert isinstance(headers, Mapping)  # the TABLE type is checked first
    for header, value in headers.items():
        if not isinstance(header, str) or not _HEADER_NAME.fullmatch(header):
            raise OptionError(f"options.headers has an invalid header name {header!r}")
        if header.lower() in _RESERVED_HEADERS:
            raise OptionError(f"options.headers must not set {header} (the HTTP client sets it)")
        if not isinstance(value, str) or any(c in value for c in "\r\n\0"):
            raise OptionError(f"options.headers.{header} must be a one-line string, got {value!r}")


_TIMEOUT_DOCS = {
    "connect_timeout": "longest wait to open a connection (TCP and TLS)",
    "first_byte_timeout": "longest wait for the reply's first byte after sending",
    "read_timeout": "longest silence while reading a reply",
    "keepalive_timeout": "how long an idle connection is kept for reuse",
}

HTTP_OPTIONS = (
    Option("headers", TABLE, "extra HTTP headers sent with every call", check=_check_headers),
    Option("drop_params", STRINGS, "parameters never sent to this server (names of params keys)"),
    Option("trust_env", BOOL, "use the proxy and CA settings of the environment (HTTP_PROXY, ...)", default=False),
    Option("http_client", STRING, "the HTTP client: Tulving's pool or aiohttp", default="pool",
           choices=HTTP_CLIENTS),
    *(Option(name, NUMBER, _TIMEOUT_DOCS.get(name, name.replace("_", " ")), minimum=0, above_minimum=True,
             unit="seconds") for name in TIMEOUT_OPTIONS),
    Option("prompt_cache", BOOL, "the server caches shared prompt prefixes: mark and warm them", default=True),
    Option("stream", BOOL, "stream every chat call (server-sent events) and time its chunks", default=False),
)

BATCH_OPTIONS = (
    Option("batch", BOOL, "`--batch` sends chat calls through the batch API (false: a server without one)",
           default=True),
    Option("batch_poll", NUMBER, "wait before the first poll of a batch", default=10.0, minimum=0,
           above_minimum=True, unit="seconds"),
    Option("batch_poll_max", NUMBER, "longest wait between polls of a batch", default=300.0, minimum=0,
           above_minimum=True, unit="seconds"),
    Option("batch_queue_requests", INT, "most requests in submitted, unfinished batches (queue limit)",
           minimum=1),
    Option("batch_queue_tokens", INT, "most prompt tokens in submitted, unfinished batches (queue limit)",
           minimum=1),
    Option("batch_max_requests", INT, "most requests in one batch (lowers the API's own limit)", minimum=1),
    Option("batch_max_bytes", INT, "largest batch input in bytes (lowers the API's own limit)", minimum=1),
)

OPENAI = ProviderKind(
    name="openai",
    provider="providers.openai_http:OpenAIProvider",
    batch_api="providers.openai_batch:OpenAIBatchApi",
    doc="the OpenAI API and OpenAI-compatible servers (vLLM, llama.cpp server, ...)",
    capabilities=Capabilities(embeddings=True, stream=True, prompt_cache=True, cache_read_step=128,
                              charges_cache_writes=False, list_models=True, rate_limit_headers=True,
                              fine_tuning=True),
    options=(*HTTP_OPTIONS,
             Option("prompt_cache_key", BOOL, "send a prompt_cache_key derived from the shared prefix",
                    default=False),
             *BATCH_OPTIONS),
    # The public API, with the limits of a low usage tier; raise them in your config.
    default_endpoints={"openai": {"kind": "openai", "base_url": "https://api.openai.com/v1",
                                  "key_env": "OPENAI_API_KEY", "max_concurrency": 64, "rpm": 500,
                                  "input_tpm": 800_000, "output_tpm": 800_000}},
    default_models=OPENAI_MODELS,
)

ANTHROPIC = ProviderKind(
    name="anthropic",
    provider="providers.anthropic_http:AnthropicProvider",
    batch_api="providers.anthropic_batch:AnthropicBatchApi",
    doc="the Anthropic Messages API",
    capabilities=Capabilities(stream=True, prompt_cache=True, list_models=True, rate_limit_headers=True),
    options=(*HTTP_OPTIONS,
             Option("anthropic_version", STRING, "the anthropic-version header", default=ANTHROPIC_API_VERSION),
             *BATCH_OPTIONS),
    default_endpoints={"anthropic": {"kind": "anthropic", "base_url": "https://api.anthropic.com",
                                     "key_env": "ANTHROPIC_API_KEY", "max_concurrency": 32, "rpm": 50,
                                     "input_tpm": 40_000, "output_tpm": 8_000}},
    default_models=ANTHROPIC_MODELS,
)

LOCAL = ProviderKind(
    name="local",
    provider="providers.local_llama:LocalLlamaProvider",
    doc="a GGUF model run by llama.cpp in a worker process (pip install 'tulving-bench[local]')",
    options=(
        Option("model_path", STRING, "the .gguf file serving every model name of this endpoint"),
        Option("n_ctx", INT, "context window in tokens", default=DEFAULT_N_CTX, minimum=1),
        Option("n_threads", INT, "CPU threads (default: the cores this process may use)", minimum=1),
        Option("n_batch", INT, "prompt tokens evaluated per step", default=512, minimum=1),
        Option("n_gpu_layers", INT, "layers offloaded to a GPU (-1: all)", default=0, minimum=-1),
    ),
)

LOCAL_EMBED = ProviderKind(
    name="local-embed",
    provider="providers.local_embed:LocalEmbedProvider",
    doc="sentence embeddings computed in-process (all-MiniLM-L6-v2)",
    capabilities=Capabilities(chat=False, embeddings=True),
    options=(Option("model_dir", STRING, "a sentence-transformers BERT folder used instead of all-MiniLM-L6-v2"),),
)

# -- Google Gemini (checked 2026-11-26 through the search index of ai.google.dev:
# gemini-api/docs/deprecations, pricing, rate-limits, batch-api; not fetched live) --
# Prices, USD per million tokens (prompts up to 200k tokens: a 2.5 Pro prompt
# above costs 2.50 in / 15.00 out, not modelled); implicit-cache reads cost 10%
# of input; Batch Mode costs 50%; thinking tokens are billed as output.
# The leaderboard's Gemini rows are sent the user prompt only, no system
# instruction and no generation config: the issue (tulving issue 21) says the
# reference called `generate_content(model=..., contents=user_prompt)`; the
# stored versions of its models_wrapper.py (ahstat/episodic-memory-benchmark,
# 7 versions, newest d3f5d78) show no Gemini branch, so the ids are Google's.
_GEMINI_ROW: dict[str, object] = {"endpoint": "gemini", "system_prompt": False, "params": {},
                                  "batch_discount": 0.5, "context_tokens": 1_048_576, "checked": "2026-11-26"}

GEMINI = ProviderKind(
    name="gemini",
    provider="providers.gemini_http:GeminiProvider",
    batch_api="providers.gemini_batch:GeminiBatchApi",
    doc="the Gemini API (Google AI Studio keys): generateContent, streaming, Batch Mode",
    capabilities=Capabilities(stream=True, prompt_cache=True, charges_cache_writes=False, list_models=True),
    options=(*HTTP_OPTIONS,
             Option("api_version", STRING, "the API version in every path (the google-genai SDK's default)", default="v1"),
             *BATCH_OPTIONS),
    default_endpoints={
        # Tier-1 limits of Gemini 2.5 Pro (150 RPM, 2M TPM), halved for the tokens; raise them in your config.
        # google-genai reads GOOGLE_API_KEY first, then GEMINI_API_KEY; set key_env to use the former.
        "gemini": {"kind": "gemini", "base_url": "https://generativelanguage.googleapis.com",
                   "key_env": "GEMINI_API_KEY", "max_concurrency": 32, "rpm": 150, "input_tpm": 1_000_000},
    },
    default_models={
        # Current: shut down on 2026-12-01 (Google's deprecations page as read on 2026-11-10; replacements
        # gemini-3.8-flash for Pro, gemini-3.5-flash-lite for Flash).
        "gemini-2.5-pro": {**_GEMINI_ROW, "model": "gemini-2.5-pro", "price_in": 1.25, "price_cached_in": 0.125,
                           "price_out": 10.0},
        "gemini-2.5-flash": {**_GEMINI_ROW, "model": "gemini-2.5-flash", "price_in": 0.30, "price_cached_in": 0.03,
                             "price_out": 2.50},
        # Retired: gemini-2.0-flash shut down on 2026-06-01 (Firebase AI Logic notice); the experimental
        # 2.0 ids had no published shutdown date and were gone by then at the latest (free while they ran).
        "gemini-2-flash": {**_GEMINI_ROW, "model": "gemini-2.0-flash", "price_in": 0.10, "price_cached_in": 0.025,
                           "price_out": 0.40, "retired": "2026-06-01", "replacement": "gemini-flash"},
        "gemini-2-pro": {**_GEMINI_ROW, "model": "gemini-2.0-pro-exp-02-05", "price_in": 0.0, "price_out": 0.0,
                         "retired": "2026-06-01", "replacement": "gemini-flash"},
        "gemini-2-flash-thinking": {**_GEMINI_ROW, "model": "gemini-2.0-flash-thinking-exp-01-21", "price_in": 0.0,
                                    "price_out": 0.0, "retired": "2026-06-01", "replacement": "gemini-flash"},
        # The current defaults (released 2026-09-02 and 2026-07-21; no shutdown date announced). 3.8 Flash is at
        # half price until 2026-12-31 (1.50 / 7.50 from 2027-01-01).
        "gemini-flash": {"endpoint": "gemini", "model": "gemini-3.8-flash", "params": {"temperature": 1.0},
                         "price_in": 0.75, "price_cached_in": 0.075, "price_out": 3.75, "batch_discount": 0.5,
                         "context_tokens": 1_048_576, "checked": "2026-11-26"},
        "gemini-flash-lite": {"endpoint": "gemini", "model": "gemini-3.5-flash-lite", "params": {"temperature": 1.0},
                              "price_in": 0.30, "price_cached_in": 0.03, "price_out": 2.50, "batch_discount": 0.5,
                              "context_tokens": 1_048_576, "checked": "2026-11-26"},
    },
)
