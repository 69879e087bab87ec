"""The OpenAI Batch API (kind "openai"): upload a JSONL file (multipart,
purpose "batch"), create the batch, poll it, read its output and error files,
cancel, list.

A line's body is the direct call's body (`OpenAIProvider.body`), and an
output line's `response.body` is normalised by `OpenAIProvider.chat_result`,
so a batch answer equals a direct one. One model per file; at most 50,000
requests and 200 MB per file. States: validating -> failed | in_progress ->
finalizing -> completed | expired; cancelling -> cancelled. A batch in which
every line failed ends `completed` with no output file (only the error file).
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from urllib.parse import quote

import orjson

from providers.base import BAD_REPLY, EndpointSpec, ProviderError
from providers.batch_api import (
    JSONL_ACCEPT,
    MAX_LIST_PAGES,
    BatchApi,
    BatchInfo,
    LineResult,
    cancelled_error,
    expired_error,
    next_cursor,
    page_items,
)
from providers.http_errors import bad_reply, status_error
from providers.openai_http import OpenAIProvider

log = logging.getLogger(__name__)

_ENDED = {"completed", "failed", "expired", "cancelled"}
_CHAT = "/v1/chat/completions"
CONTROL_TIMEOUT = 600.0  # seconds per control-plane call (an upload may be 200 MB)


class OpenAIBatchApi(BatchApi):
    kind = "openai"
    max_requests = 50_000
    max_bytes = 200 * 1024 * 1024
    one_model_per_batch = True

    def __init__(self, spec: EndpointSpec, api_key: str | None):
        super().__init__(spec, api_key)
        self._provider = OpenAIProvider(spec, api_key)
        self._secret = api_key
        self._http = self._provider.http

    def line(self, custom_id: str, model: str, messages: Sequence[Mapping[str, object]],
             params: Mapping[str, object]) -> bytes:
        body = self._provider.chat_body(model, messages, params)  # as a direct call sends it
        return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": _CHAT, "body": body})

    async def submit(self, lines: Sequence[bytes]) -> BatchInfo:
        return await self.create(await self.prepare(lines), lines)

    async def prepare(self, lines: Sequence[bytes]) -> str:
        """Upload the input file (free); its id is the handle."""
        boundary = f"tulving-{uuid.uuid4().hex}"
        head = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="batch.jsonl"\r\n'
                f"Content-Type: application/jsonl\r\n\r\n").encode()
        parts = [head]
        for line in lines:  # one join: a 200 MB file is copied once
            parts += (line, b"\n")
        parts.append(f"\r\n--{boundary}--\r\n".encode())
        form = b"".join(parts)
        uploaded = await self._http.request_json("POST", self._provider.url("/files"), body=form,
                                                 content_type=f"multipart/form-data; boundary={boundary}",
                                                 timeout=CONTROL_TIMEOUT)
        file_id = uploaded.get("id")
        if not isinstance(file_id, str):
            raise bad_reply(self.spec.name, "file upload reply has no id", secret=self._secret)
        return file_id

    async def create(self, handle: str | None, lines: Sequence[bytes]) -> BatchInfo:
        file_id = handle if handle is not None else await self.prepare(lines)
        created = await self._http.request_json(
            "POST", self._provider.url("/batches"), timeout=CONTROL_TIMEOUT,
            body=orjson.dumps({"input_file_id": file_id, "endpoint": _CHAT, "completion_window": "24h",
                               "metadata": {"client": "tulving"}}))
        return self._info(created)

    async def find(self, handle: str) -> BatchInfo | None:
        """The batch whose input file is `handle`: the account's batches,
        newest first, page after page (`after` the last id while `has_more`),
        until one older than the file (a batch is made after its input file
        was uploaded: both times are the server's) or the list's end."""
        uploaded = await self._created_at(handle)
        after: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await self._batches_page(100, after)
            items = page_items(page)
            for item in items:
                if item.get("input_file_id") == handle:
                    return self._info(item)
            oldest = items[-1].get("created_at") if items else None
            if uploaded is not None and isinstance(oldest, int | float) and oldest < uploaded:
                return None
            after = next_cursor(page, items)
            if after is None:
                return None
        return None

    async def _created_at(self, file_id: str) -> float | None:
        """When the file was uploaded (server time), None when it is gone."""
        try:
            data = await self._http.request_json("GET", self._provider.url(f"/files/{file_id}"),
                                                 timeout=CONTROL_TIMEOUT)
        except ProviderError as exc:
            if exc.status == 404:
                return None
            raise
        created = data.get("created_at")
        return float(created) if isinstance(created, int | float) else None

    async def _batches_page(self, limit: int, after: str | None) -> dict[str, object]:
        query = f"/batches?limit={int(limit)}" + (f"&after={quote(after)}" if after else "")
        return await self._http.request_json("GET", self._provider.url(query), timeout=CONTROL_TIMEOUT)

    async def poll(self, batch_id: str) -> BatchInfo:
        return self._info(await self._http.request_json("GET", self._provider.url(f"/batches/{batch_id}"),
                                                        timeout=CONTROL_TIMEOUT))

    async def cancel(self, batch_id: str) -> BatchInfo:
        return self._info(await self._http.request_json("POST", self._provider.url(f"/batches/{batch_id}/cancel"),
                                                        timeout=CONTROL_TIMEOUT))

    async def list_batches(self, limit: int = 100) -> list[BatchInfo]:
        found: list[BatchInfo] = []
        after: str | None = None
        while len(found) < limit:  # pages of at most 100
            page = await self._batches_page(min(100, limit - len(found)), after)
            items = page_items(page)
            found += [self._info(item) for item in items]
            after = next_cursor(page, items)
            if after is None:
                break
        return found[:limit]

    def _info(self, data: dict[str, object]) -> BatchInfo:
        batch_id, status = data.get("id"), data.get("status")
        if not isinstance(batch_id, str) or not isinstance(status, str):
            raise bad_reply(self.spec.name, "batch object has no id or status", secret=self._secret)
        counts = data.get("request_counts")
        counts = counts if isinstance(counts, dict) else {}
        failure = None
        if status == "failed":
            found = data.get("errors")
            errors = found.get("data") if isinstance(found, dict) else None
            parts = [f"line {e.get('line')}: {e.get('code')}: {e.get('message')}" for e in (errors or [])
                     if isinstance(e, dict)]
            failure = "; ".join(parts[:5]) or "the batch failed"
        created = data.get("created_at")
        return BatchInfo(id=batch_id, status=status, ended=status in _ENDED,
                         counts={k: v for k, v in (counts or {}).items() if type(v) is int},
                         created_at=float(created) if isinstance(created, int | float) else None, failure=failure,
                         handles={"output_file_id": data.get("output_file_id"),
                                  "error_file_id": data.get("error_file_id")})

    async def _file_lines(self, file_id: object) -> list[dict[str, object]]:
        if not isinstance(file_id, str) or not file_id:  # no such file: null, or "" as OpenAI also answers
            return []
        raw, _ = await self._http.request_bytes("GET", self._provider.url(f"/files/{file_id}/content"),
                                                timeout=CONTROL_TIMEOUT, accept=JSONL_ACCEPT)
        lines = []
        for text in raw.splitlines():
            if not text.strip():
                continue
            try:
                item = orjson.loads(text)
            except orjson.JSONDecodeError:
                raise bad_reply(self.spec.name, f"batch result file {file_id} holds a line that is not JSON",
                                secret=self._secret) from None
            if isinstance(item, dict):
                lines.append(item)
        return lines

    async def results(self, info: BatchInfo) -> dict[str, LineResult]:
        out: dict[str, LineResult] = {}
        # The output file holds the paid answers: if it cannot be read, the
        # harvest fails (and retries, or finds the batch gone). The error file
        # only holds failed lines: one that cannot be read must not throw the
        # answers away; its lines then count as missing and are sent again.
        lines = await self._file_lines(info.handles.get("output_file_id"))
        try:
            lines += await self._file_lines(info.handles.get("error_file_id"))
        except ProviderError as exc:
            log.warning("%s: batch %s: its error file cannot be read (%s); its failed lines are sent again",
                        self.spec.name, info.id, exc)
        for item in lines:
            custom_id = item.get("custom_id")
            if isinstance(custom_id, str):
                out[custom_id] = self._line_result(info, item)
        return out

    def _line_result(self, info: BatchInfo, item: dict[str, object]) -> LineResult:
        response, error = item.get("response"), item.get("error")
        name = self.spec.name
        if isinstance(response, dict):
            status, body = response.get("status_code"), response.get("body")
            request_id = response.get("request_id") if isinstance(response.get("request_id"), str) else None
            if status == 200 and isinstance(body, dict):
                try:
                    return self._provider.chat_result(body, request_id)
                except ProviderError as exc:
                    return exc
            if isinstance(status, int) and status >= 400:
                return status_error(status, orjson.dumps(body), {}, endpoint=name, secret=self._secret,
                                    request_id=request_id)
        if isinstance(error, dict):
            code = str(error.get("code") or "")
            if code == "batch_expired":
                return expired_error(name, info.id)
            if code == "batch_cancelled":
                return cancelled_error(name, info.id)
            return ProviderError(BAD_REPLY, f"{name}: batch {info.id} line failed: {code}: {error.get('message')}")
        return bad_reply(name, f"batch {info.id} result line has neither a response nor an error",
                         secret=self._secret)

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._provider.aclose()
