"""Assembling a Gemini `streamGenerateContent?alt=sse` stream into the
GenerateContentResponse the same call would have returned unstreamed.

Each `data:` event is a whole GenerateContentResponse holding the next piece
of candidate 0's parts; the one that ends the answer carries its
`finishReason`, and every event the usage so far (`usageMetadata`, the last
one final). There is no end marker: the HTTP body simply ends. A stream that
ends before any finishReason was cut short (checked 2026-11-26: the
google-genai SDK's `generate_content_stream` and the REST reference of
models.streamGenerateContent).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from providers.base import JSONObject, JSONValue, ProviderError


@dataclass(slots=True)
class ResponseAssembler:
    """The state of one stream; `malformed(what)` builds the error of an event that breaks the format."""

    malformed: Callable[[str], ProviderError]
    parts: list[JSONValue] = field(default_factory=list)  # the answer's part objects, in order
    times: list[float] = field(default_factory=list)  # when each answer-text piece arrived, seconds after the send
    finish: JSONValue = None
    usage: JSONValue = None
    response_id: JSONValue = None
    model_version: JSONValue = None
    prompt_feedback: JSONValue = None
    events: int = 0

    def feed(self, payload: JSONObject, arrived: float) -> None:
        """One event's GenerateContentResponse, received `arrived` seconds after the send."""
        self.events += 1
        for key in ("usageMetadata", "responseId", "modelVersion", "promptFeedback"):
            if key in payload:
                setattr(self, _ATTR[key], payload[key])
        candidates = payload.get("candidates")
        if candidates is None:
            return
        if not isinstance(candidates, list):
            raise self.malformed("event's candidates is not a list of objects")
        if not candidates:
            return
        candidate = candidates[0]
        if not isinstance(candidate, dict):
            raise self.malformed("event's candidates is not a list of objects")
        content = candidate.get("content")
        parts = content.get("parts") if isinstance(content, dict) else None
        for part in parts if isinstance(parts, list) else []:
            if not isinstance(part, dict):
                raise self.malformed("event holds a part that is not an object")
            self.parts.append(part)
            if isinstance(part.get("text"), str) and part["text"] and not part.get("thought"):
                self.times.append(arrived)
        if candidate.get("finishReason"):
            self.finish = candidate["finishReason"]

    @property
    def ended(self) -> bool:
        """The answer ended (a finishReason came), or the prompt was blocked (no candidate ever will)."""
        return self.finish is not None or _blocked(self.prompt_feedback)

    def assembled(self) -> JSONObject:
        """The unstreamed response: one candidate holding every part, in order."""
        response: JSONObject = {"usageMetadata": self.usage, "responseId": self.response_id,
                                "modelVersion": self.model_version}
        if self.prompt_feedback is not None:
            response["promptFeedback"] = self.prompt_feedback
        if self.finish is not None or self.parts:
            response["candidates"] = [{"content": {"role": "model", "parts": self.parts},
                                       "finishReason": self.finish}]
        return response


_ATTR = {"usageMetadata": "usage", "responseId": "response_id", "modelVersion": "model_version",
         "promptFeedback": "prompt_feedback"}


def _blocked(feedback: JSONValue) -> bool:
    return isinstance(feedback, dict) and bool(feedback.get("blockReason"))
