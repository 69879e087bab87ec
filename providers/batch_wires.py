"""Which endpoints have a batch API, and the batch wire of each
(providers/openai_batch.py, providers/anthropic_batch.py)."""
from __future__ import annotations

from providers.anthropic_batch import AnthropicBatchApi
from providers.base import CONFIG, EndpointSpec, ProviderError
from providers.batch_api import BatchApi
from providers.openai_batch import OpenAIBatchApi

BATCH_KINDS = ("openai", "anthropic")


def make_batch_api(spec: EndpointSpec, api_key: str | None) -> BatchApi:
    """The batch API of an endpoint of kind openai or anthropic."""
    if spec.kind == "openai":
        return OpenAIBatchApi(spec, api_key)
    if spec.kind == "anthropic":
        return AnthropicBatchApi(spec, api_key)
    raise ProviderError(CONFIG, f"endpoint {spec.name!r}: kind {spec.kind!r} has no batch API")


def batch_capable(spec: EndpointSpec) -> bool:
    """Whether `--batch` sends this endpoint's chat calls by batch: kinds
    openai and anthropic, unless the endpoint sets `options.batch = false`
    (an OpenAI-compatible server without the Batch API)."""
    return spec.kind in BATCH_KINDS and spec.options.get("batch", True) is not False
