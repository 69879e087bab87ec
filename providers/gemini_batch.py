"""Gemini Batch Mode (kind "gemini"): `models/{model}:batchGenerateContent`
at half the price, polled as `batches/{id}`, cancelled, listed.

Shapes (checked 2026-11-26 in ai.google.dev/api/batch-api and the types of
google-genai's batches module, which reads the same JSON):
- create: `{"batch": {"displayName", "inputConfig": {"requests": {"requests":
  [{"request": GenerateContentRequest, "metadata": {"key"}}]}}}}` (inlined,
  for batches up to 20 MB) or `{"inputConfig": {"fileName": "files/..."}}`
  for a JSONL file of `{"key", "request"}` lines uploaded first (the free
  step, `prepare`: the resumable upload to `upload/v1beta/files`, below);
- the reply, and every poll, is an Operation: `name` "batches/...",
  `metadata` the GenerateContentBatch (state BATCH_STATE_PENDING | RUNNING |
  SUCCEEDED | FAILED | CANCELLED | EXPIRED, batchStats with int64 counts as
  strings, output), `done`, `response` (the output), `error`;
- output: `inlinedResponses.inlinedResponses` [{"response" | "error",
  "metadata": {"key"}}], or a `responsesFile` of JSONL lines {"key",
  "response" | "error"} read at `download/v1beta/{file}:download?alt=media`.
Every path here is under v1beta, the version Google documents them under
(BATCH_API_VERSION), whatever `api_version` the endpoint's direct calls use.
A line's request is the direct call's body (`GeminiProvider.chat_body`) and a
response is normalised by `GeminiProvider.chat_result`, so a batch answer
equals a direct one. A result line that cannot be read is skipped (it counts
as missing and is sent again): the batch's other answers are kept.
"""
from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence

import orjson

from providers.base import EndpointSpec, ProviderError
from providers.batch_api import UNKEYED, BatchApi, BatchInfo, LineResult, unix_time
from providers.gemini_errors import HTTP_OF_STATUS, gemini_status_error
from providers.gemini_http import CONTROL_TIMEOUT, GeminiProvider, model_path
from providers.http_errors import bad_reply

log = logging.getLogger(__name__)

_ENDED = {"BATCH_STATE_SUCCEEDED", "BATCH_STATE_FAILED", "BATCH_STATE_CANCELLED", "BATCH_STATE_EXPIRED",
          "JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"}
INLINE_BYTES = 20 * 1000 * 1000  # inlined requests: up to 20 MB in all (the batch guide)
# Google documents models.batchGenerateContent, batches.* and the file upload and download under
# v1beta only (ai.google.dev/api/batch-api, /api/files: "post https://generativelanguage.googleapis.com/
# v1beta/{batch.model=models/*}:batchGenerateContent"; checked 2026-11-28), while generateContent is
# documented under v1 and v1beta (the google-genai SDK 3.6.1 defaults to v1 for everything; v1 has been
# seen refusing fields v1beta takes: vercel/ai#2256). So every batch and file call goes to v1beta.
BATCH_API_VERSION = "v1beta"
# The input file goes up by the resumable protocol (start, then the bytes with "upload, finalize"), as
# Google's Batch guide (REST example), ai.google.dev/api/files (media.upload) and google-genai 3.6.1
# (files.upload: _extra_utils.prepare_resumable_upload, _api_client._upload_fd) do; checked 2026-11-28.
# Its label: "jsonl", as the Batch guide's Python, JavaScript and Java examples set it (the SDK sends the
# caller's mime_type as X-Goog-Upload-Header-Content-Type); text/plain (document-processing guide's TXT
# type) when the API refuses that label, as it has been reported to do (python-genai#1547, cookbook#1008).
UPLOAD_MIME_TYPES = ("jsonl", "text/plain")
_COUNTS = {"requestCount": "total", "successfulRequestCount": "completed", "failedRequestCount": "failed",
           "pendingRequestCount": "pending"}


def _counts(stats: object) -> dict[str, int]:
    """batchStats as counts (int64 fields come as JSON strings)."""
    out: dict[str, int] = {}
    for key, name in _COUNTS.items():
        value = stats.get(key) if isinstance(stats, dict) else None
        if isinstance(value, int | str) and str(value).isdigit():
            out[name] = int(value)
    return out


class GeminiBatchApi(BatchApi):
    kind = "gemini"
    max_requests = 100_000          # no documented count limit; the input file may hold 2 GB
    max_bytes = 2 * 1000 * 1000 * 1000
    one_model_per_batch = True      # the model is in the URL
    inline_bytes = INLINE_BYTES     # bigger batches go as an uploaded file

    def __init__(self, spec: EndpointSpec, api_key: str | None):
        super().__init__(spec, api_key)
        self._provider = GeminiProvider(spec, api_key)
        self._secret = api_key
        self._http = self._provider.http

    def _batch_url(self, path: str, query: str = "") -> str:
        """`{base_url}/v1beta/{path}`: Batch Mode is documented under v1beta only, whatever version
        the endpoint's generateContent calls use (BATCH_API_VERSION)."""
        url = self._provider.url(f"/{BATCH_API_VERSION}/{path}")
        return f"{url}{'&' if '?' in url else '?'}{query}" if query else url

    def line(self, custom_id: str, model: str, messages: Sequence[Mapping[str, object]],
             params: Mapping[str, object]) -> bytes:
        # "model" travels with the line to `create` (which puts it in the URL) and is not sent in it.
        return orjson.dumps({"key": custom_id, "model": model, "request": self._provider.chat_body(messages, params)})

    async def prepare(self, lines: Sequence[bytes]) -> str | None:
        """Upload the JSONL input file when the batch is too big to inline; its name is the handle."""
        if sum(len(line) for line in lines) <= self.inline_bytes:
            return None
        data = b"".join(orjson.dumps({"key": item["key"], "request": item["request"]}) + b"\n"
                        for item in self._items(lines))
        session = await self._start_upload(len(data))
        raw, headers = await self._http.request_bytes(
            "POST", session, body=data, content_type="application/octet-stream", timeout=CONTROL_TIMEOUT,
            headers={"X-Goog-Upload-Command": "upload, finalize", "X-Goog-Upload-Offset": "0"})
        try:
            reply = orjson.loads(raw)
        except orjson.JSONDecodeError:
            reply = None
        found = reply.get("file") if isinstance(reply, dict) else None
        name = found.get("name") if isinstance(found, dict) else None
        if headers.get("X-Goog-Upload-Status") != "final" or not isinstance(name, str) or not name:
            raise bad_reply(self.spec.name, "file upload was not finalized or its reply has no file name",
                            secret=self._secret)
        return name

    async def _start_upload(self, size: int) -> str:
        """Start a resumable upload of `size` bytes; the session's URL (X-Goog-Upload-URL). The Batch
        guide's `jsonl` label first; if the API answers "Unsupported MIME type" (reported, intermittently:
        python-genai#1547, cookbook#1008), once more as text/plain, a type the Files API documents (the
        start uploads nothing, so trying again costs nothing)."""
        url = self._provider.url(f"/upload/{BATCH_API_VERSION}/files")
        for mime_type in UPLOAD_MIME_TYPES:
            meta = orjson.dumps({"file": {"displayName": f"tulving-{uuid.uuid4().hex[:12]}",
                                          "mimeType": mime_type, "sizeBytes": str(size)}})
            try:
                _, headers = await self._http.request_bytes("POST", url, body=meta, timeout=CONTROL_TIMEOUT, headers={
                    "X-Goog-Upload-Protocol": "resumable", "X-Goog-Upload-Command": "start",
                    "X-Goog-Upload-Header-Content-Length": str(size),
                    "X-Goog-Upload-Header-Content-Type": mime_type})
            except ProviderError as exc:
                if exc.status == 400 and "Unsupported MIME type" in exc.message and mime_type != UPLOAD_MIME_TYPES[-1]:
                    log.info("%s: the Files API refused the label %r; uploading as %s", self.spec.name, mime_type,
                             UPLOAD_MIME_TYPES[-1])
                    continue
                raise
            session = headers.get("X-Goog-Upload-URL")
            if session:
                return session
            raise bad_reply(self.spec.name, "file upload start reply has no X-Goog-Upload-URL", secret=self._secret)
        raise AssertionError("unreachable: the last label raises or returns")

    def _items(self, lines: Sequence[bytes]) -> list[dict[str, object]]:
        return [orjson.loads(line) for line in lines]

    async def submit(self, lines: Sequence[bytes]) -> BatchInfo:
        return await self.create(await self.prepare(lines), lines)

    async def create(self, handle: str | None, lines: Sequence[bytes]) -> BatchInfo:
        items = self._items(lines)
        model = str(items[0]["model"])
        if handle is not None:
            source: dict[str, object] = {"fileName": handle}
        else:
            source = {"requests": {"requests": [{"request": item["request"], "metadata": {"key": item["key"]}}
                                                for item in items]}}
        body = {"batch": {"displayName": f"tulving-{uuid.uuid4().hex[:12]}", "inputConfig": source}}
        url = self._batch_url(f"{model_path(model)}:batchGenerateContent")
        return self._info(await self._http.request_json("POST", url, body=orjson.dumps(body),
                                                        timeout=CONTROL_TIMEOUT))

    async def find(self, handle: str) -> BatchInfo | None:
        """The batch made from the uploaded file `handle`, among the account's latest batches."""
        for item in await self._operations(100):
            metadata = item.get("metadata")
            config = metadata.get("inputConfig") if isinstance(metadata, dict) else None
            if isinstance(config, dict) and config.get("fileName") == handle:
                return self._info(item)
        return None

    async def poll(self, batch_id: str) -> BatchInfo:
        return self._info(await self._http.request_json("GET", self._batch_url(batch_id),
                                                        timeout=CONTROL_TIMEOUT))

    async def cancel(self, batch_id: str) -> BatchInfo:
        await self._http.request_json("POST", self._batch_url(f"{batch_id}:cancel"), body=b"{}",
                                      timeout=CONTROL_TIMEOUT)
        return await self.poll(batch_id)

    async def list_batches(self, limit: int = 100) -> list[BatchInfo]:
        return [self._info(item) for item in await self._operations(limit)]

    async def _operations(self, limit: int) -> list[dict[str, object]]:
        data = await self._http.request_json("GET", self._batch_url("batches", f"pageSize={int(limit)}"),
                                             timeout=CONTROL_TIMEOUT)
        items = data.get("operations") or data.get("batches")
        return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []

    def _info(self, data: Mapping[str, object]) -> BatchInfo:
        metadata = data.get("metadata")
        batch = metadata if isinstance(metadata, dict) else data
        name, state = data.get("name") or batch.get("name"), batch.get("state")
        if not isinstance(name, str) or not isinstance(state, str):
            raise bad_reply(self.spec.name, "batch operation has no name or state", secret=self._secret)
        failure = None
        if state.endswith("_FAILED"):
            error = data.get("error")
            failure = str(error.get("message")) if isinstance(error, dict) else "the batch failed"
        output = data.get("response") if isinstance(data.get("response"), dict) else batch.get("output")
        responses_file = output.get("responsesFile") if isinstance(output, dict) else None
        return BatchInfo(id=name, status=state, ended=state in _ENDED, counts=_counts(batch.get("batchStats")),
                         created_at=unix_time(batch.get("createTime")), failure=failure,
                         handles={"responses_file": responses_file})

    async def results(self, info: BatchInfo) -> dict[str, LineResult]:
        responses_file = info.handles.get("responses_file")
        if isinstance(responses_file, str) and responses_file:
            items = await self._file_items(info, responses_file)
        else:
            items = await self._inlined(info)
        out: dict[str, LineResult] = {}
        for position, item in enumerate(items):
            key = item.get("key")
            metadata = item.get("metadata")
            if not isinstance(key, str) and isinstance(metadata, dict):
                key = metadata.get("key")
            # A line without its key (python-genai#2008) is kept under UNKEYED: it was run and billed.
            out[key if isinstance(key, str) and key else f"{UNKEYED}{position}"] = self._line_result(info, item)
        return out

    async def _inlined(self, info: BatchInfo) -> list[dict[str, object]]:
        data = await self._http.request_json("GET", self._batch_url(info.id), timeout=CONTROL_TIMEOUT)
        metadata = data.get("metadata")
        output = data.get("response") if isinstance(data.get("response"), dict) else (
            metadata.get("output") if isinstance(metadata, dict) else None)
        inlined = output.get("inlinedResponses") if isinstance(output, dict) else None
        items = inlined.get("inlinedResponses") if isinstance(inlined, dict) else None
        return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []

    async def _file_items(self, info: BatchInfo, file_name: str) -> list[dict[str, object]]:
        url = self._provider.url(f"/download/{BATCH_API_VERSION}/{file_name}:download?alt=media")
        raw, _ = await self._http.request_bytes("GET", url, timeout=CONTROL_TIMEOUT)
        items, unreadable = [], 0
        for text in raw.splitlines():
            if not text.strip():
                continue
            try:
                item = orjson.loads(text)
            except orjson.JSONDecodeError:
                unreadable += 1
                continue
            if isinstance(item, dict):
                items.append(item)
        if unreadable:  # the readable answers are kept; the unreadable lines count as missing (sent again)
            log.warning("%s: batch %s: %d result lines are not JSON; they are sent again", self.spec.name,
                        info.id, unreadable)
        return items

    def _line_result(self, info: BatchInfo, item: Mapping[str, object]) -> LineResult:
        response, error = item.get("response"), item.get("error")
        if isinstance(response, dict):
            try:
                return self._provider.chat_result(response, None)
            except ProviderError as exc:
                return exc
        if isinstance(error, dict):
            code = error.get("code")
            status = HTTP_OF_STATUS.get(str(error.get("status")), 500)
            if type(code) is int and code >= 400:
                status = code
            return gemini_status_error(status, orjson.dumps({"error": error}), {}, endpoint=self.spec.name,
                                       secret=self._secret)
        return bad_reply(self.spec.name, f"batch {info.id} result line has neither a response nor an error",
                         secret=self._secret)

    async def aclose(self) -> None:
        await self._provider.aclose()
