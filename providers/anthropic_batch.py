"""Anthropic Message Batches (kind "anthropic"): create with `requests`
(custom_id + the direct call's params), poll, read the results JSONL at the
absolute `results_url`, cancel, list.

A request's params are the direct call's body (`messages_body`), and a
succeeded result's `message` is normalised by `AnthropicProvider.chat_result`,
so a batch answer equals a direct one. Up to 100,000 requests or 256 MB per
batch; models may mix. processing_status in_progress | canceling | ended;
results `succeeded` | `errored` | `canceled` | `expired`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import quote

import orjson

from providers.anthropic_http import AnthropicProvider
from providers.base import BAD_REQUEST, EndpointSpec, ProviderError
from providers.batch_api import (
    JSONL_ACCEPT,
    BatchApi,
    BatchInfo,
    LineResult,
    cancelled_error,
    expired_error,
    next_cursor,
    page_items,
    unix_time,
)
from providers.http_errors import STATUS_OF_ERROR_TYPE, bad_reply, redact, status_error

CONTROL_TIMEOUT = 600.0
BATCH_CACHE_TTL = "1h"


class AnthropicBatchApi(BatchApi):
    kind = "anthropic"
    max_requests = 100_000
    max_bytes = 256 * 1024 * 1024
    one_model_per_batch = False

    def __init__(self, spec: EndpointSpec, api_key: str | None):
        super().__init__(spec, api_key)
        self._provider = AnthropicProvider(spec, api_key)
        self._secret = api_key
        self._http = self._provider.http
        self._url = self._provider.url("/v1/messages/batches")

    def line(self, custom_id: str, model: str, messages: Sequence[Mapping[str, object]],
             params: Mapping[str, object]) -> bytes:
        # A batch outlives the 5-minute cache (most lines would miss and write
        # it again): its shared prefix is cached for an hour, as Anthropic's
        # prompt-caching page advises for batches (checked 2026-11-26); the
        # 1-hour write costs 2x the input price (price_cache_write_1h).
        params = self._provider.chat_body(model, messages, params, cache_ttl=BATCH_CACHE_TTL)
        return orjson.dumps({"custom_id": custom_id, "params": params})

    async def submit(self, lines: Sequence[bytes]) -> BatchInfo:
        body = b'{"requests":[' + b",".join(lines) + b"]}"
        return self._info(await self._http.request_json("POST", self._url, body=body, timeout=CONTROL_TIMEOUT))

    async def poll(self, batch_id: str) -> BatchInfo:
        return self._info(await self._http.request_json("GET", f"{self._url}/{batch_id}", timeout=CONTROL_TIMEOUT))

    async def cancel(self, batch_id: str) -> BatchInfo:
        return self._info(await self._http.request_json("POST", f"{self._url}/{batch_id}/cancel",
                                                        timeout=CONTROL_TIMEOUT))

    async def list_batches(self, limit: int = 100) -> list[BatchInfo]:
        found: list[BatchInfo] = []
        after: str | None = None
        while len(found) < limit:  # pages of at most 1,000, `after_id` the last one's id while `has_more`
            query = f"?limit={min(1000, limit - len(found))}" + (f"&after_id={quote(after)}" if after else "")
            page = await self._http.request_json("GET", self._url + query, timeout=CONTROL_TIMEOUT)
            items = page_items(page)
            found += [self._info(item) for item in items]
            after = next_cursor(page, items)
            if after is None:
                break
        return found[:limit]

    def _info(self, data: dict[str, object]) -> BatchInfo:
        batch_id, status = data.get("id"), data.get("processing_status")
        if not isinstance(batch_id, str) or not isinstance(status, str):
            raise bad_reply(self.spec.name, "message batch object has no id or processing_status",
                            secret=self._secret)
        counts = data.get("request_counts")
        counts = counts if isinstance(counts, dict) else {}
        return BatchInfo(id=batch_id, status=status, ended=status == "ended",
                         counts={k: v for k, v in (counts or {}).items() if type(v) is int},
                         created_at=unix_time(data.get("created_at")), handles={"results_url": data.get("results_url")})

    async def results(self, info: BatchInfo) -> dict[str, LineResult]:
        url = info.handles.get("results_url")
        if not isinstance(url, str) or not url:
            return {}
        raw, _ = await self._http.request_bytes("GET", url, timeout=CONTROL_TIMEOUT, accept=JSONL_ACCEPT)
        out: dict[str, LineResult] = {}
        for text in raw.splitlines():
            if not text.strip():
                continue
            try:
                item = orjson.loads(text)
            except orjson.JSONDecodeError:
                raise bad_reply(self.spec.name, f"batch {info.id} results hold a line that is not JSON",
                                secret=self._secret) from None
            if isinstance(item, dict) and isinstance(item.get("custom_id"), str):
                out[item["custom_id"]] = self._result(info, item.get("result"))
        return out

    def _result(self, info: BatchInfo, result: object) -> LineResult:
        name = self.spec.name
        kind = result.get("type") if isinstance(result, dict) else None
        if kind == "succeeded" and isinstance(result, dict) and isinstance(result.get("message"), dict):
            message = result["message"]
            try:
                return self._provider.chat_result(message, message.get("id") if isinstance(message.get("id"), str)
                                                  else None)
            except ProviderError as exc:
                return exc
        if kind == "errored" and isinstance(result, dict):
            error = result.get("error")
            inner = error.get("error") if isinstance(error, dict) else None
            etype = str(inner.get("type") if isinstance(inner, dict) else "")
            # The HTTP status the error type stands for, to classify it like a
            # direct reply: only the server's passing troubles (rate_limit_error,
            # api_error, timeout_error, overloaded_error) go into a new batch;
            # billing_error, authentication_error, permission_error (and the
            # request's own errors) are final: a new batch would fail, or be
            # billed, the same way. Error types as Anthropic's errors page and the
            # anthropic SDK's ErrorObject list them (checked 2026-11-26).
            status = STATUS_OF_ERROR_TYPE.get(etype)
            if status is None:  # a type unknown today: never resubmitted blindly
                said = inner.get("message") if isinstance(inner, dict) else None
                return ProviderError(BAD_REQUEST, redact(f"{name}: batch {info.id} line failed with an error of "
                                                         f"unknown type {etype!r} ({said}): not sent again",
                                                         self._secret))
            return status_error(status, orjson.dumps(error), {}, endpoint=name, secret=self._secret)
        if kind == "expired":
            return expired_error(name, info.id)
        if kind == "canceled":
            return cancelled_error(name, info.id)
        return bad_reply(name, f"batch {info.id} result of unknown type {kind!r}", secret=self._secret)

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._provider.aclose()
