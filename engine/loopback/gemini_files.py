"""The loopback's Gemini Files API upload (`POST /upload/v1beta/files`): the
resumable protocol Google documents and the google-genai SDK speaks, and the
multipart form Google's upload endpoints also take.

The resumable protocol (checked 2026-11-28: ai.google.dev/api/files
"media.upload"; the Batch API guide's REST example, ai.google.dev/gemini-api/
docs/batch-mode "Input file"; google-genai 3.6.1 `_extra_utils.
prepare_resumable_upload` and `_api_client._upload_fd`):
1. start: `X-Goog-Upload-Protocol: resumable`, `X-Goog-Upload-Command: start`,
   `X-Goog-Upload-Header-Content-Length: N`, `X-Goog-Upload-Header-Content-Type`,
   a JSON body `{"file": {...}}`; the reply has no body of note and carries the
   session's URL in `X-Goog-Upload-URL` (and `X-Goog-Upload-Status: active`);
2. the bytes, POSTed to that URL in one or more chunks, each with
   `X-Goog-Upload-Command: upload` and `X-Goog-Upload-Offset` (the bytes sent
   so far), the last one `upload, finalize`; the final reply is `{"file": File}`
   with `X-Goog-Upload-Status: final`, the others `active`.

Refused as the API refuses (400 INVALID_ARGUMENT): an upload in no protocol; a
chunk for a session that was never started (or is already finalized); an offset
that is not the bytes received so far; a finalized upload whose size is not the
declared length; a start without a length; a MIME type the Files API does not
take ("Unsupported MIME type: jsonl" is the API's own wording, reported for the
Batch guide's own `jsonl` label: python-genai#1547, cookbook#1008, where it is
intermittent: `refused_mime_types` stages it).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import orjson
from aiohttp import web

# The labels the upload takes: the documented document, image, audio and video types (ai.google.dev/
# gemini-api/docs/document-processing: text/plain, text/csv, text/html, text/md, text/xml, ...,
# application/pdf), application/json, and the JSONL labels the Batch guide and reports use (checked 2026-11-28).
_JSONL_TYPES = {"jsonl", "application/jsonl", "application/x-ndjson", "application/json-lines"}
_MEDIA_PREFIXES = ("text/", "image/", "audio/", "video/")
_APPLICATION_TYPES = {"application/pdf", "application/json", "application/x-javascript", "application/x-python"}


class UploadRefused(Exception):
    """An upload step the API refuses: the status and Google's message."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code, self.message = code, message


@dataclass
class _Session:
    """A resumable upload started and not yet finalized."""

    meta: dict[str, object]
    declared: int
    received: bytearray = field(default_factory=bytearray)


def _bad(message: str) -> UploadRefused:
    return UploadRefused(400, message)


class GeminiUploads:
    """The upload sessions of one loopback server; a finished upload is stored through `store`."""

    def __init__(self, store: Callable[[Mapping[str, object], bytes], dict[str, object]]):
        self._store = store
        self._sessions: dict[str, _Session] = {}
        self._ids = itertools.count(1)
        self.refused_mime_types: set[str] = set()  # staged refusals of a type the API usually takes
        self.protocols: list[str] = []             # the protocol of every upload step, in order

    def accepts(self, mime_type: str) -> bool:
        base = mime_type.split(";", 1)[0].strip().lower()
        if base in self.refused_mime_types:
            return False
        return base in _JSONL_TYPES or base in _APPLICATION_TYPES or base.startswith(_MEDIA_PREFIXES)

    async def upload(self, request: web.Request) -> web.Response:
        """One step of an upload (start, chunk, finalize, or a whole multipart upload)."""
        if "upload_id" in request.query:
            self.protocols.append("resumable-chunk")
            return await self._chunk(request)
        protocol = request.headers.get("X-Goog-Upload-Protocol", "")
        if protocol == "resumable":
            self.protocols.append("resumable-start")
            return await self._start(request)
        if request.query.get("uploadType") == "multipart" or protocol == "multipart":
            self.protocols.append("multipart")
            return await self._multipart(request)
        raise _bad("Upload requests must use the resumable or multipart upload protocol.")

    async def _start(self, request: web.Request) -> web.Response:
        if request.headers.get("X-Goog-Upload-Command", "") != "start":
            raise _bad("A resumable upload begins with X-Goog-Upload-Command: start.")
        length = request.headers.get("X-Goog-Upload-Header-Content-Length", "")
        if not length.isdigit():
            raise _bad("X-Goog-Upload-Header-Content-Length is required to start a resumable upload.")
        meta = _file_meta(await request.read())
        mime_type = request.headers.get("X-Goog-Upload-Header-Content-Type") or str(meta.get("mimeType") or "")
        if not self.accepts(mime_type):
            raise _bad(f"Unsupported MIME type: {mime_type}")
        meta["mimeType"] = mime_type
        upload_id = f"u{next(self._ids)}"
        self._sessions[upload_id] = _Session(meta, int(length))
        url = f"{request.url.with_query({'upload_id': upload_id})}"
        return web.Response(headers={"X-Goog-Upload-URL": url, "X-Goog-Upload-Status": "active"})

    async def _chunk(self, request: web.Request) -> web.Response:
        session = self._sessions.get(request.query["upload_id"])
        if session is None:
            raise UploadRefused(404, "No upload session with this id: it was never started or is finalized.")
        commands = {c.strip() for c in request.headers.get("X-Goog-Upload-Command", "").split(",")}
        if not commands & {"upload", "finalize"} or commands - {"upload", "finalize"}:
            raise _bad("A resumable upload's chunk is X-Goog-Upload-Command: upload[, finalize].")
        offset = request.headers.get("X-Goog-Upload-Offset", "")
        if offset != str(len(session.received)):
            raise _bad(f"X-Goog-Upload-Offset {offset or '(none)'} is not the {len(session.received)} bytes "
                       f"received so far.")
        data = await request.read() if "upload" in commands else b""
        total = len(session.received) + len(data)
        if total > session.declared or ("finalize" in commands and total != session.declared):
            raise _bad(f"The upload would hold {total} bytes; X-Goog-Upload-Header-Content-Length declared "
                       f"{session.declared}.")
        session.received += data
        if "finalize" not in commands:
            return web.Response(headers={"X-Goog-Upload-Status": "active"})
        del self._sessions[request.query["upload_id"]]
        stored = self._store(session.meta, bytes(session.received))
        return web.Response(body=orjson.dumps({"file": stored}), content_type="application/json",
                            headers={"X-Goog-Upload-Status": "final"})

    async def _multipart(self, request: web.Request) -> web.Response:
        content_type = request.headers.get("Content-Type", "")
        if not content_type.startswith("multipart/related; boundary="):
            raise _bad("A multipart upload must be multipart/related.")
        boundary = content_type.split("boundary=", 1)[1].encode()
        sections = [s for s in (await request.read()).split(b"--" + boundary) if s.strip() not in (b"", b"--")]
        if len(sections) != 2:
            raise _bad("A multipart upload holds the metadata and the media.")
        meta, media = (s.split(b"\r\n\r\n", 1)[1].removesuffix(b"\r\n") for s in sections)
        file_meta = _file_meta(meta)
        mime_type = file_meta.get("mimeType")
        if isinstance(mime_type, str) and not self.accepts(mime_type):
            raise _bad(f"Unsupported MIME type: {mime_type}")
        stored = self._store(file_meta, media)
        return web.Response(body=orjson.dumps({"file": stored}), content_type="application/json")


def _file_meta(raw: bytes) -> dict[str, object]:
    """The `file` object of an upload's metadata (empty when there is none)."""
    try:
        body = orjson.loads(raw or b"{}")
    except orjson.JSONDecodeError:
        raise _bad("Invalid JSON payload received.") from None
    found = body.get("file") if isinstance(body, dict) else None
    # Proto JSON takes either spelling of a field: the SDK's async client sends snake_case
    # ("display_name", "mime_type", "size_bytes"), the REST examples camelCase.
    return {_camel(k): v for k, v in found.items()} if isinstance(found, dict) else {}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)
