"""The OpenAI Batch API and Anthropic Message Batches, for the loopback server.

Contract:
- Routes (added by `Batches.add_routes`): OpenAI `POST /v1/batches`,
  `GET /v1/batches` (list: `after`, `limit`), `GET /v1/batches/{id}`,
  `POST /v1/batches/{id}/cancel`; Anthropic `POST /v1/messages/batches`,
  `GET /v1/messages/batches` (list: `before_id`, `after_id`, `limit`),
  `GET/DELETE /v1/messages/batches/{id}`, `POST .../{id}/cancel`,
  `GET .../{id}/results`. Input and output files live in the server's
  `files` (uploaded with `POST /v1/files`, purpose "batch"; read back with
  `GET /v1/files/{id}/content`).
- Time is counted in status polls, not seconds, so tests run in
  milliseconds: a batch ends on its `BatchKnobs.polls`-th status poll
  (`GET` of the batch). Requests are processed progressively over the polls
  before that, in a shuffled order (`shuffle`, on by default) that is also
  the order of the results, which is never the input order (for 2+ lines).
- Each line is computed by `server.batch_line(api, path, body)`, which builds
  exactly what the direct endpoint would (same text, same usage; no rate
  limits, faults or latency) and counts it in the server's stats
  (`batch_requests` by outcome, `batch_input_tokens`, `batch_output_tokens`).
  Lines go through the prompt cache like direct calls (both providers cache
  in batches, best effort), in processing order.
- Knobs: `fail_share` of the lines (an exact, seeded choice) fail with a 500
  server error (or `fail_status`, e.g. 402: Anthropic's billing_error, and
  Anthropic's error type `fail_type`, e.g. one no client knows); `expire_after` (None: never) makes batches expire when they
  would end, with that share of the lines done; `seed`.
- OpenAI states: validating -> (first poll) failed, with `errors` (codes
  invalid_json_line, missing_required_parameter, duplicate_custom_id,
  url_mismatch, model_mismatch, empty_file, too_many_tasks, each with its
  1-based line) | in_progress -> finalizing (all lines done) -> completed |
  expired; cancel moves a live batch to cancelling (again: no change; a
  finished batch: 400), and the next poll to cancelled (lines done so far are
  kept; lines never started are in neither file). Output lines `{"id", "custom_id", "response": {"status_code",
  "request_id", "body"}, "error": null}`; the error file holds HTTP failures
  (status >= 400, the error in `body`) and expired lines (`"response": null,
  "error": {"code": "batch_expired", ...}`); a batch with no success has
  `output_file_id: null`, one with no failure `error_file_id: null` (`""`
  with the knob `empty_file_ids`, as OpenAI has also answered).
- Anthropic: creation checks custom_id (`^[a-zA-Z0-9_-]{1,64}$`, unique) and
  answers 400 otherwise; params are checked when processed (an invalid one
  gives an `errored` result). processing_status in_progress | canceling |
  ended; request_counts stay {processing: n, others 0} until the batch ends;
  `results_url` is absolute (the origin the client used). Results: JSONL of
  `{"custom_id", "result": {"type": "succeeded", "message"} | {"type":
  "errored", "error": {"type": "error", "error"}} | {"type": "canceled"} |
  {"type": "expired"}}`.
- Results and output files are served as the first of JSONL_TYPES the
  request's Accept allows, else 406 (`Accept: application/json` is refused).
"""
from __future__ import annotations

import math
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypedDict

import orjson
from aiohttp import web

from engine.loopback.errors import _json, _Reject, anthropic_error, file_reply, openai_error
from engine.loopback.model_catalog import check_anthropic_sampling


class BatchStats(Protocol):
    """The server's counters the batch APIs add to (ServerStats)."""

    @property
    def batch_requests(self) -> Counter[str]: ...  # batch lines by outcome


class StoredFile(TypedDict):
    """A file the server holds (uploaded, or a batch's output), as /v1/files describes it."""
    content: bytes
    filename: str
    purpose: str
    created_at: int       # seconds since the epoch


class BatchHost(Protocol):
    """What the batch APIs need of the server that hosts them (LoopbackServer)."""

    @property
    def stats(self) -> BatchStats: ...
    files: dict[str, StoredFile]  # uploaded and produced files by id

    def _next_id(self) -> str: ...
    def _control(self, handler: Callable[[web.Request], Awaitable[web.Response]], api: str = "openai"
                 ) -> Callable[[web.Request], Awaitable[web.Response]]: ...
    def batch_line(self, api: str, path: str, body: object) -> tuple[int, dict[str, Any]]: ...
    def error_body(self, api: str, status: int, message: str, code: str | None = None,
                   param: str | None = None) -> dict[str, Any]: ...

OPENAI_ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings")
MAX_OPENAI_LINES = 50_000
MAX_ANTHROPIC_REQUESTS = 100_000
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_DAY = 24 * 3600
# The types a batch's JSONL (results, output and error files) is served as: the
# first one the request's Accept allows ("application/binary": what both SDKs ask).
JSONL_TYPES = ("application/x-jsonl", "application/jsonl", "application/binary", "application/octet-stream")


@dataclass
class BatchKnobs:
    polls: int = 3                       # the status poll on which a batch ends
    fail_share: float = 0.0              # share of lines failing with `fail_status` (500)
    # The failing lines' status and, Anthropic, error type (default: the status's;
    # 402: billing_error; any other string: a type the client does not know).
    fail_status: int = 500
    fail_type: str | None = None
    expire_after: float | None = None    # None: batches complete; else they expire with this share done
    shuffle: bool = True                 # results out of input order
    seed: int = 0
    # OpenAI: a file a batch does not have is `""` instead of null (as OpenAI has
    # answered for batches with no failed line), and/or the error file's content
    # answers 404 (a file that cannot be read must not lose the output file's lines).
    empty_file_ids: bool = False
    error_file_lost: bool = False
    # False: no batch routes, as an OpenAI-compatible vLLM or llama.cpp server (404 on /v1/batches).
    served: bool = True

    def __post_init__(self) -> None:
        if self.polls < 1:
            raise ValueError("batch polls must be >= 1")
        if not 0.0 <= self.fail_share <= 1.0:
            raise ValueError("batch fail share must be in [0, 1]")
        if self.expire_after is not None and not 0.0 <= self.expire_after <= 1.0:
            raise ValueError("batch expire_after must be in [0, 1]")


def _rfc3339(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class _Run:
    """What both APIs share: the lines, their processing order and results."""
    id: str
    lines: list[tuple[str, object]]          # (custom_id, request body)
    order: list[int]
    failing: set[int]
    polls: int = 0
    done: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)  # line -> (status, body)

    def process(self, target: int, run_line: Callable[[int, object], tuple[int, dict[str, Any]]]) -> None:
        for index in self.order[len(self.done):target]:
            self.done[index] = run_line(index, self.lines[index][1])


class Batches:
    def __init__(self, server: BatchHost, knobs: BatchKnobs):
        self.server = server
        self.knobs = knobs
        self.openai: dict[str, dict[str, Any]] = {}     # id -> {"batch": object, "run": _Run, ...}
        self.anthropic: dict[str, dict[str, Any]] = {}

    def add_routes(self, router: web.UrlDispatcher) -> None:
        if not self.knobs.served:
            return
        control = self.server._control
        router.add_post("/v1/batches", control(self._openai_create))
        router.add_get("/v1/batches", control(self._openai_list))
        router.add_get("/v1/batches/{batch_id}", control(self._openai_get))
        router.add_post("/v1/batches/{batch_id}/cancel", control(self._openai_cancel))
        router.add_post("/v1/messages/batches", control(self._anthropic_create, "anthropic"))
        router.add_get("/v1/messages/batches", control(self._anthropic_list, "anthropic"))
        router.add_get("/v1/messages/batches/{batch_id}", control(self._anthropic_get, "anthropic"))
        router.add_delete("/v1/messages/batches/{batch_id}", control(self._anthropic_delete, "anthropic"))
        router.add_post("/v1/messages/batches/{batch_id}/cancel", control(self._anthropic_cancel, "anthropic"))
        router.add_get("/v1/messages/batches/{batch_id}/results", control(self._anthropic_results, "anthropic"))

    # -- shared ---------------------------------------------------------------------------
    def _run(self, batch_id: str, lines: list[tuple[str, object]]) -> _Run:
        rng = random.Random(f"{self.knobs.seed}:{batch_id}")
        order = list(range(len(lines)))
        if self.knobs.shuffle and len(order) > 1:
            rng.shuffle(order)
            if order == sorted(order):
                order.reverse()
        failing = set(rng.sample(range(len(lines)), round(len(lines) * self.knobs.fail_share)))
        return _Run(batch_id, lines, order, failing)

    def _target(self, run: _Run) -> int:
        """Lines done by this poll: all of them by the poll before the last."""
        total, polls = len(run.lines), self.knobs.polls
        share = 1.0 if polls <= 1 else min(1.0, run.polls / (polls - 1))
        if self.knobs.expire_after is not None:
            share = min(share, self.knobs.expire_after)
        return min(total, math.ceil(total * share))

    def _line(self, api: str, path: str, run: _Run, index: int, body: object) -> tuple[int, dict[str, Any]]:
        if index in run.failing:
            status = self.knobs.fail_status
            self.server.stats.batch_requests[f"injected_{status}"] += 1
            error = self.server.error_body(api, status, "The server had an error while processing your request."
                                           if status >= 500 else f"This line failed with HTTP {status}.")
            if self.knobs.fail_type is not None and api == "anthropic":
                error["error"]["type"] = self.knobs.fail_type
            return status, error
        status, reply = self.server.batch_line(api, path, body)
        self.server.stats.batch_requests["succeeded" if status == 200 else f"errored_{status}"] += 1
        return status, reply

    @staticmethod
    async def _json_body(request: web.Request) -> object:
        try:
            return orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return None

    # -- OpenAI ---------------------------------------------------------------------------
    async def _openai_create(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        if not isinstance(body, dict):
            return openai_error(400, "The request body must be a JSON object.")
        file_id, endpoint = body.get("input_file_id"), body.get("endpoint")
        if endpoint not in OPENAI_ENDPOINTS:
            return openai_error(400, f"Invalid value: '{endpoint}'. Supported values are: "
                                     f"{', '.join(repr(e) for e in OPENAI_ENDPOINTS)}.", param="endpoint",
                                code="invalid_value")
        if body.get("completion_window") != "24h":
            return openai_error(400, "Invalid value for 'completion_window': only '24h' is supported.",
                                param="completion_window", code="invalid_value")
        upload = self.server.files.get(file_id) if isinstance(file_id, str) else None
        if upload is None:
            return openai_error(404, f"No such File object: {file_id}", param="input_file_id")
        if upload["purpose"] != "batch":
            return openai_error(400, f"File {file_id} has purpose '{upload['purpose']}', not 'batch'.",
                                param="input_file_id")
        batch_id = f"batch_{self.server._next_id()}"
        lines, errors, model = self._openai_validate(upload["content"], endpoint)
        now = int(time.time())
        batch = {
            "id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None, "input_file_id": file_id,
            "completion_window": "24h", "status": "validating", "output_file_id": None, "error_file_id": None,
            "created_at": now, "in_progress_at": None, "expires_at": now + _DAY, "finalizing_at": None,
            "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
            "cancelled_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": body.get("metadata"), "model": model, "usage": None,
        }
        self.openai[batch_id] = {"batch": batch, "run": self._run(batch_id, lines), "errors": errors}
        return _json(batch)

    @staticmethod
    def _openai_validate(content: bytes, endpoint: str) -> tuple[list[tuple[str, object]], list[dict[str, object]], str | None]:
        """(lines, validation errors, model) of a batch input file."""
        lines: list[tuple[str, object]] = []
        errors: list[dict[str, object]] = []
        seen: set[str] = set()
        model = None

        def error(code: str, message: str, line: int | None, param: str | None = None) -> None:
            errors.append({"code": code, "message": message, "param": param, "line": line})

        raw_lines = [(n, raw) for n, raw in enumerate(content.splitlines(), 1) if raw.strip()]
        if not raw_lines:
            error("empty_file", "The batch input file is empty.", None)
        if len(raw_lines) > MAX_OPENAI_LINES:
            error("too_many_tasks", f"The batch input file has more than {MAX_OPENAI_LINES} requests.", None)
        for number, raw in raw_lines:
            try:
                item = orjson.loads(raw)
            except orjson.JSONDecodeError:
                item = None
            if not isinstance(item, dict):
                error("invalid_json_line", "This line is not parseable as valid JSON.", number)
                continue
            custom_id = item.get("custom_id")
            missing = [k for k in ("custom_id", "method", "url", "body") if k not in item]
            if missing or not isinstance(custom_id, str) or not isinstance(item.get("body"), dict):
                error("missing_required_parameter", f"Missing or invalid required parameter(s): "
                      f"{', '.join(missing) or 'custom_id/body'}.", number, (missing or ["body"])[0])
                continue
            if custom_id in seen:
                error("duplicate_custom_id", f"The custom_id '{custom_id}' is not unique in this batch.", number,
                      "custom_id")
                continue
            seen.add(custom_id)
            if item.get("url") != endpoint or item.get("method") != "POST":
                error("url_mismatch", f"The url of this line must be POST {endpoint}, the batch's endpoint.",
                      number, "url")
                continue
            line_model = item["body"].get("model")
            if model is None:
                model = line_model
            elif line_model != model:
                error("model_mismatch", "All requests of a batch must use the same model "
                      f"('{model}' before, '{line_model}' here).", number, "body.model")
                continue
            lines.append((custom_id, item["body"]))
        return lines, errors, model

    def _openai_entry(self, request: web.Request) -> dict[str, Any] | None:
        return self.openai.get(request.match_info["batch_id"])

    async def _openai_get(self, request: web.Request) -> web.Response:
        entry = self._openai_entry(request)
        if entry is None:
            return self._openai_missing(request)
        run, batch = entry["run"], entry["batch"]
        now = int(time.time())
        status = batch["status"]
        if status in ("failed", "completed", "expired", "cancelled"):
            return _json(batch)
        run.polls += 1
        if status == "validating":
            if entry["errors"]:
                batch.update(status="failed", failed_at=now,
                             errors={"object": "list", "data": entry["errors"]})
                return _json(batch)
            batch.update(status="in_progress", in_progress_at=now)
            batch["request_counts"]["total"] = len(run.lines)
        if status == "cancelling":
            self._openai_end(batch, run, "cancelled", now)
            return _json(batch)
        path = batch["endpoint"]
        run.process(self._target(run), lambda i, body: self._line("openai", path, run, i, body))
        if run.polls >= self.knobs.polls:
            self._openai_end(batch, run, "completed" if self.knobs.expire_after is None else "expired", now)
        else:
            if len(run.done) == len(run.lines) and batch["status"] == "in_progress":
                batch.update(status="finalizing", finalizing_at=now)
            self._openai_counts(batch, run)
        return _json(batch)

    def _openai_counts(self, batch: dict[str, Any], run: _Run) -> None:
        ok = sum(1 for status, _ in run.done.values() if status == 200)
        batch["request_counts"].update(completed=ok, failed=len(run.done) - ok)

    def _openai_end(self, batch: dict[str, Any], run: _Run, status: str, now: int) -> None:
        outputs: list[object] = []
        failures: list[object] = []
        usage: dict[str, Any] = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                                 "input_tokens_details": {"cached_tokens": 0},
                                 "output_tokens_details": {"reasoning_tokens": 0}}
        for index in run.order:
            custom_id = run.lines[index][0]
            line_id = f"batch_req_{self.server._next_id()}"
            if index not in run.done:
                if status != "expired":
                    continue  # cancelled: never started
                failures.append({"id": line_id, "custom_id": custom_id, "response": None,
                                 "error": {"code": "batch_expired", "message": "This request could not be "
                                           "executed before the completion window expired."}})
                continue
            code, body = run.done[index]
            line = {"id": line_id, "custom_id": custom_id,
                    "response": {"status_code": code, "request_id": f"req_{self.server._next_id()}", "body": body},
                    "error": None}
            (outputs if code == 200 else failures).append(line)
            used = body.get("usage") if code == 200 else None
            if used:
                usage["input_tokens"] += used.get("prompt_tokens", 0)
                usage["output_tokens"] += used.get("completion_tokens", 0)
                usage["input_tokens_details"]["cached_tokens"] += (used.get("prompt_tokens_details") or {}).get(
                    "cached_tokens", 0)
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        batch["output_file_id"] = self._save(batch["id"], "output", outputs)
        batch["error_file_id"] = self._save(batch["id"], "error", failures)
        if self.knobs.error_file_lost and batch["error_file_id"] is not None:
            del self.server.files[batch["error_file_id"]]
        if self.knobs.empty_file_ids:
            batch.update({k: batch[k] or "" for k in ("output_file_id", "error_file_id")})
        ok = len(outputs)
        batch["request_counts"].update(total=len(run.lines), completed=ok, failed=len(failures))
        batch.update(status=status, usage=usage, **{f"{status}_at": now})
        if status == "completed" and batch["finalizing_at"] is None:
            batch["finalizing_at"] = now

    def _save(self, batch_id: str, kind: str, lines: list[object]) -> str | None:
        if not lines:
            return None
        file_id = f"file-{self.server._next_id()}"
        self.server.files[file_id] = {"content": b"".join(orjson.dumps(line) + b"\n" for line in lines),
                                      "filename": f"{batch_id}_{kind}.jsonl", "purpose": "batch_output",
                                      "created_at": int(time.time())}
        return file_id

    async def _openai_cancel(self, request: web.Request) -> web.Response:
        entry = self._openai_entry(request)
        if entry is None:
            return self._openai_missing(request)
        batch = entry["batch"]
        if batch["status"] == "cancelling":  # asking again changes nothing
            return _json(batch)
        if batch["status"] not in ("validating", "in_progress", "finalizing"):
            return openai_error(400, f"Cannot cancel a batch with status '{batch['status']}'.")
        batch.update(status="cancelling", cancelling_at=int(time.time()))
        return _json(batch)

    async def _openai_list(self, request: web.Request) -> web.Response:
        batches = [entry["batch"] for entry in reversed(self.openai.values())]  # newest first
        after = request.query.get("after")
        if after is not None:
            ids = [b["id"] for b in batches]
            batches = batches[ids.index(after) + 1:] if after in ids else []
        limit = max(1, min(100, int(request.query.get("limit", 20))))
        page = batches[:limit]
        return _json({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                      "last_id": page[-1]["id"] if page else None, "has_more": len(batches) > limit})

    @staticmethod
    def _openai_missing(request: web.Request) -> web.Response:
        return openai_error(404, f"No batch found with id '{request.match_info['batch_id']}'.", param="batch_id")

    # -- Anthropic ------------------------------------------------------------------------
    async def _anthropic_create(self, request: web.Request) -> web.Response:
        body = await self._json_body(request)
        requests = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(requests, list) or not requests:
            return anthropic_error(400, "requests: Field required (a non-empty list)")
        if len(requests) > MAX_ANTHROPIC_REQUESTS:
            return anthropic_error(400, f"requests: at most {MAX_ANTHROPIC_REQUESTS} requests per batch")
        seen: set[str] = set()
        lines = []
        for index, item in enumerate(requests):
            custom_id = item.get("custom_id") if isinstance(item, dict) else None
            if not isinstance(custom_id, str) or not _CUSTOM_ID.match(custom_id):
                return anthropic_error(400, f"requests.{index}.custom_id: String should match pattern "
                                            f"'^[a-zA-Z0-9_-]{{1,64}}$'")
            if custom_id in seen:
                return anthropic_error(400, f"Duplicate custom_id '{custom_id}' found in requests. Each request "
                                            f"must have a unique custom_id.")
            if not isinstance(item.get("params"), dict):
                return anthropic_error(400, f"requests.{index}.params: Field required")
            try:  # the version's and the model's sampling rules, checked when the batch is created
                check_anthropic_sampling(str(item["params"].get("model", "")), item["params"],
                                         request.headers.get("anthropic-version"), f"requests.{index}.params.")
            except _Reject as refused:
                return anthropic_error(refused.status, refused.message)
            seen.add(custom_id)
            lines.append((custom_id, item["params"]))
        batch_id = f"msgbatch_{self.server._next_id()}"
        now = time.time()
        entry = {"run": self._run(batch_id, lines), "created_at": now, "ended_at": None, "cancel_at": None,
                 "status": "in_progress", "origin": str(request.url.origin())}
        self.anthropic[batch_id] = entry
        return _json(self._anthropic_object(batch_id, entry))

    def _anthropic_object(self, batch_id: str, entry: dict[str, Any]) -> dict[str, Any]:
        run: _Run = entry["run"]
        counts = {"processing": len(run.lines), "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if entry["status"] == "ended":
            counts["processing"] = 0
            for _, result in self._anthropic_results_of(entry):
                counts[result["type"]] += 1
        return {"id": batch_id, "type": "message_batch", "processing_status": entry["status"],
                "request_counts": counts, "ended_at": _rfc3339(entry["ended_at"]),
                "created_at": _rfc3339(entry["created_at"]), "expires_at": _rfc3339(entry["created_at"] + _DAY),
                "archived_at": None, "cancel_initiated_at": _rfc3339(entry["cancel_at"]),
                "results_url": (f"{entry['origin']}/v1/messages/batches/{batch_id}/results"
                                if entry["status"] == "ended" else None)}

    def _anthropic_results_of(self, entry: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        run: _Run = entry["run"]
        results = []
        for index in run.order:
            custom_id = run.lines[index][0]
            if index in run.done:
                status, body = run.done[index]
                result = ({"type": "succeeded", "message": body} if status == 200
                          else {"type": "errored", "error": body})
            else:
                result = {"type": "expired" if entry.get("expired") else "canceled"}
            results.append((custom_id, result))
        return results

    async def _anthropic_get(self, request: web.Request) -> web.Response:
        batch_id = request.match_info["batch_id"]
        entry = self.anthropic.get(batch_id)
        if entry is None:
            return self._anthropic_missing(batch_id)
        run: _Run = entry["run"]
        if entry["status"] != "ended":
            run.polls += 1
            if entry["status"] == "canceling":
                entry.update(status="ended", ended_at=time.time())
            else:
                run.process(self._target(run), lambda i, body: self._line("anthropic", "/v1/messages", run, i,
                                                                           body))
                if run.polls >= self.knobs.polls:
                    entry.update(status="ended", ended_at=time.time(), expired=self.knobs.expire_after is not None)
        return _json(self._anthropic_object(batch_id, entry))

    async def _anthropic_cancel(self, request: web.Request) -> web.Response:
        batch_id = request.match_info["batch_id"]
        entry = self.anthropic.get(batch_id)
        if entry is None:
            return self._anthropic_missing(batch_id)
        if entry["status"] == "in_progress":
            entry.update(status="canceling", cancel_at=time.time())
        elif entry["status"] == "ended":
            return anthropic_error(400, f"Batch {batch_id} has already ended and cannot be canceled.")
        return _json(self._anthropic_object(batch_id, entry))

    async def _anthropic_delete(self, request: web.Request) -> web.Response:
        batch_id = request.match_info["batch_id"]
        entry = self.anthropic.get(batch_id)
        if entry is None:
            return self._anthropic_missing(batch_id)
        if entry["status"] != "ended":
            return anthropic_error(400, f"Batch {batch_id} is still being processed; cancel it first, then "
                                        f"delete it once it has ended.")
        del self.anthropic[batch_id]
        return _json({"id": batch_id, "type": "message_batch_deleted"})

    async def _anthropic_results(self, request: web.Request) -> web.Response:
        batch_id = request.match_info["batch_id"]
        entry = self.anthropic.get(batch_id)
        if entry is None:
            return self._anthropic_missing(batch_id)
        if entry["status"] != "ended":
            return anthropic_error(404, f"Results for batch {batch_id} are not available until it has ended.")
        content = b"".join(orjson.dumps({"custom_id": custom_id, "result": result}) + b"\n"
                           for custom_id, result in self._anthropic_results_of(entry))
        return file_reply(request, "anthropic", content, JSONL_TYPES)

    async def _anthropic_list(self, request: web.Request) -> web.Response:
        ids = list(reversed(self.anthropic))  # newest first
        after, before = request.query.get("after_id"), request.query.get("before_id")
        if after in ids:
            ids = ids[ids.index(after) + 1:]
        elif before in ids:
            ids = ids[:ids.index(before)]
        limit = max(1, min(1000, int(request.query.get("limit", 20))))
        page = [self._anthropic_object(i, self.anthropic[i]) for i in ids[:limit]]
        return _json({"data": page, "has_more": len(ids) > limit, "first_id": page[0]["id"] if page else None,
                      "last_id": page[-1]["id"] if page else None})

    @staticmethod
    def _anthropic_missing(batch_id: str) -> web.Response:
        return anthropic_error(404, f"No message batch found with id {batch_id}")
