"""The types every layer shares, and the one interface every provider implements.

This is the lowest layer of the package (see tests/test_layers.py): it imports
nothing of Tulving's. It holds the normalised results a provider returns
(`ChatResult`, `EmbedResult`), the classified errors it raises
(`ProviderError` and its kinds), the base of the user-facing errors
(`TulvingError`), an endpoint's settings (`EndpointSpec`) and `Provider`.

A provider turns a resolved request into one wire call and normalises the
reply. It does no retries, no rate limiting and no caching: the engine owns
those (see engine/scheduler.py), so every provider module stays small.
"""
from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeAlias

# A JSON value as read from or written to a file or the wire (orjson/json
# give these back): the one recursive type for data whose shape is checked
# where it is read, instead of `object` or `Any`.
JSONValue: TypeAlias = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]
JSONObject: TypeAlias = dict[str, JSONValue]


class TulvingError(Exception):
    """Bad input or a condition the user must fix: a malformed config, book or
    universe, an unknown model, a missing key or model file. The CLI prints
    `str(err)` (one line) and exits with `exit_code`."""

    exit_code = 2


@dataclass(frozen=True, slots=True)
class StreamTimings:
    """When the pieces of a streamed reply arrived, in seconds after the request
    was sent (perf_counter differences). Only a streamed call has them; they are
    not cached (a cached reply is never timed)."""

    ttft: float                        # the first chunk carrying output text
    chunk_times: tuple[float, ...]     # every chunk carrying output text, the first included
    first_byte: float | None = None    # the reply's first byte (status line), when known


@dataclass(frozen=True, slots=True)
class RateLimitInfo:
    """The limits a reply's headers reported: OpenAI's `x-ratelimit-*` (reset as
    a relative duration) or Anthropic's `anthropic-ratelimit-*` (reset as an
    absolute RFC 3339 time). None where a header was absent or unreadable.
    Resets are seconds from when the reply arrived; `tokens_*` is the most
    restrictive token limit in force (OpenAI's only token limit)."""

    requests_limit: float | None = None
    requests_remaining: float | None = None
    requests_reset: float | None = None
    tokens_limit: float | None = None
    tokens_remaining: float | None = None
    tokens_reset: float | None = None
    input_tokens_limit: float | None = None
    input_tokens_remaining: float | None = None
    input_tokens_reset: float | None = None
    output_tokens_limit: float | None = None
    output_tokens_remaining: float | None = None
    output_tokens_reset: float | None = None


@dataclass(slots=True)
class ChatResult:
    """A provider's normalised chat reply.

    `input_tokens` counts the whole prompt; `cache_read_tokens` and
    `cache_write_tokens` are the parts of it the provider read from / wrote to
    its prompt cache (OpenAI `prompt_tokens_details.cached_tokens`; Anthropic
    `cache_read_input_tokens` / `cache_creation_input_tokens`, which Anthropic
    reports beside `input_tokens`, so they are added to it here)."""

    text: str
    finish_reason: str = "stop"
    input_tokens: int = 0
    output_tokens: int = 0
    latency: float = 0.0  # seconds, wall time of the successful attempt
    request_id: str | None = None
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0  # the part of cache_write_tokens written to Anthropic's 1-hour cache (priced apart)
    timings: StreamTimings | None = None     # a streamed call's arrival times (not cached)
    rate_limits: RateLimitInfo | None = None  # what the reply's headers said (not cached)
    batched: bool = False                     # answered through a batch API: priced at the batch discount (not cached)
    # The server sent no usage (an OpenAI-compatible server ignoring stream_options.include_usage):
    # input/output tokens were counted here, in cl100k_base (providers/tokens.py). Not cached.
    usage_counted_locally: bool = False
    # The model's reasoning text sent beside the answer (DeepSeek `reasoning_content`,
    # OpenRouter `reasoning`); kept in the cache and the results, never judged. Its
    # tokens are already in `output_tokens` (the providers count them in completion_tokens).
    reasoning: str | None = None
    # What the provider says the call cost, in USD (OpenRouter's usage.cost): counted instead of the
    # price table's figure, which stays the estimate and the cross-check (engine/prices.py).
    reported_cost: float | None = None


@dataclass(slots=True)
class EmbedResult:
    """A provider's normalised embedding reply: one vector per input text."""

    vectors: list[list[float]]
    input_tokens: int = 0
    latency: float = 0.0
    request_id: str | None = None
    rate_limits: RateLimitInfo | None = None  # what the reply's headers said (not cached)


Result = ChatResult | EmbedResult

# A chat message may carry PREFIX_END (an int): the characters of its content
# that end the prompt prefix shared with other requests (a book before its
# question). Providers with prompt caching mark their cache there (Anthropic
# `cache_control` on the block ending it); every provider sends the message
# without the key. The engine adds it on the way to a provider (engine/warmup.py);
# it is never part of a cache key.
PREFIX_END = "prefix_end"

class ErrorKind(StrEnum):
    """What went wrong with a call. Values are the strings written to results
    and reports (a StrEnum: JSON and the cache hold the same text as before).
    The engine retries the RETRYABLE ones with backoff."""

    RATE_LIMITED = "rate_limited"        # 429; carries retry_after when the server said so
    OVERLOADED = "overloaded"            # 500/502/503/504, Anthropic 529
    TIMEOUT = "timeout"                  # no complete reply within the attempt timeout
    CONNECTION = "connection"            # refused, reset, truncated body
    BAD_REPLY = "bad_reply"              # a 200 whose body is not the expected format
    BAD_REQUEST = "bad_request"          # 400/404/422: the request itself is wrong
    PROMPT_TOO_LONG = "prompt_too_long"  # the prompt does not fit the model's context
    AUTH = "auth"                        # 401/403 or a missing key
    CONTENT_FILTER = "content_filter"    # refused by the provider's safety system
    CONFIG = "config"                    # unknown model, missing model file, ...
    BUDGET = "budget"                    # not sent: the run's max_cost would be exceeded
    CRASHED = "crashed"                  # a local model's worker process died on this call again
    CANCELLED = "cancelled"              # its batch was cancelled before it ran (a rerun sends it again)
    UNMATCHED = "unmatched"              # the provider ran and billed it, but its answer cannot be told apart (final)


# The short names every module imports.
RATE_LIMITED = ErrorKind.RATE_LIMITED
OVERLOADED = ErrorKind.OVERLOADED
TIMEOUT = ErrorKind.TIMEOUT
CONNECTION = ErrorKind.CONNECTION
BAD_REPLY = ErrorKind.BAD_REPLY
BAD_REQUEST = ErrorKind.BAD_REQUEST
PROMPT_TOO_LONG = ErrorKind.PROMPT_TOO_LONG
AUTH = ErrorKind.AUTH
CONTENT_FILTER = ErrorKind.CONTENT_FILTER
CONFIG = ErrorKind.CONFIG
BUDGET = ErrorKind.BUDGET
CRASHED = ErrorKind.CRASHED
CANCELLED = ErrorKind.CANCELLED
UNMATCHED = ErrorKind.UNMATCHED

RETRYABLE = frozenset({RATE_LIMITED, OVERLOADED, TIMEOUT, CONNECTION, BAD_REPLY})


class ProviderError(Exception):
    """A classified provider failure. `str(err)` is one line, safe to log
    (never contains a key)."""

    def __init__(self, kind: ErrorKind | str, message: str, *, status: int | None = None,
                 retry_after: float | None = None, request_id: str | None = None,
                 rate_limits: RateLimitInfo | None = None):
        super().__init__(message)
        self.kind = ErrorKind(kind)
        self.message = message
        self.status = status
        self.retry_after = retry_after
        self.request_id = request_id
        self.rate_limits = rate_limits  # what the error reply's headers said of the limits
        # What the provider billed for this call although no answer came of it (a batch line whose
        # result could not be matched): its usage, counted as spent. None: nothing billed.
        self.billed: ChatResult | None = None

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE

    def __str__(self) -> str:
        status = f" {self.status}" if self.status else ""
        return f"{self.kind}{status}: {self.message}".replace("\n", " ")

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "message": self.message, "status": self.status,
                "retry_after": self.retry_after, "request_id": self.request_id}


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """Where and how to reach one provider account/server (from the config)."""

    name: str
    kind: str                        # a provider kind's name (providers/kinds.py)
    base_url: str | None = None
    key_env: str | None = None       # environment variable holding the API key
    max_concurrency: int = 16
    rpm: float | None = None         # requests per minute
    input_tpm: float | None = None   # input tokens per minute
    output_tpm: float | None = None  # output tokens per minute
    tpm: float | None = None         # tokens per minute, prompt + max_tokens counted at the start (OpenAI's TPM)
    timeout: float = 600.0           # per attempt, seconds
    total_timeout: float | None = None  # per request over all attempts
    max_attempts: int = 6
    max_retry_after: float = 60.0    # a server's longer retry-after is capped to this (and reported)
    free: bool = False               # the config says calls here cost nothing (a server of one's own)
    # The kind's options, checked against its schema when the config loads
    # (read them typed with providers.kinds.opt_bool, opt_float, ...).
    options: Mapping[str, object] = field(default_factory=dict)


class Provider(abc.ABC):
    """One endpoint's wire protocol. Subclasses live one per module."""

    kind: str = ""
    # True when the provider reuses the previous prompt's prefix (llama.cpp):
    # the scheduler then runs one request at a time and orders requests so that
    # those sharing a prefix run consecutively.
    prefers_prefix_order: bool = False
    # True when the provider bounds every call by the `timeout` it is given
    # (the HTTP providers: their client's total timeout covers waiting for a
    # connection, sending and reading), so the engine need not wrap the call
    # in a timer of its own.
    enforces_timeout: bool = False

    def __init__(self, spec: EndpointSpec, api_key: str | None = None):
        self.spec = spec
        self._api_key = api_key  # never logged, never cached

    # True when the provider's server caches prompt prefixes across calls (the
    # HTTP APIs; endpoint option `prompt_cache = false` turns it off): the engine
    # then marks shared prefixes (PREFIX_END) and sends one call per prefix
    # before the others that share it (engine/warmup.py).
    caches_prompt_prefix: bool = False

    # True when `chat(..., stream=True)` streams the reply (server-sent events)
    # and returns its `timings`; others ignore `stream` and return none.
    can_stream: bool = False
    # False when the provider does not count prompt-cache reads against its
    # input-token rate limit (Anthropic): the engine then charges a call whose
    # prefix is warm, and settles every call, without those tokens.
    cache_reads_count_toward_limits: bool = True
    # True when `chat()` hands the call to a queue of the provider's own (a
    # batch API, engine/batching.py) that answers on its own schedule, maybe
    # hours later, at the batch price: the engine starts such calls at once,
    # not paced by the endpoint's limits or concurrency, and does not count
    # them against how far ahead it pulls requests.
    holds_calls: bool = False

    @abc.abstractmethod
    async def chat(self, model: str, messages: Sequence[Mapping[str, str]], *,
                   params: Mapping[str, object], timeout: float, stream: bool = False) -> ChatResult:
        """One chat call. `params` holds temperature, max_tokens, seed, stop and
        any extra wire parameters, already merged with the alias defaults; keys
        whose value is None are absent. `stream`: receive the reply as it is
        generated (when `can_stream`); the result is the same, plus `timings`."""

    async def embed(self, model: str, texts: Sequence[str], *,
                    timeout: float) -> EmbedResult:
        raise ProviderError(BAD_REQUEST, f"{self.kind} endpoints do not serve embeddings")

    async def aclose(self) -> None:  # noqa: B027 -- optional: most providers hold nothing to release
        """Release connections / model memory."""

    def count_tokens(self, text: str) -> int:
        """Cheap estimate used to reserve input tokens before a call."""
        return len(text) // 4 + 1


def holds_long_string(value: object, min_chars: int) -> bool:
    """Whether `value` (JSON-like) holds a string longer than `min_chars`:
    a walk that allocates nothing (1.2 us for a chat body, against 2.5 for
    `with_long_strings_copied`, which a body without one does not need)."""
    items: Iterable[object]
    if type(value) is str:
        return len(value) > min_chars
    if type(value) is dict:
        items = value.values()
    elif type(value) is list or type(value) is tuple:
        items = value
    else:
        return False
    for item in items:
        if type(item) is str:
            if len(item) > min_chars:
                return True
        elif holds_long_string(item, min_chars):
            return True
    return False


def with_long_strings_copied(value: object, min_chars: int) -> object:
    """`value` with each string longer than `min_chars` replaced by an equal
    new string (the containers on their way copied, the rest shared).

    For serialising a JSON body that holds a book: orjson reads a non-ASCII
    str through PyUnicode_AsUTF8AndSize, which caches a UTF-8 copy inside the
    string for its life -- a second copy of the book in every prompt still
    held (pulled ahead, in flight, waiting for the cache's writer). Serialising
    a throw-away copy leaves the prompt as it was (a memcpy, next to nothing
    beside the encoding). Used by cache.keys and providers.http_client."""
    if type(value) is str:
        if len(value) <= min_chars:
            return value
        half = len(value) // 2
        return value[:half] + value[half:]  # a new object: slicing or joining whole would give back `value`
    if type(value) is dict:
        return {k: with_long_strings_copied(v, min_chars) for k, v in value.items()}
    if type(value) is list or type(value) is tuple:
        return [with_long_strings_copied(v, min_chars) for v in value]  # (a tuple serialises as a list does)
    return value
