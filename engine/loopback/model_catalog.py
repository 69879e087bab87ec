"""The models the loopback serves, and the parameter rules the real APIs
enforce per model (checked 2026-11-26 against OpenAI's error bodies as the
openai SDK documents them and Anthropic's errors page).

- The loopback serves the current (not retired) ids of the aliases every
  built-in kind ships (providers/standard_kinds.py, embedding models
  included), plus the ids `LoopbackServer(models=...)` / `serve-loopback
  --models` add. Any other id, made up or retired, is answered as the API
  answers it (as a vLLM server refuses all but the model it started with):
  OpenAI 404 `model_not_found` "The model `X` does not exist or you do not
  have access to it.", Anthropic 404 `not_found_error` "model: X".
- OpenAI models that take `max_completion_tokens` (gpt-4.1, gpt-5 onwards,
  o-series) refuse `max_tokens` (400 unsupported_parameter); reasoning models
  (o-series) and gpt-5 onwards refuse a temperature other than 1 (400
  unsupported_value); GPT-6 models, which reason unless `reasoning_effort` is
  "none", refuse `temperature` and `top_p` at any value ("When reasoning
  effort is not none, remove temperature, top_p": OpenAI's deployment
  checklist, checked 2026-11-28).
- Anthropic: API version 2026-10-21 removed `temperature`, `top_p` and
  `top_k` (400 "temperature: Extra inputs are not permitted", even at their
  defaults); Claude 5 models refuse non-default values on any version
  (Anthropic's versioning page and model pages, checked 2026-11-28).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from engine.loopback.errors import _Reject
from providers import standard_kinds
from providers.kinds import ProviderKind
from providers.models_common import inferred_settings

_FIXED_TEMPERATURE = re.compile(r"gpt-(?:[5-9]|\d\d)|o[134](?:$|[-.])")
_NO_SAMPLING_OPENAI = re.compile(r"gpt-(?:[6-9]|\d\d)")
_CLAUDE_5 = re.compile(r"claude-(?:opus|sonnet|haiku|fable|mythos)-5")
SAMPLING = ("temperature", "top_p", "top_k")
SAMPLING_FREE_VERSION = "2026-10-21"  # the first anthropic-version without sampling parameters
_BUILTIN_KINDS = [k for k in vars(standard_kinds).values() if isinstance(k, ProviderKind)]
REGISTRY_CURRENT = frozenset(str(t["model"]) for kind in _BUILTIN_KINDS for t in kind.default_models.values()
                             if "model" in t and not t.get("retired"))


class ModelCatalog:
    """`models`: the ids served besides the registry's current ones (an id
    listed here is served even if the registry retired it)."""

    def __init__(self, models: Iterable[str] | None = None):
        self.extra = frozenset(models or ())

    def serves(self, model: str) -> bool:
        return model in self.extra or model in REGISTRY_CURRENT

    def listing(self, api: str) -> dict[str, object]:
        """The GET /v1/models reply: the registry's current ids and the catalog's own."""
        ids = sorted(REGISTRY_CURRENT | self.extra)
        if api == "openai":
            return {"object": "list", "data": [{"id": i, "object": "model", "created": 0, "owned_by": "tulving"}
                                               for i in ids]}
        data = [{"type": "model", "id": i, "display_name": i, "created_at": "2026-01-01T00:00:00Z"} for i in ids]
        return {"data": data, "has_more": False, "first_id": ids[0] if ids else None,
                "last_id": ids[-1] if ids else None}

    def check(self, api: str, path: str, body: Mapping[str, object], version: str | None = None) -> None:
        """Raise the real API's error for a model it does not serve, or a
        parameter that model (or the anthropic-version `version`) refuses."""
        model = str(body["model"])
        if not self.serves(model):
            if api == "openai":
                raise _Reject(404, f"The model `{model}` does not exist or you do not have access to it.",
                              code="model_not_found")
            raise _Reject(404, f"model: {model}")
        if api == "openai" and path == "/v1/chat/completions":
            _check_openai_params(model, body)
        if api == "anthropic" and path == "/v1/messages":
            check_anthropic_sampling(model, body, version)


def check_anthropic_sampling(model: str, params: Mapping[str, object], version: str | None, where: str = "") -> None:
    """The 400 of a sampling parameter the anthropic-version or the model refuses."""
    sent = [name for name in SAMPLING if name in params]
    if not sent:
        return
    if version is not None and version >= SAMPLING_FREE_VERSION:
        raise _Reject(400, f"{where}{sent[0]}: Extra inputs are not permitted")
    default = {"temperature": 1, "top_p": None, "top_k": None}
    if _CLAUDE_5.match(model) and any(params[name] != default[name] for name in sent):
        raise _Reject(400, f"`{sent[0]}` is deprecated for this model.")


def _check_openai_params(model: str, body: Mapping[str, object]) -> None:
    settings = inferred_settings("openai", model)
    if settings and "max_tokens" in body:
        raise _Reject(400, "Unsupported parameter: 'max_tokens' is not supported with this model. "
                           "Use 'max_completion_tokens' instead.", code="unsupported_parameter", param="max_tokens")
    temperature = body.get("temperature")
    if _NO_SAMPLING_OPENAI.match(model):  # GPT-6: sampling only without reasoning
        for name in ("temperature", "top_p"):
            if name in body and body.get("reasoning_effort") != "none":
                raise _Reject(400, f"Unsupported parameter: '{name}' is not supported with this model.",
                              code="unsupported_parameter", param=name)
        return
    if _FIXED_TEMPERATURE.match(model) and temperature is not None and temperature != 1:
        raise _Reject(400, f"Unsupported value: 'temperature' does not support {temperature} with this model. "
                           f"Only the default (1) value is supported.", code="unsupported_value",
                      param="temperature")
