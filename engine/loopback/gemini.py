"""The loopback server's Gemini API (base URL `server.gemini_base_url`, versions v1 and v1beta;
Batch Mode and files on v1beta only, as Google documents them: a 404 on v1).

Routes, as the real API names them (checked 2026-11-26 in ai.google.dev/api), under
/v1 and /v1beta alike, below the base URL's path /gemini (apart from the OpenAI routes):
- POST /v1beta/models/{model}:generateContent, :streamGenerateContent?alt=sse,
  :batchGenerateContent; GET /v1beta/models (paged: pageSize, pageToken),
  GET /v1beta/models/{model};
- GET /v1beta/batches, GET /v1beta/batches/{id}, POST /v1beta/batches/{id}:cancel,
  DELETE /v1beta/batches/{id};
- POST /upload/v1beta/files (the resumable protocol Google documents and the
  google-genai SDK uses, or uploadType=multipart: engine/loopback/gemini_files.py,
  which refuses what the API refuses), GET /v1beta/files/{id},
  GET /download/v1beta/files/{id}:download?alt=media.

As strict as the API where Tulving could go wrong: the key (`x-goog-api-key`
or `?key=`) is checked against the server's `api_keys` (none: 403
PERMISSION_DENIED; a wrong one: 400 INVALID_ARGUMENT reason API_KEY_INVALID,
as Google answers); an unknown or retired model is 404 NOT_FOUND; unknown
fields, an empty `contents`, a content without parts, an empty text part, a
role other than user/model, and a `systemInstruction` that is not a Content
are 400 INVALID_ARGUMENT; a prompt over the server's `context_tokens` is 400
"The input token count ... exceeds the maximum". Replies carry usageMetadata
(implicit caching: a prompt extending one seen before by at least
`cache_min_tokens` tokens reports that prefix as cachedContentTokenCount).

Knobs (attributes of `server.gemini`): `models` (the ids served), `busy` (the
next N generate calls get 429 RESOURCE_EXHAUSTED with a RetryInfo of
`retry_delay` seconds), `failures` (HTTP statuses the next generate calls
fail with, in order: 500 INTERNAL, 503 UNAVAILABLE, ...), `stream_error` (the
next stream breaks after its first event with an in-stream error of that
status), `thinking_tokens` (thoughtsTokenCount per answer, and
a thought part when thinkingConfig.includeThoughts), `batch_polls` (a batch
ends on its n-th GET), `batch_drop_keys` / `batch_reorder` (results without
their request's key, in reverse order: the real API's reported faults), `recorded` (a list: every call is appended to it as
`Recorded`, for tests comparing clients' requests).
"""
from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NotRequired, Protocol, TypedDict

import orjson
from aiohttp import web

from engine.loopback.errors import _json
from engine.loopback.gemini_files import GeminiUploads, UploadRefused

PREFIX = "/gemini"  # under the server's root, apart from the OpenAI routes (/v1/batches, /v1/files)
VERSIONS = ("v1", "v1beta")  # v1: the google-genai SDK's default since 2.x; v1beta: the REST docs' examples
# The versions Batch Mode (models.batchGenerateContent, batches.*) and the Files API (upload, download,
# files.get) are documented under: v1beta only (ai.google.dev/api/batch-api, checked 2026-11-28).
BATCH_VERSIONS = ("v1beta",)
DEFAULT_MODELS = ("gemini-2.5-pro", "gemini-2.5-flash", "gemini-3.8-flash", "gemini-3.5-flash-lite")
_REQUEST_FIELDS = {"contents", "systemInstruction", "generationConfig", "safetySettings", "tools", "toolConfig",
                   "cachedContent", "model", "labels"}
_CONFIG_FIELDS = {"temperature", "topP", "topK", "maxOutputTokens", "stopSequences", "seed", "candidateCount",
                  "presencePenalty", "frequencyPenalty", "thinkingConfig", "responseMimeType", "responseSchema",
                  "responseJsonSchema", "responseModalities", "responseLogprobs", "logprobs", "mediaResolution",
                  "speechConfig", "enableEnhancedCivicAnswers"}
_STATUS_NAME = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED",
                500: "INTERNAL", 503: "UNAVAILABLE"}
_GRPC_CODE = {"INVALID_ARGUMENT": 3, "NOT_FOUND": 5, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8}
_TYPE = "type.googleapis.com/google.ai.generativelanguage.v1main."
_FAILURE_TEXT = "The model is overloaded. Please try again later."


class Stats(Protocol):
    """The counters of the loopback server's ServerStats that the Gemini routes keep."""

    requests: int
    by_path: Counter[str]
    by_status: Counter[int | str]
    input_tokens: int
    output_tokens: int
    streams: int
    batch_requests: Counter[str]


class Host(Protocol):
    """What the Gemini routes use of the loopback server."""

    api_keys: frozenset[str] | None
    context_tokens: int | None
    count_tokens: Callable[[str], int]
    reply: Callable[[str, dict[str, object]], str | tuple[str, str]]

    @property
    def stats(self) -> Stats: ...   # read-only here, so the server's ServerStats fits


class Part(TypedDict, total=False):
    text: str
    thought: bool


class Content(TypedDict):
    parts: list[Part]
    role: str


class Candidate(TypedDict):
    finishReason: str
    index: int
    content: NotRequired[Content]


class GenerateResponse(TypedDict):
    """A GenerateContentResponse as this server builds it."""

    candidates: list[Candidate]
    usageMetadata: dict[str, object]
    modelVersion: str
    responseId: str


class Batch(TypedDict):
    """A batch job as the server keeps it (the operation it reports is built from this)."""

    name: str
    model: str
    displayName: str
    inputConfig: object
    createTime: str
    polls: int
    state: str
    lines: list[dict[str, object]]     # {"key", "response" | "error"}
    file: str | None                   # the input file's name, when the batch came in a file
    responses_file: NotRequired[str]


@dataclass(frozen=True, slots=True)
class Recorded:
    """One call as the server saw it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]   # lower-case names
    body: bytes


class GeminiError(Exception):
    """An error reply in Google's shape: {"error": {code, message, status, details}}."""

    def __init__(self, code: int, message: str, details: Sequence[Mapping[str, object]] = ()):
        super().__init__(message)
        self.code, self.message, self.details = code, message, list(details)

    def body(self) -> dict[str, object]:
        error: dict[str, object] = {"code": self.code, "message": self.message,
                                    "status": _STATUS_NAME.get(self.code, "UNKNOWN")}
        if self.details:
            error["details"] = self.details
        return {"error": error}

    def status(self) -> dict[str, object]:
        """As a google.rpc.Status inside a batch result (gRPC code)."""
        name = _STATUS_NAME.get(self.code, "UNKNOWN")
        return {"code": _GRPC_CODE.get(name, 2), "message": self.message, "status": name}

    def response(self) -> web.Response:
        return _json(self.body(), self.code)


def _bad(message: str) -> GeminiError:
    return GeminiError(400, message)


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _check_part(where: str, part: object) -> str:
    if not isinstance(part, dict):
        raise _bad(f"Invalid value at '{where}' (type.googleapis.com/google.ai.generativelanguage.v1beta.Part)")
    unknown = set(part) - {"text", "thought", "thoughtSignature", "inlineData", "fileData"}
    if unknown:
        raise _bad(f'Invalid JSON payload received. Unknown name "{sorted(unknown)[0]}" at \'{where}\': '
                   f"Cannot find field.")
    text = part.get("text")
    if text == "":
        raise _bad("Unable to submit request because it has an empty text parameter. Add a value to the "
                   "parameter and try again.")
    return text if isinstance(text, str) else ""


def _check_content(where: str, content: object, *, system: bool = False) -> tuple[str, str]:
    """(role, text) of a Content; GeminiError when the API would refuse it."""
    if not isinstance(content, dict):
        raise _bad(f"Invalid value at '{where}' (type.googleapis.com/google.ai.generativelanguage.v1beta.Content), "
                   f"{orjson.dumps(content).decode()[:60]}")
    parts = content.get("parts")
    if not isinstance(parts, list) or not parts:
        raise _bad(f"* GenerateContentRequest.{where}.parts: contents.parts must not be empty.")
    role = content.get("role") or "user"
    if not system and role not in ("user", "model"):
        raise _bad("Please use a valid role: user, model.")
    return str(role), "".join(_check_part(f"{where}.parts[{i}]", p) for i, p in enumerate(parts))


def check_request(body: object) -> tuple[str, list[tuple[str, str]], dict[str, object]]:
    """(system text, [(role, text)], generationConfig) of a GenerateContentRequest."""
    if not isinstance(body, dict):
        raise _bad("Invalid JSON payload received. Expected an object.")
    unknown = set(body) - _REQUEST_FIELDS
    if unknown:
        raise _bad(f'Invalid JSON payload received. Unknown name "{sorted(unknown)[0]}": Cannot find field.')
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise _bad("* GenerateContentRequest.contents: contents is not specified")
    turns = [_check_content(f"contents[{i}]", c) for i, c in enumerate(contents)]
    system = ""
    if "systemInstruction" in body:
        system = _check_content("system_instruction", body["systemInstruction"], system=True)[1]
    config = body.get("generationConfig") or {}
    if not isinstance(config, dict):
        raise _bad("Invalid value at 'generation_config'")
    unknown = set(config) - _CONFIG_FIELDS
    if unknown:
        raise _bad(f'Invalid JSON payload received. Unknown name "{sorted(unknown)[0]}" at '
                   f"'generation_config': Cannot find field.")
    return system, turns, config


class GeminiApi:
    """The Gemini routes of one loopback server, and their state."""

    def __init__(self, host: Host):
        self.host = host
        self.models: set[str] = set(DEFAULT_MODELS)
        self.busy = 0
        self.failures: list[int] = []
        self.stream_error: int | None = None
        self.retry_delay = 1
        self.thinking_tokens = 0
        self.cache_min_tokens = 1024
        self.batch_polls = 1
        # The faults of the real Batch API the engine must survive: results without their request's
        # metadata.key (python-genai#2008) and out of their requests' order (python-genai#1909).
        self.batch_drop_keys = False
        self.batch_reorder = False
        self.prompts: list[str] = []                        # seen prompts, for implicit caching
        self.files: dict[str, tuple[dict[str, object], bytes]] = {}
        self.uploads = GeminiUploads(self._store)          # the Files API's upload protocol
        self.batches: dict[str, Batch] = {}
        self.requests: Counter[str] = Counter()             # by route kind
        self.recorded: list[Recorded] | None = None
        self._ids = itertools.count(1)

    def add_routes(self, router: web.UrlDispatcher) -> None:
        for v in VERSIONS:
            api = f"{PREFIX}/{v}"
            router.add_post(f"{api}/models/{{target}}", self._serve(self._model_call))
            router.add_get(f"{api}/models", self._serve(self._list_models))
            router.add_get(f"{api}/models/{{target}}", self._serve(self._get_model))
            # Batch Mode and the Files API are documented under v1beta only (BATCH_VERSIONS): the other
            # versions answer 404, as for any method the API does not have there.
            batch = self._serve(self._batch_route if v in BATCH_VERSIONS else self._undocumented)
            router.add_get(f"{api}/batches", batch)
            router.add_get(f"{api}/batches/{{target}}", batch)
            router.add_post(f"{api}/batches/{{target}}", batch)
            router.add_delete(f"{api}/batches/{{target}}", batch)
            router.add_get(f"{api}/files/{{target}}", batch)
            router.add_post(f"{PREFIX}/upload/{v}/files", batch)
            router.add_get(f"{PREFIX}/download/{v}/files/{{target}}", batch)

    async def _batch_route(self, request: web.Request) -> web.StreamResponse:
        """A Batch Mode or Files API call, on a version that has them."""
        path, method = request.path, request.method
        if "/upload/" in path:
            return await self._upload(request)
        if "/download/" in path:
            return await self._download(request)
        if "/files/" in path:
            return await self._get_file(request)
        if "target" not in request.match_info:
            return await self._list_batches(request)
        handler = {"GET": self._get_batch, "POST": self._batch_call, "DELETE": self._delete_batch}[method]
        return await handler(request)

    async def _undocumented(self, request: web.Request) -> web.StreamResponse:
        version = request.path.removeprefix(PREFIX).split("/")[1 if "/upload/" not in request.path
                                                                and "/download/" not in request.path else 2]
        raise GeminiError(404, f"Method not found: {request.method} {request.path} is not part of the Gemini API "
                               f"{version} (Batch Mode and files are documented under v1beta).")

    def _serve(self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
               ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def serve(request: web.Request) -> web.StreamResponse:
            stats = self.host.stats
            stats.requests += 1
            stats.by_path[request.path] += 1
            if self.recorded is not None:
                self.recorded.append(Recorded(request.method, request.path, dict(request.query),
                                              {k.lower(): v for k, v in request.headers.items()},
                                              await request.read()))
            try:
                self._check_key(request)
                response = await handler(request)
            except GeminiError as exc:
                response = exc.response()
            stats.by_status[response.status] += 1
            return response
        return serve

    def _check_key(self, request: web.Request) -> None:
        keys = self.host.api_keys
        # An upload session's URL (X-Goog-Upload-URL) is its own credential: the SDK sends its chunks
        # without the key (google-genai 3.6.1 _upload_fd; checked 2026-11-28).
        if keys is None or ("/upload/" in request.path and "upload_id" in request.query):
            return
        presented = request.headers.get("x-goog-api-key") or request.query.get("key")
        if presented is None:
            raise GeminiError(403, "Method doesn't allow unregistered callers (callers without established "
                                   "identity). Please use API Key or other form of API consumer identity to call "
                                   "this API.")
        if presented not in keys:  # Google answers a wrong key with 400, reason API_KEY_INVALID
            raise GeminiError(400, f"API key not valid. Please pass a valid API key. ({presented})",
                              [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
                                "domain": "googleapis.com"}])

    def _model(self, request: web.Request, name: str, method: str) -> str:
        model = name.removeprefix("models/")
        if model not in self.models:
            version = request.path.split("/")[2]
            raise GeminiError(404, f"models/{model} is not found for API version {version}, or is not supported "
                                   f"for {method}. Call ListModels to see the list of available models and their "
                                   f"supported methods.")
        return model

    async def _json_body(self, request: web.Request) -> object:
        try:
            return orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            raise _bad("Invalid JSON payload received.") from None

    # -- generateContent ----------------------------------------------------------------
    async def _model_call(self, request: web.Request) -> web.StreamResponse:
        name, _, method = request.match_info["target"].partition(":")
        if method not in ("generateContent", "streamGenerateContent", "batchGenerateContent"):
            raise GeminiError(404, f"Method {method!r} is not found.")
        model = self._model(request, name, method)
        if method == "batchGenerateContent" and request.path.split("/")[2] not in BATCH_VERSIONS:
            return await self._undocumented(request)
        body = await self._json_body(request)
        self.requests[method] += 1
        if method == "batchGenerateContent":
            return _json(self._create_batch(model, body))
        if self.busy > 0:
            self.busy -= 1
            raise GeminiError(429, "You exceeded your current quota, please check your plan and billing details.",
                              [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                "retryDelay": f"{self.retry_delay}s"}])
        if self.failures:
            raise GeminiError(self.failures.pop(0), _FAILURE_TEXT)
        response = self.generate(model, body)
        if method == "streamGenerateContent":
            return await self._stream(request, response)
        return _json(response)

    def generate(self, model: str, body: object) -> GenerateResponse:
        """The GenerateContentResponse to a request (GeminiError when the API would refuse it)."""
        system, turns, config = check_request(body)
        prompt = "\n".join([system, *(text for _, text in turns)])
        prompt_tokens = self.host.count_tokens(prompt)
        limit = self.host.context_tokens
        if limit is not None and prompt_tokens > limit:
            raise _bad(f"The input token count ({prompt_tokens}) exceeds the maximum number of tokens allowed "
                       f"({limit}).")
        cached = self._cached(prompt)
        text, finish = self._answer(turns, config)
        usage: dict[str, object] = {"promptTokenCount": prompt_tokens,
                                    "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt_tokens}]}
        candidate: Candidate = {"finishReason": finish, "index": 0}
        parts: list[Part] = []
        thinking = config.get("thinkingConfig") or {}
        if self.thinking_tokens:
            usage["thoughtsTokenCount"] = self.thinking_tokens
            if isinstance(thinking, dict) and thinking.get("includeThoughts"):
                parts.append({"text": "Thinking it over.", "thought": True})
        if finish != "SAFETY":
            parts.append({"text": text})
            usage["candidatesTokenCount"] = self.host.count_tokens(text)
        if parts:
            candidate["content"] = {"parts": parts, "role": "model"}
        if cached:
            usage["cachedContentTokenCount"] = cached
        usage["totalTokenCount"] = sum(v for k, v in usage.items() if k.endswith("Count") and isinstance(v, int)
                                       and k != "cachedContentTokenCount")
        self.host.stats.input_tokens += prompt_tokens
        self.host.stats.output_tokens += int(usage.get("candidatesTokenCount") or 0)  # type: ignore[call-overload]
        return {"candidates": [candidate], "usageMetadata": usage, "modelVersion": model,
                "responseId": hashlib.blake2b(f"{next(self._ids)}".encode(), digest_size=8).hexdigest()}

    def _cached(self, prompt: str) -> int:
        """Tokens of the longest earlier prompt this one extends (implicit caching), at least cache_min_tokens."""
        best = max((p for p in self.prompts if prompt.startswith(p)), key=len, default="")
        if prompt not in self.prompts:
            self.prompts = [*self.prompts[-999:], prompt]
        tokens = self.host.count_tokens(best) if best else 0
        return tokens if tokens >= self.cache_min_tokens else 0

    def _answer(self, turns: list[tuple[str, str]], config: Mapping[str, object]) -> tuple[str, str]:
        messages = [{"role": "assistant" if role == "model" else "user", "content": text} for role, text in turns]
        produced = self.host.reply("gemini", {"messages": messages})
        text, finish = (produced, "stop") if isinstance(produced, str) else produced
        if finish == "content_filter":
            return "", "SAFETY"
        stops = config.get("stopSequences") or []
        for stop in stops if isinstance(stops, list) else []:
            if stop in text:
                text = text[:text.index(stop)]
        limit = config.get("maxOutputTokens")
        if isinstance(limit, int) and self.host.count_tokens(text) > limit:
            while text and self.host.count_tokens(text) > limit:
                text = text[:len(text) * limit // max(1, self.host.count_tokens(text))]
            return text, "MAX_TOKENS"
        return text, "STOP"

    async def _stream(self, request: web.Request, response: GenerateResponse) -> web.StreamResponse:
        """The response as server-sent events: the text in pieces, the finishReason with the last."""
        if request.query.get("alt") != "sse":
            raise _bad("This loopback serves streamGenerateContent with alt=sse only.")
        self.host.stats.streams += 1
        candidate = response["candidates"][0]
        parts = candidate["content"]["parts"] if "content" in candidate else []
        text = "".join(p.get("text", "") for p in parts if not p.get("thought"))
        words = text.split(" ")
        pieces = [" ".join(words[i:i + 4]) + (" " if i + 4 < len(words) else "") for i in range(0, len(words), 4)]
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        for i, piece in enumerate(pieces or [""]):
            last = i == len(pieces or [""]) - 1
            chunk_candidate: dict[str, object] = {"content": {"parts": [{"text": piece}], "role": "model"},
                                                  "index": 0}
            if last:
                chunk_candidate["finishReason"] = candidate["finishReason"]
            usage = response["usageMetadata"] if last else {"promptTokenCount": response["usageMetadata"][
                "promptTokenCount"]}
            chunk = {"candidates": [chunk_candidate], "usageMetadata": usage, "modelVersion": response["modelVersion"],
                     "responseId": response["responseId"]}
            await reply.write(b"data: " + orjson.dumps(chunk) + b"\r\n\r\n")
            if self.stream_error is not None:
                failure, self.stream_error = GeminiError(self.stream_error, _FAILURE_TEXT), None
                await reply.write(b"data: " + orjson.dumps(failure.body()) + b"\r\n\r\n")
                break
        await reply.write_eof()
        return reply

    # -- models ----------------------------------------------------------------------------
    def _model_object(self, model: str) -> dict[str, object]:
        return {"name": f"models/{model}", "version": "001", "displayName": model, "inputTokenLimit": 1_048_576,
                "outputTokenLimit": 65_536, "supportedGenerationMethods": [
                    "generateContent", "countTokens", "createCachedContent", "batchGenerateContent"]}

    async def _list_models(self, request: web.Request) -> web.Response:
        names = sorted(self.models)
        size = int(request.query.get("pageSize") or 50)
        start = int(request.query.get("pageToken") or 0)
        page: dict[str, object] = {"models": [self._model_object(m) for m in names[start:start + size]]}
        if start + size < len(names):
            page["nextPageToken"] = str(start + size)
        return _json(page)

    async def _get_model(self, request: web.Request) -> web.Response:
        return _json(self._model_object(self._model(request, request.match_info["target"], "get")))

    # -- files -----------------------------------------------------------------------------
    async def _upload(self, request: web.Request) -> web.Response:
        try:
            return await self.uploads.upload(request)
        except UploadRefused as exc:
            raise GeminiError(exc.code, exc.message) from None

    def _store(self, meta: Mapping[str, object], data: bytes) -> dict[str, object]:
        file_id = f"f{next(self._ids):08d}"
        info: dict[str, object] = {"name": f"files/{file_id}", "displayName": meta.get("displayName", file_id),
                                   "mimeType": meta.get("mimeType", "application/octet-stream"),
                                   "sizeBytes": str(len(data)), "createTime": _now(), "state": "ACTIVE",
                                   "uri": f"files/{file_id}"}
        self.files[file_id] = (info, data)
        return info

    def _file(self, target: str) -> tuple[dict[str, object], bytes]:
        found = self.files.get(target.partition(":")[0])
        if found is None:
            raise GeminiError(404, f"File {target} not found.")
        return found

    async def _get_file(self, request: web.Request) -> web.Response:
        return _json(self._file(request.match_info["target"])[0])

    async def _download(self, request: web.Request) -> web.Response:
        target = request.match_info["target"]
        if not target.endswith(":download") or request.query.get("alt") != "media":
            raise _bad("Downloads are files/{id}:download?alt=media.")
        return web.Response(body=self._file(target)[1], content_type="application/octet-stream")

    # -- batches ---------------------------------------------------------------------------
    def _batch_inputs(self, body: object) -> tuple[dict[str, object], list[tuple[str, object]], str | None]:
        """(the batch as asked, [(key, request)], input file name) of a batchGenerateContent body."""
        batch = body.get("batch") if isinstance(body, dict) else None
        if not isinstance(batch, dict) or not isinstance(batch.get("displayName"), str):
            raise _bad("* BatchGenerateContentRequest.batch.display_name: display_name is required")
        config = batch.get("inputConfig")
        if isinstance(config, dict) and isinstance(config.get("fileName"), str):
            _, data = self._file(config["fileName"].removeprefix("files/"))
            lines = [orjson.loads(line) for line in data.splitlines() if line.strip()]
            return batch, [(str(line.get("key")), line.get("request")) for line in lines], config["fileName"]
        requests = config.get("requests") if isinstance(config, dict) else None
        items = requests.get("requests") if isinstance(requests, dict) else None
        if not isinstance(items, list) or not items:
            raise _bad("* BatchGenerateContentRequest.batch.input_config: input_config is required")
        keyed = [(str((item.get("metadata") or {}).get("key", i)), item.get("request"))
                 for i, item in enumerate(items) if isinstance(item, dict)]
        return batch, keyed, None

    def _create_batch(self, model: str, body: object) -> dict[str, object]:
        asked, keyed, file_name = self._batch_inputs(body)
        name = f"batches/b{next(self._ids):08d}"
        lines: list[dict[str, object]] = []
        for key, request in keyed:
            try:
                lines.append({"key": key, "response": self.generate(model, request)})
                self.host.stats.batch_requests["succeeded"] += 1
            except GeminiError as exc:
                lines.append({"key": key, "error": exc.status()})
                self.host.stats.batch_requests["errored"] += 1
        self.batches[name] = {"name": name, "model": f"models/{model}", "displayName": str(asked["displayName"]),
                              "inputConfig": asked["inputConfig"], "createTime": _now(), "polls": 0,
                              "state": "BATCH_STATE_PENDING", "lines": lines, "file": file_name}
        return self._operation(self.batches[name])

    def _output(self, batch: Batch) -> dict[str, object]:
        lines = batch["lines"][::-1] if self.batch_reorder else batch["lines"]
        if batch["file"] is None:
            return {"inlinedResponses": {"inlinedResponses": [
                {k: v for k, v in line.items() if k != "key"} if self.batch_drop_keys
                else {**{k: v for k, v in line.items() if k != "key"}, "metadata": {"key": line["key"]}}
                for line in lines]}}
        if "responses_file" not in batch:
            data = b"".join(orjson.dumps({k: v for k, v in line.items() if k != "key" or not self.batch_drop_keys})
                            + b"\n" for line in lines)
            batch["responses_file"] = str(self._store({"displayName": "responses", "mimeType": "application/jsonl"},
                                                      data)["name"])
        return {"responsesFile": batch["responses_file"]}

    def _operation(self, batch: Batch) -> dict[str, object]:
        done = batch["state"] in ("BATCH_STATE_SUCCEEDED", "BATCH_STATE_CANCELLED")
        lines = batch["lines"]
        failed = sum(1 for line in lines if "error" in line)
        stats = {"requestCount": str(len(lines)), "successfulRequestCount": str(len(lines) - failed if done else 0),
                 "failedRequestCount": str(failed if done else 0), "pendingRequestCount": str(0 if done else len(lines))}
        metadata: dict[str, object] = {"@type": _TYPE + "GenerateContentBatch", "name": batch["name"],
                                    "model": batch["model"], "displayName": batch["displayName"],
                                    "inputConfig": batch["inputConfig"], "createTime": batch["createTime"],
                                    "updateTime": _now(), "batchStats": stats, "state": batch["state"]}
        operation: dict[str, object] = {"name": batch["name"], "metadata": metadata}
        if done:
            operation["done"] = True
            if batch["state"] == "BATCH_STATE_SUCCEEDED":
                output = self._output(batch)
                metadata["output"] = output
                operation["response"] = {"@type": _TYPE + "GenerateContentBatchOutput", **output}
        return operation

    def _batch(self, target: str) -> Batch:
        found = self.batches.get(f"batches/{target.partition(':')[0]}")
        if found is None:
            raise GeminiError(404, f"Batch batches/{target} not found.")
        return found

    async def _get_batch(self, request: web.Request) -> web.Response:
        batch = self._batch(request.match_info["target"])
        batch["polls"] += 1
        if batch["state"] == "BATCH_STATE_PENDING" and batch["polls"] >= self.batch_polls:
            batch["state"] = "BATCH_STATE_SUCCEEDED"
        return _json(self._operation(batch))

    async def _batch_call(self, request: web.Request) -> web.Response:
        target = request.match_info["target"]
        if not target.endswith(":cancel"):
            raise GeminiError(404, f"Method {target} is not found.")
        batch = self._batch(target)
        if batch["state"] == "BATCH_STATE_PENDING":
            batch["state"] = "BATCH_STATE_CANCELLED"
        return _json({})

    async def _delete_batch(self, request: web.Request) -> web.Response:
        self.batches.pop(self._batch(request.match_info["target"])["name"])
        return _json({})

    async def _list_batches(self, request: web.Request) -> web.Response:
        size = int(request.query.get("pageSize") or 50)
        newest = sorted(self.batches.values(), key=lambda b: b["name"], reverse=True)[:size]
        return _json({"operations": [self._operation(b) for b in newest]})

