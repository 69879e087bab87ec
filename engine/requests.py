"""The unit of work: what a caller asks the engine for, and what comes back.

Every benchmark step (chapter writing, answering, judging, embedding) turns its
work into `ChatRequest` / `EmbedRequest` objects; the engine resolves the model
alias, looks up the cache, schedules the call under the endpoint's limits and
yields one `Outcome` per request, tagged with the caller's `tag`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from providers.base import BAD_REPLY, ChatResult, ProviderError, Result

# The cache key of the call an attempt's task is making, set by the dispatcher
# only for a call its provider holds (Provider.holds_calls), which records it
# under that key: a batch line's custom_id and the batch ledger's key.
CALL_KEY: ContextVar[str | None] = ContextVar("tulving_call_key", default=None)

# Output tokens assumed for a chat call sent without a token limit (reasoning
# models, calls that set none): the paper's max_tokens. What the budget and the
# rate limits reserve, and what the cost estimate counts.
UNLIMITED_OUTPUT_TOKENS = 4096

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One chat call. `model` is a model alias from the config (e.g. "gpt-4o",
    "builtin:reader"). Parameters left at None take the alias's defaults.

    `draw` distinguishes independent samples of the same prompt: draw k of a
    request is cached on its own, so a rerun replays every draw exactly.
    `tag` is the caller's id for the request; it is not part of the cache key.
    """

    model: str
    messages: Sequence[Message]
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    stop: Sequence[str] | None = None
    extra: Mapping[str, Any] | None = None  # other wire parameters (top_p, ...)
    draw: int = 0
    tag: Any = None
    # How the call is made, not what it asks: none of these is in the cache key.
    stream: bool = False       # receive the reply as server-sent events (result.timings: TTFT, chunk times)
    cache_read: bool = True    # False: never answered from the cache or by joining an identical call in flight
    cache_write: bool = True   # False: the reply is not stored
    # (message index, characters into its content): where the prompt prefix this
    # request shares with others ends (a book before its question). Providers
    # that cache prompts cache it, and the engine warms it first (engine/warmup.py).
    prefix_end: tuple[int, int] | None = None


def output_tokens_allowed(params: Mapping[str, object]) -> int:
    """The most output tokens a chat call with these (resolved) parameters
    may produce: its max_tokens (or max_completion_tokens), else
    UNLIMITED_OUTPUT_TOKENS. The one reading of the limit: the engine's
    reservations, the cost estimate and the dry run use it."""
    limit = params.get("max_tokens") or params.get("max_completion_tokens")
    return int(limit) if isinstance(limit, (int, float)) and limit > 0 else UNLIMITED_OUTPUT_TOKENS


@dataclass(frozen=True, slots=True)
class RequestSettings:
    """Settings a run gives its answering requests (`tulving run --temperature
    / --max-tokens`): they travel on each request, over the alias's params
    (the cache key, the estimate and the provenance see them as the request's
    own), and the loaded config is left as it is."""

    temperature: float | None = None
    max_tokens: int | None = None

    def apply(self, request: ChatRequest) -> ChatRequest:
        """`request` with these settings where it sets none of its own."""
        temperature = self.temperature if request.temperature is None else request.temperature
        max_tokens = self.max_tokens if request.max_tokens is None else request.max_tokens
        if temperature == request.temperature and max_tokens == request.max_tokens:
            return request
        return replace(request, temperature=temperature, max_tokens=max_tokens)


@dataclass(frozen=True, slots=True)
class EmbedRequest:
    """Embed a batch of texts with an embedding model alias."""

    model: str
    texts: Sequence[str]
    tag: Any = None
    # An embedding is never streamed and always goes through the cache (the
    # engine reads these of any request).
    stream: ClassVar[bool] = False
    cache_read: ClassVar[bool] = True
    cache_write: ClassVar[bool] = True


Request = ChatRequest | EmbedRequest


@dataclass(slots=True)
class Outcome:
    """What the engine yields for each request: a result or a final error."""

    request: Request
    result: Result | None = None
    error: ProviderError | None = None
    cached: bool = False
    joined: bool = False  # answered by an identical call in flight made for another request (cost 0 here)
    attempts: int = 0
    cost: float = 0.0  # USD spent on this call (0 when cached or unpriced)
    endpoint: str | None = None
    key: str | None = None  # cache key
    queued: float | None = None   # seconds from the engine taking the request to its first attempt's send
    sent_at: float | None = None  # time.monotonic() when the last attempt was sent

    @property
    def tag(self) -> Any:
        return self.request.tag

    @property
    def ok(self) -> bool:
        return self.result is not None

    @property
    def text(self) -> str:
        """The chat reply text; raises the stored error if the call failed."""
        if self.result is None:
            raise self.error or ProviderError(BAD_REPLY, "no result")
        if not isinstance(self.result, ChatResult):
            raise AttributeError("an embedding outcome has no text (its vectors are in result.vectors)")
        return self.result.text


def cached_outcome(request: Request, result: Result, key: str) -> Outcome:
    """`Outcome(request=request, result=result, cached=True, key=key)`, built
    positionally: made for every cache hit, where the keywords cost more than
    the call (0.55 -> 0.35 us, benchmarks/results/rerun_read_parts.py).
    tests/test_scheduler.py checks the two are equal."""
    return Outcome(request, result, None, True, False, 0, 0.0, None, key)
