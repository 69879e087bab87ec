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
    AUTO_BOOL,
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

# The current anthropic-version (checked 2026-11-28, Anthropic's versioning page): the SDKs send it since
# 2026-10-21; "previous versions are considered deprecated and may be unavailable for new users", so a
# new account works only on it. It takes no temperature/top_p/top_k (providers/anthropic_http.py).
ANTHROPIC_API_VERSION = "2026-10-21"
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
    Option("batch", AUTO_BOOL, "`--batch` sends chat calls through the batch API (false: a server without one; "
           '"auto": direct calls when the server answers 404/405 on its batch list)', default=True),
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
             Option("anthropic_version", STRING, "the anthropic-version header (\"2023-06-01\": the version that "
                                                 "still takes temperature, for accounts that have it)",
                    default=ANTHROPIC_API_VERSION),
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
    options=(Option("model_dir", STRING, "a sentence-transformers BERT folder used instead of all-MiniLM-L6-v2"),
             Option("precomputed", BOOL, "read the shipped vectors of the default book's chunks and questions "
                                         "instead of computing them (used only with the model they came from)",
                    default=True)),
)

# -- Google Gemini (checked 2026-11-26 through the search index of ai.google.dev:
# gemini-api/docs/deprecations, pricing, rate-limits, batch-api; not fetched live) --
# Prices, USD per million tokens (prompts up to 200k tokens: a 2.5 Pro prompt
# above costs 2.50 in / 15.00 out, not modelled); implicit-cache reads cost 10%
# of input; Batch Mode costs 50%; thinking tokens are billed as output.
# The leaderboard's Gemini rows are sent the user prompt only, no system
# instruction and no generation config: as reported when Gemini was added, the
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
        # 2.5 Pro prompts over 200k tokens: $2.50 in, $0.25 cached, $15.00 out (the pricing page, checked
        # 2026-11-28).
        "gemini-2.5-pro": {**_GEMINI_ROW, "model": "gemini-2.5-pro", "price_in": 1.25, "price_cached_in": 0.125,
                           "price_out": 10.0, "shutdown": "2026-12-01", "replacement": "gemini-flash",
                           "prices": [{"above": 200_000, "price_in": 2.50, "price_cached_in": 0.25, "price_out": 15.0,
                                       "source": "ai.google.dev/gemini-api/docs/pricing, prompts > 200k "
                                                 "(checked 2026-11-28)"}]},
        "gemini-2.5-flash": {**_GEMINI_ROW, "model": "gemini-2.5-flash", "price_in": 0.30, "price_cached_in": 0.03,
                             "price_out": 2.50, "shutdown": "2026-12-01", "replacement": "gemini-flash-lite"},
        # Retired: gemini-2.0-flash shut down on 2026-06-01 (Firebase AI Logic notice); the experimental
        # 2.0 ids had no published shutdown date and were gone by then at the latest (free while they ran).
        "gemini-2-flash": {**_GEMINI_ROW, "model": "gemini-2.0-flash", "price_in": 0.10, "price_cached_in": 0.025,
                           "price_out": 0.40, "retired": "2026-06-01", "replacement": "gemini-flash"},
        "gemini-2-pro": {**_GEMINI_ROW, "model": "gemini-2.0-pro-exp-02-05", "price_in": 0.0, "price_out": 0.0,
                         "retired": "2026-06-01", "replacement": "gemini-flash"},
        "gemini-2-flash-thinking": {**_GEMINI_ROW, "model": "gemini-2.0-flash-thinking-exp-01-21", "price_in": 0.0,
                                    "price_out": 0.0, "retired": "2026-06-01", "replacement": "gemini-flash"},
        # The current defaults (released 2026-09-02 and 2026-07-21; no shutdown date announced). 3.8 Flash is at
        # half price through 2026-12-31: $0.75 / $0.075 cached / $3.75, then $1.50 / $0.15 / $7.50 from
        # 2027-01-01 (the pricing page: "$0.75 through December 31, 2026", as transcribed 2026-10-07; LiteLLM's
        # announcement; checked 2026-11-28). The base prices are the lasting ones; the band is the offer.
        "gemini-flash": {"endpoint": "gemini", "model": "gemini-3.8-flash", "params": {"temperature": 1.0},
                         "price_in": 1.50, "price_cached_in": 0.15, "price_out": 7.50, "batch_discount": 0.5,
                         "prices": [{"until": "2026-12-31", "price_in": 0.75, "price_cached_in": 0.075,
                                     "price_out": 3.75, "source": "Google's introductory price through "
                                                                  "2026-12-31 (checked 2026-11-28)"}],
                         "context_tokens": 1_048_576, "checked": "2026-11-28"},
        "gemini-flash-lite": {"endpoint": "gemini", "model": "gemini-3.5-flash-lite", "params": {"temperature": 1.0},
                              "price_in": 0.30, "price_cached_in": 0.03, "price_out": 2.50, "batch_discount": 0.5,
                              "context_tokens": 1_048_576, "checked": "2026-11-26"},
    },
)

# -- OpenAI-compatible services ------------------------------------------------------
# Each speaks OpenAI's /chat/completions through OpenAIProvider (Azure only keys it
# differently: providers/azure_openai.py). Facts below were checked on 2026-11-26
# through the search index of the providers' pages (not fetched live); each says where.
# None of them has a batch API Tulving drives: `tulving run --batch` refuses their
# models (xAI has a batch API of its own shape, docs.x.ai "Batch API", not wired here).

COMPAT_CAPABILITIES = Capabilities(stream=True, prompt_cache=True, charges_cache_writes=False, list_models=True)

# The provider lists the reference sent to OpenRouter for DeepSeek prompts over 60,000
# tokens (ahstat/episodic-memory-benchmark, epbench/src/models/models_wrapper.py, the
# "Deepseek fallback to OpenRouter" branch), with "include_reasoning": true.
REFERENCE_DEEPSEEK_ROUTE = {"order": ["Fireworks"],
                            "ignore": ["Avian", "Novita", "DeepInfra", "Featherless", "DeepSeek", "Kluster",
                                       "Nebius", "Together"]}
LONG_PROMPT_TOKENS = 60_000  # the reference's switch: count_tokens(user_prompt) > 60000

XAI = ProviderKind(
    name="xai",
    provider="providers.openai_http:OpenAIProvider",
    doc="xAI's OpenAI-compatible API (Grok models)",
    capabilities=COMPAT_CAPABILITIES,
    options=HTTP_OPTIONS,
    # Limits: far below the documented 620 requests and 10M tokens a minute of
    # grok-4-fast (docs.x.ai/developers/models/grok-4-fast-non-reasoning, checked 2026-11-26).
    default_endpoints={"xai": {"kind": "xai", "base_url": "https://api.x.ai/v1", "key_env": "XAI_API_KEY",
                               "max_concurrency": 16, "rpm": 120, "input_tpm": 2_000_000,
                               "output_tpm": 200_000}},
    default_models={
        # The reference called both with the system and user messages, stream=False and
        # no max_tokens / temperature (models_wrapper.py, "Grok" branch). xAI retired
        # them on 2026-05-15: the slugs now run grok-4.3 at its prices
        # (docs.x.ai/developers/migration/may-15-retirement, checked 2026-11-26).
        # Prices as they were: $0.20 in, $0.05 cached, $0.50 out, 2M context
        # (docs.x.ai/developers/models/grok-4-fast-non-reasoning).
        "grok-4-fast-reasoning": {"endpoint": "xai", "model": "grok-4-fast-reasoning", "params": {},
                                  "price_in": 0.2, "price_cached_in": 0.05, "price_out": 0.5,
                                  "context_tokens": 2_000_000, "retired": "2026-05-15",
                                  "replacement": "grok-4.3", "checked": "2026-11-26"},
        "grok-4-fast-non-reasoning": {"endpoint": "xai", "model": "grok-4-fast-non-reasoning", "params": {},
                                      "price_in": 0.2, "price_cached_in": 0.05, "price_out": 0.5,
                                      "context_tokens": 2_000_000, "retired": "2026-05-15",
                                      "replacement": "grok-4.3", "checked": "2026-11-26"},
        # xAI's named replacement: $1.25 in, $2.50 out, 1M context (the retirement page);
        # cached input $0.20 as listed for grok-4.20 (docs.x.ai/developers/models/grok-4.20-0309).
        # Prompts over 204,800 tokens cost $2.50 in and $5.00 out (tiered by prompt size, output at twice the
        # tier's input price: docs.apiyi.com/en/models/grok-4-3, checked 2026-11-28); no cached price is
        # given for that tier, so the base $0.20 stands. Reasoning is always on; xAI reports its tokens
        # outside completion_tokens (counted: providers/openai_http.py).
        "grok-4.3": {"endpoint": "xai", "model": "grok-4.3", "params": {}, "price_in": 1.25,
                     "price_cached_in": 0.2, "price_out": 2.5, "context_tokens": 1_000_000,
                     "prices": [{"above": 204_800, "price_in": 2.50, "price_out": 5.0,
                                 "source": "xAI tiered pricing over 204,800 prompt tokens (checked 2026-11-28)"}],
                     "checked": "2026-11-28"},
    },
)

DEEPSEEK = ProviderKind(
    name="deepseek",
    provider="providers.openai_http:OpenAIProvider",
    doc="DeepSeek's OpenAI-compatible API (usage in cache hits and misses, reasoning_content)",
    capabilities=COMPAT_CAPABILITIES,
    options=HTTP_OPTIONS,
    # DeepSeek sets no fixed rate limit (api-docs.deepseek.com "Rate Limit"): modest defaults.
    default_endpoints={"deepseek": {"kind": "deepseek", "base_url": "https://api.deepseek.com",
                                    "key_env": "DEEPSEEK_API_KEY", "max_concurrency": 16, "rpm": 120,
                                    "input_tpm": 2_000_000, "output_tpm": 200_000, "timeout": 1800}},
    default_models={
        # The reference: deepseek-chat / deepseek-reasoner with the system and user
        # messages, no max_tokens / temperature; prompts over 60,000 tokens to OpenRouter
        # (models_wrapper.py). DeepSeek retired both names on 2026-07-24 15:59 UTC for
        # deepseek-v4-flash (api-docs.deepseek.com/news/news260424 as quoted by
        # github.com/Open-Less/openless/issues/132, checked 2026-11-26). Prices of the
        # time: V3 $0.27 miss / $0.07 hit / $1.10 out, R1 $0.55 / $0.14 / $2.19
        # (api-docs.deepseek.com/quick_start/pricing-details-usd).
        "deepseek-v3": {"endpoint": "deepseek", "model": "deepseek-chat", "params": {},
                        "price_in": 0.27, "price_cached_in": 0.07, "price_out": 1.1,
                        "long_prompt_tokens": LONG_PROMPT_TOKENS, "long_prompt_model": "deepseek-v3-openrouter",
                        "retired": "2026-07-24", "replacement": "deepseek-v4-flash", "checked": "2026-11-26"},
        "deepseek-r1": {"endpoint": "deepseek", "model": "deepseek-reasoner", "params": {},
                        "price_in": 0.55, "price_cached_in": 0.14, "price_out": 2.19,
                        "long_prompt_tokens": LONG_PROMPT_TOKENS, "long_prompt_model": "deepseek-r1-openrouter",
                        "retired": "2026-07-24", "replacement": "deepseek-v4-flash", "checked": "2026-11-26"},
        # DeepSeek's named successor: $0.14 miss, $0.0028 hit, $0.28 out, 1M context
        # (api-docs.deepseek.com/quick_start/pricing as quoted 2026-07-04 by factquire.com).
        # Third-party pages report V4.1 Flash (2026-09-10) now serving this name.
        "deepseek-v4-flash": {"endpoint": "deepseek", "model": "deepseek-v4-flash", "params": {},
                              "price_in": 0.14, "price_cached_in": 0.0028, "price_out": 0.28,
                              "context_tokens": 1_000_000, "checked": "2026-11-26"},
    },
)

OPENROUTER = ProviderKind(
    name="openrouter",
    provider="providers.openai_http:OpenAIProvider",
    doc="OpenRouter (provider routing in alias params: provider = {order, ignore, ...}; reasoning kept)",
    capabilities=Capabilities(stream=True, prompt_cache=True, charges_cache_writes=True, list_models=True),
    options=HTTP_OPTIONS,
    default_endpoints={"openrouter": {"kind": "openrouter", "base_url": "https://openrouter.ai/api/v1",
                                      "key_env": "OPENROUTER_API_KEY", "max_concurrency": 16, "rpm": 60,
                                      "input_tpm": 1_000_000, "output_tpm": 100_000, "timeout": 1800}},
    default_models={
        # Where deepseek-v3 / -r1 send prompts over 60,000 tokens, as the reference did:
        # model "deepseek/" + name ("deepseek-r1" for the reasoner), the provider lists
        # above, "include_reasoning": true, no max_tokens / temperature (models_wrapper.py).
        # OpenRouter ids deepseek/deepseek-chat and deepseek/deepseek-r1 listed on
        # openrouter.ai (checked 2026-11-26). OpenRouter bills the serving provider's price
        # (Fireworks first here), reported per call in usage.cost; the prices below are
        # Fireworks' list prices as third-party catalogues give them, not OpenRouter's own page.
        "deepseek-v3-openrouter": {"endpoint": "openrouter", "model": "deepseek/deepseek-chat",
                                   "params": {"provider": REFERENCE_DEEPSEEK_ROUTE, "include_reasoning": True},
                                   "price_in": 0.9, "price_out": 0.9, "checked": "2026-11-26"},
        "deepseek-r1-openrouter": {"endpoint": "openrouter", "model": "deepseek/deepseek-r1",
                                   "params": {"provider": REFERENCE_DEEPSEEK_ROUTE, "include_reasoning": True},
                                   "price_in": 3.0, "price_out": 8.0, "checked": "2026-11-26"},
        # The reference's llama row: OpenRouter, "meta-llama/" + "llama-3.1-405b-instruct",
        # provider order Fireworks, the system and user messages, no max_tokens / temperature
        # (models_wrapper.py as first published; a later version added both for llama-4).
        # Fireworks lists it at $3 in / $3 out (inferencebench.io, checked 2026-11-26).
        "llama-3.1-405b": {"endpoint": "openrouter", "model": "meta-llama/llama-3.1-405b-instruct",
                           "params": {"provider": {"order": ["Fireworks"]}},
                           "price_in": 3.0, "price_out": 3.0, "context_tokens": 131_072, "checked": "2026-11-26"},
    },
)

AZURE_OPENAI = ProviderKind(
    name="azure-openai",
    provider="providers.azure_openai:AzureOpenAIProvider",
    doc="Azure OpenAI's v1 API (base_url https://RESOURCE.openai.azure.com/openai/v1; api-key header; "
        "model = deployment name)",
    capabilities=Capabilities(embeddings=True, stream=True, prompt_cache=True, cache_read_step=128,
                              charges_cache_writes=False, rate_limit_headers=True),
    options=HTTP_OPTIONS,
)
