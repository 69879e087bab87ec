"""The Gemini API (Google AI, generativelanguage.googleapis.com) over raw HTTP (kind "gemini").

POST `{base_url}/{api_version}/models/{model}:generateContent` with the key in
`x-goog-api-key` (api_version "v1": the default of the google-genai SDK 3.6.1,
whose GOOGLE_AI_API_DEFAULT_VERSION it is; option `api_version = "v1beta"`
for the REST docs' version; checked 2026-11-26 in ai.google.dev/api and the SDK).
Differences from the OpenAI format handled here:
- messages become `contents` (role "user" or "model", each one text part);
  system messages become `systemInstruction` (several joined by a blank line;
  an alias with `system_prompt = false` sends none, as the reference did);
- params go to `generationConfig`: temperature, top_p -> topP, top_k -> topK,
  max_tokens (or max_completion_tokens) -> maxOutputTokens, stop ->
  stopSequences, seed, presence/frequency penalties; thinking_budget /
  thinking_level / include_thoughts -> thinkingConfig (sent only when a param
  asks); any other key is passed into generationConfig as written;
- the answer is candidate 0's text parts, its thought parts (thought = true)
  left out; finishReason STOP -> "stop", MAX_TOKENS -> "length", SAFETY,
  RECITATION, BLOCKLIST, PROHIBITED_CONTENT, SPII (and a prompt blocked by
  promptFeedback.blockReason, which has no candidate) -> "content_filter": a
  final outcome with the text it has (maybe none), never retried; others kept
  in lower case;
- usageMetadata: promptTokenCount is the whole prompt, of which
  cachedContentTokenCount was read from the (implicit or explicit) context
  cache; candidatesTokenCount + thoughtsTokenCount are the output (thinking
  tokens are billed as output).
Implicit context caching is automatic on Gemini 2.5 and later models: the
engine's warm-up of shared prefixes (option `prompt_cache`, default true)
makes the later calls of a prefix hit it; explicit `cachedContents` are not used.

Streaming (`chat(..., stream=True)` or option `stream = true`):
`:streamGenerateContent?alt=sse`, assembled by providers/gemini_stream.py into
the same response, plus `timings`. Errors are google.rpc statuses
(providers/gemini_errors.py: a 429's RetryInfo retryDelay is its wait). The
model list is `GET {api_version}/models`, paged by pageToken (`list_models`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from time import perf_counter
from urllib.parse import quote

import orjson

from providers.base import CONNECTION, ChatResult, EndpointSpec, JSONObject, ProviderError, StreamTimings
from providers.gemini_errors import gemini_status_error, gemini_stream_error
from providers.gemini_stream import ResponseAssembler
from providers.http_client import HttpProvider, JsonHttpClient
from providers.http_errors import bad_reply, token_count
from providers.kinds import opt_bool, opt_str, opt_strings
from providers.sse import SSEParser

DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
DEFAULT_API_VERSION = "v1"
CONTROL_TIMEOUT = 600.0

_FINISH = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "RECITATION": "content_filter",
           "BLOCKLIST": "content_filter", "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
           "IMAGE_SAFETY": "content_filter", "LANGUAGE": "content_filter"}
_CONFIG_NAMES = {"temperature": "temperature", "top_p": "topP", "top_k": "topK", "max_tokens": "maxOutputTokens",
                 "max_completion_tokens": "maxOutputTokens", "seed": "seed", "presence_penalty": "presencePenalty",
                 "frequency_penalty": "frequencyPenalty", "candidate_count": "candidateCount"}
_THINKING_NAMES = {"thinking_budget": "thinkingBudget", "thinking_level": "thinkingLevel",
                   "include_thoughts": "includeThoughts"}
_ROLES = {"user": "user", "assistant": "model", "model": "model"}


def model_path(model: str) -> str:
    """`models/{model}` as the URL names it (a name already starting "models/" kept as it is)."""
    name = model if model.startswith(("models/", "tunedModels/")) else f"models/{model}"
    return quote(name, safe="/-._~")


def _generation_config(params: Mapping[str, object]) -> dict[str, object]:
    config: dict[str, object] = {}
    thinking: dict[str, object] = {}
    for key, value in params.items():
        if value is None:
            continue
        if key == "stop":
            config["stopSequences"] = [value] if isinstance(value, str) else list(value)  # type: ignore[call-overload]
        elif key in _THINKING_NAMES:
            thinking[_THINKING_NAMES[key]] = value
        else:
            config.setdefault(_CONFIG_NAMES.get(key, key), value)
    if thinking:
        config["thinkingConfig"] = thinking
    return config


def generate_body(messages: Sequence[Mapping[str, object]], params: Mapping[str, object]) -> dict[str, object]:
    """The generateContent request body for OpenAI-style messages and params
    (a message's PREFIX_END marker is not sent: Gemini caches implicitly)."""
    system = [str(m["content"]) for m in messages if m["role"] == "system"]
    contents = [{"role": _ROLES.get(str(m["role"]), str(m["role"])), "parts": [{"text": m["content"]}]}
                for m in messages if m["role"] != "system"]
    body: dict[str, object] = {"contents": contents}
    if system:
        body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}], "role": "user"}  # as the SDK sends it
    config = _generation_config(params)
    if config:
        body["generationConfig"] = config
    return body


class GeminiProvider(HttpProvider):
    kind = "gemini"
    default_base_url = DEFAULT_BASE_URL
    can_stream = True

    def __init__(self, spec: EndpointSpec, api_key: str | None = None):
        super().__init__(spec, api_key)
        self.api_version = opt_str(spec, "api_version") or DEFAULT_API_VERSION
        self._http = JsonHttpClient.for_endpoint(spec, api_key, auth={"x-goog-api-key": api_key or ""},
                                                 request_id_header="x-request-id", classify=gemini_status_error)
        self._drop = frozenset(opt_strings(spec, "drop_params"))
        self.caches_prompt_prefix = opt_bool(spec, "prompt_cache")
        self._stream_always = opt_bool(spec, "stream")

    def api_url(self, path: str, query: str = "") -> str:
        """`{base_url}/{api_version}/{path}`, `query` appended (after the base URL's own query, if any)."""
        url = self.url(f"/{self.api_version}/{path}")
        return f"{url}{'&' if '?' in url else '?'}{query}" if query else url

    def chat_body(self, messages: Sequence[Mapping[str, object]], params: Mapping[str, object]) -> dict[str, object]:
        """The generateContent body of a call (a direct call's, and a batch request's)."""
        if self._drop:
            params = {k: v for k, v in params.items() if k not in self._drop}
        return generate_body(messages, params)

    async def chat(self, model: str, messages: Sequence[Mapping[str, object]], *,
                   params: Mapping[str, object], timeout: float, stream: bool = False) -> ChatResult:
        body = self.chat_body(messages, params)
        if stream or self._stream_always:
            return await self._chat_streamed(model, body, timeout)
        data, _, latency = await self._http.post(self.api_url(f"{model_path(model)}:generateContent"), body, timeout)
        return self.chat_result(data, None, latency)

    async def _chat_streamed(self, model: str, body: dict[str, object], timeout: float) -> ChatResult:
        url = self.api_url(f"{model_path(model)}:streamGenerateContent", "alt=sse")
        parser = SSEParser()
        async with self._http.stream(url, body, timeout) as reply:
            start = reply.start

            def malformed(what: str) -> ProviderError:
                return bad_reply(self.spec.name, f"stream {what}", secret=self._api_key)

            stream = ResponseAssembler(malformed)
            async for piece in reply:
                arrived = perf_counter() - start
                for event in parser.feed(piece):
                    stream.feed(self._event_payload(event.data, malformed), arrived)
            latency = perf_counter() - start
            first_byte = reply.first_byte - start
        request_id = stream.response_id if isinstance(stream.response_id, str) and stream.response_id else None
        if not stream.ended:
            raise ProviderError(CONNECTION, f"{self.spec.name}: the stream ended before a finishReason after "
                                            f"{stream.events} events", request_id=request_id)
        result = self.chat_result(stream.assembled(), request_id, latency)
        times = stream.times
        result.timings = StreamTimings(ttft=times[0] if times else latency, chunk_times=tuple(times),
                                       first_byte=first_byte)
        return result

    def _event_payload(self, data: str, malformed: Callable[[str], ProviderError]) -> JSONObject:
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise malformed("event is not JSON") from None
        if not isinstance(payload, dict):
            raise malformed("event is not an object")
        if "error" in payload:
            raise gemini_stream_error(payload, endpoint=self.spec.name, secret=self._api_key)
        return payload

    def chat_result(self, data: Mapping[str, object], request_id: str | None, latency: float = 0.0) -> ChatResult:
        """The normalised result of a GenerateContentResponse (a direct reply,
        an assembled stream, or a batch's response)."""
        response_id = data.get("responseId")
        request_id = request_id or (response_id if isinstance(response_id, str) and response_id else None)

        def malformed(what: str) -> ProviderError:
            return bad_reply(self.spec.name, f"generateContent reply {what}", secret=self._api_key,
                             request_id=request_id)

        try:
            usage = _usage(data.get("usageMetadata"))
        except ValueError as exc:
            raise malformed(f"has {exc}") from None
        text, finish = _answer(data, malformed)
        prompt, cached, candidates, thoughts = usage
        if not text and (finish not in ("stop", "length", "content_filter") or finish == "stop" and candidates > 0):
            raise malformed(f"has no text (finishReason {finish!r}, {candidates} output tokens)")
        return ChatResult(text=text, finish_reason=finish, input_tokens=prompt, output_tokens=candidates + thoughts,
                          latency=latency, request_id=request_id, cache_read_tokens=min(cached, prompt))

    async def list_models(self) -> list[str]:
        """The model ids the key may call (`GET models`, every page), without the "models/" prefix."""
        names: list[str] = []
        token = ""
        for _ in range(100):  # pages of 1000: far more than Google serves
            query = "pageSize=1000" + (f"&pageToken={quote(token)}" if token else "")
            data = await self._http.request_json("GET", self.api_url("models", query), timeout=CONTROL_TIMEOUT)
            models = data.get("models")
            for item in models if isinstance(models, list) else []:
                name = item.get("name") if isinstance(item, dict) else None
                if isinstance(name, str):
                    names.append(name.removeprefix("models/"))
            next_token = data.get("nextPageToken")
            if not isinstance(next_token, str) or not next_token:
                break
            token = next_token
        return names


def _usage(usage: object) -> tuple[int, int, int, int]:
    """(prompt, cached, candidates, thoughts) token counts of a usageMetadata; ValueError if malformed."""
    return (token_count(usage, "promptTokenCount") or 0, token_count(usage, "cachedContentTokenCount") or 0,
            token_count(usage, "candidatesTokenCount") or 0, token_count(usage, "thoughtsTokenCount") or 0)


def _answer(data: Mapping[str, object], malformed: Callable[[str], ProviderError]) -> tuple[str, str]:
    """(text, finish reason) of candidate 0; a blocked prompt (no candidate) is an empty content_filter answer."""
    candidates = data.get("candidates")
    if not candidates:
        feedback = data.get("promptFeedback")
        if isinstance(feedback, dict) and feedback.get("blockReason"):
            return "", "content_filter"
        raise malformed("has no candidates")
    if not isinstance(candidates, list) or not isinstance(candidates[0], dict):
        raise malformed("has candidates that are not a list of objects")
    candidate = candidates[0]
    content = candidate.get("content") or {}
    parts = content.get("parts") if isinstance(content, dict) else None
    if parts is None:
        parts = []
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        raise malformed("has parts that are not a list of objects")
    texts = [p.get("text") for p in parts if "text" in p and not p.get("thought")]
    if not all(isinstance(t, str) for t in texts):
        raise malformed("has a text part whose text is not a string")
    reason = candidate.get("finishReason") or "unknown"
    if not isinstance(reason, str):
        raise malformed(f"has finishReason {reason!r}")
    return "".join(str(t) for t in texts), _FINISH.get(reason, reason.lower())
