"""Azure OpenAI (kind "azure-openai"): the OpenAI chat format served at a
resource's v1 API, `https://{resource}.openai.azure.com/openai/v1/`, keyed by
the `api-key` header; `model` names a deployment.

The v1 API (generally available since August 2025) takes no `api-version`
query parameter and the OpenAI paths (`/chat/completions`, `/embeddings`);
checked 2026-11-26 in learn.microsoft.com/azure/foundry/openai/api-version-lifecycle.
Only the header carrying the key differs from OpenAIProvider; the body and the
reply are OpenAI's.
"""
from __future__ import annotations

from providers.base import CONFIG, EndpointSpec, ProviderError
from providers.openai_http import OpenAIProvider


class AzureOpenAIProvider(OpenAIProvider):
    kind = "azure-openai"
    default_base_url = ""  # none: every resource has its own host

    def __init__(self, spec: EndpointSpec, api_key: str | None = None):
        if not spec.base_url:
            raise ProviderError(CONFIG, f"endpoint {spec.name!r}: an azure-openai endpoint needs base_url "
                                        f"(https://RESOURCE.openai.azure.com/openai/v1)")
        super().__init__(spec, api_key)

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        return {"api-key": api_key or ""}
