"""Assembling an OpenAI chat-completions stream (server-sent events) into
the completion the same call would have returned without streaming.

Each chunk is a JSON object; choice 0's `delta.content` pieces make the
text, its `finish_reason` the finish, the last chunk (with
`stream_options.include_usage`) the usage; `data: [DONE]` ends the stream.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from providers.base import JSONObject, JSONValue, ProviderError


@dataclass(slots=True)
class CompletionAssembler:
    """The state of one stream. `malformed(what)` builds the error of a
    chunk that breaks the format."""

    malformed: Callable[[str], ProviderError]
    texts: list[str] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # when each text piece arrived, seconds after the send
    content: str | None = None       # stays None unless a delta carries content (a tool call, a refusal)
    finish: JSONValue = None
    usage: JSONValue = None
    reply_id: JSONValue = None
    done: bool = False

    def feed(self, chunk: JSONObject, arrived: float) -> None:
        """One chunk, received `arrived` seconds after the send."""
        self.reply_id = self.reply_id or chunk.get("id")
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        if choices is None:
            return
        if not isinstance(choices, list):
            raise self.malformed("stream chunk's choices is not a list")
        for choice in choices:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._choice(choice, arrived)

    def _choice(self, choice: JSONObject, arrived: float) -> None:
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(text, str):
            self.content = ""
            if text:
                self.texts.append(text)
                self.times.append(arrived)
        if choice.get("finish_reason") is not None:
            self.finish = choice["finish_reason"]

    def assembled(self) -> JSONObject:
        """The completion, as a non-streamed reply's body."""
        content = None if self.content is None else "".join(self.texts)
        return {"id": self.reply_id, "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                                  "finish_reason": self.finish}], "usage": self.usage}
