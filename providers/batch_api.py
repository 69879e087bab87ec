"""What the two batch wires share: a batch's state as the engine sees it, and
the interface `providers/openai_batch.py` and `providers/anthropic_batch.py`
implement (formats and states: the OpenAI Batch API and Anthropic Message Batches references).

A batch API takes lines built exactly as the direct call's body (so a batch
answer equals a direct one), keyed by `custom_id` (the engine uses the cache
key: a sha256 hex digest, valid for both APIs), and gives back per line a
normalised `ChatResult` (the provider's own `chat_result`) or a classified
`ProviderError`:

- an HTTP-level failure of a line -> classified by its status like a direct
  reply (500 -> overloaded, retryable; 400 -> bad request, final);
- expired (the 24 h window passed) -> timeout (retryable: the next batch);
- canceled (someone cancelled the batch) -> bad request "cancelled" (final:
  a cancel is a decision, not a fault; a rerun submits it again);
- a line missing from the results of an ended batch -> bad reply (retryable),
  unless the batch says it ran (then it was billed: engine/batch_matching.py);
- a result that names no request -> under an UNKEYED key (engine/batch_matching.py).
"""
from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from providers.base import CANCELLED, TIMEOUT, ChatResult, EndpointSpec, ProviderError

LineResult = ChatResult | ProviderError

# A result line that names no request: `results()` gives it under UNKEYED + its position ("?0",
# "?1", ...), never a custom_id (those are hex digests). The Gemini API is reported to leave the
# key out of inlined responses (googleapis/python-genai#2008, js-genai#1191) and to return them out
# of order (python-genai#1909), so neither the key nor the position can be trusted to be there:
# the engine matches such lines where it can and counts the rest as paid (engine/batch_matching.py).
UNKEYED = "?"

# What a results download asks for: the JSONL types (the Batch API's output
# files, Anthropic's results_url), "application/binary" as both official SDKs
# send for them, then anything: never `application/json`, which a strict
# server answers 406 (the body is not one JSON document).
JSONL_ACCEPT = "application/jsonl, application/x-jsonl, application/binary, application/octet-stream, */*;q=0.1"
MAX_LIST_PAGES = 100  # pages of a batch list looked through at most (10,000 batches of OpenAI's 100-batch pages)


def page_items(page: Mapping[str, object]) -> list[dict[str, object]]:
    """The objects of one page of a list reply (`data`)."""
    items = page.get("data")
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def next_cursor(page: Mapping[str, object], items: Sequence[Mapping[str, object]]) -> str | None:
    """The id the next page starts after (OpenAI's `after`, Anthropic's
    `after_id`): the page's `last_id` when it says `has_more`, else None."""
    if page.get("has_more") is not True or not items:
        return None
    last = page.get("last_id") or items[-1].get("id")
    return last if isinstance(last, str) and last else None


@dataclass(frozen=True, slots=True)
class BatchInfo:
    """One batch as last seen: its id, the provider's status word, whether it
    has ended (results readable, nothing more will change), its request
    counts, and where its results are."""

    id: str
    status: str
    ended: bool
    counts: Mapping[str, int] = field(default_factory=dict)
    created_at: float | None = None          # unix seconds
    failure: str | None = None               # the whole batch failed (validation): why
    handles: Mapping[str, object] = field(default_factory=dict)  # output/error file ids, results_url


def expired_error(endpoint: str, batch_id: str) -> ProviderError:
    return ProviderError(TIMEOUT, f"{endpoint}: batch {batch_id} expired before this request ran (24 h window)")


def cancelled_error(endpoint: str, batch_id: str) -> ProviderError:
    return ProviderError(CANCELLED, f"{endpoint}: batch {batch_id} was cancelled before this request ran")


class BatchApi(abc.ABC):
    """One endpoint's batch API. Limits are the provider's, lowered by the
    endpoint options `batch_max_requests` / `batch_max_bytes` (tests, or an
    account's own queue limits)."""

    kind = ""
    max_requests = 0
    max_bytes = 0
    one_model_per_batch = False

    def __init__(self, spec: EndpointSpec, api_key: str | None):
        self.spec = spec
        # Checked by the config at load (the kind's option schema): whole numbers >= 1, or unset.
        requests, size = spec.options.get("batch_max_requests"), spec.options.get("batch_max_bytes")
        self.max_requests = min(self.max_requests, requests) if isinstance(requests, int) else self.max_requests
        self.max_bytes = min(self.max_bytes, size) if isinstance(size, int) else self.max_bytes

    @abc.abstractmethod
    def line(self, custom_id: str, model: str, messages: Sequence[Mapping[str, object]],
             params: Mapping[str, object]) -> bytes:
        """One request of a batch, serialised (its size counts toward max_bytes)."""

    async def prepare(self, lines: Sequence[bytes]) -> str | None:
        """First step of a submission where the API has one that costs
        nothing (OpenAI: upload the input file): a handle by which `find`
        recognises the batch `create` makes of it. None: no such step."""
        return None

    async def find(self, handle: str) -> BatchInfo | None:
        """The batch created from a prepared `handle`, if any (a run killed
        between asking for the batch and recording its id resumes it)."""
        return None

    async def create(self, handle: str | None, lines: Sequence[bytes]) -> BatchInfo:
        """The batch of the lines (prepared as `handle` when not None)."""
        return await self.submit(lines)

    @abc.abstractmethod
    async def submit(self, lines: Sequence[bytes]) -> BatchInfo:
        """Send the lines as one batch; returns it as created."""

    @abc.abstractmethod
    async def poll(self, batch_id: str) -> BatchInfo:
        """The batch's current state."""

    @abc.abstractmethod
    async def results(self, info: BatchInfo) -> dict[str, LineResult]:
        """Every line the ended batch reports, by custom_id (lines it does not
        report, e.g. of a batch that failed validation, are absent)."""

    @abc.abstractmethod
    async def cancel(self, batch_id: str) -> BatchInfo:
        """Ask the provider to cancel; returns the batch as it is now."""

    @abc.abstractmethod
    async def list_batches(self, limit: int = 100) -> list[BatchInfo]:
        """The account's most recent batches, newest first."""

    async def missing(self) -> str | None:
        """Why the server has no batch API, or None when it has one (or when
        this cannot tell: other errors are the run's to meet). An
        OpenAI-compatible server without one (vLLM, llama.cpp's server)
        answers 404 or 405 on the batch list; a real API lists one batch."""
        try:
            await self.list_batches(limit=1)
        except ProviderError as exc:
            if exc.status in (404, 405):
                return f"its batch list answered {exc.status}"
        return None

    async def aclose(self) -> None:  # noqa: B027 -- optional
        """Release connections."""


def unix_time(value: object) -> float | None:
    """A batch API's RFC 3339 timestamp ("2026-11-26T05:00:00Z") as Unix time;
    None when absent or unreadable (both Anthropic and Gemini date batches so)."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
