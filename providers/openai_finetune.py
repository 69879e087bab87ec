"""Submit an OpenAI fine-tuning job and wait for it (a control-plane call).

Rare and slow, so the official SDK earns its CPU cost here (multipart upload,
typed job objects); it runs with `max_retries=0` like every provider call, and
its exceptions are classified into `providers.base` error kinds.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from providers.base import BAD_REPLY, BAD_REQUEST, CONFIG, CONNECTION, TIMEOUT, ProviderError
from providers.http_errors import redact, status_error

_FINAL = {"succeeded", "failed", "cancelled"}


def _classify(exc: Exception, api_key: str | None, timeout: float) -> ProviderError:
    import openai

    if isinstance(exc, openai.APIStatusError):
        return status_error(exc.status_code, exc.response.content, exc.response.headers, endpoint="fine-tune",
                            secret=api_key, request_id=exc.request_id)
    if isinstance(exc, openai.APITimeoutError):
        return ProviderError(TIMEOUT, f"fine-tune: no reply within {timeout:g} s")
    if isinstance(exc, openai.APIConnectionError):
        return ProviderError(CONNECTION, redact(f"fine-tune: {exc}", api_key))
    return ProviderError(BAD_REPLY, redact(f"fine-tune: {type(exc).__name__}: {exc}", api_key))


async def submit_finetune(*, base_url: str, api_key: str, training_file: Path, model: str,
                          suffix: str | None = None, hyperparameters: dict[str, Any] | None = None,
                          poll_interval: float = 30.0,
                          timeout: float = 24 * 3600.0) -> dict[str, Any]:
    """Upload `training_file` (chat JSONL), fine-tune `model` on it and poll
    every `poll_interval` s until the job ends or `timeout` s have passed.

    Returns {"job_id", "status", "fine_tuned_model", "training_file"} for a
    succeeded or cancelled job; a failed job raises ProviderError with the
    job's own error message.
    """
    import openai

    training_file = Path(training_file)
    if not training_file.is_file():
        raise ProviderError(CONFIG, f"fine-tune: training file {training_file} not found")
    deadline = time.monotonic() + timeout
    request_timeout = min(timeout, 600.0)
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=request_timeout)
    try:
        try:
            with training_file.open("rb") as handle:
                uploaded = await client.files.create(file=(training_file.name, handle), purpose="fine-tune")
            create: dict[str, Any] = {"model": model, "training_file": uploaded.id}
            if suffix:
                create["suffix"] = suffix
            if hyperparameters:  # the supervised method's settings (the API's current form)
                create["method"] = {"type": "supervised", "supervised": {"hyperparameters": dict(hyperparameters)}}
            job = await client.fine_tuning.jobs.create(**create)
            while job.status not in _FINAL:
                if time.monotonic() + poll_interval > deadline:
                    raise ProviderError(TIMEOUT, f"fine-tune: job {job.id} still {job.status} after {timeout:g} s")
                await asyncio.sleep(poll_interval)
                job = await client.fine_tuning.jobs.retrieve(job.id)
        except openai.OpenAIError as exc:
            raise _classify(exc, api_key, request_timeout) from None
    finally:
        await client.close()
    if job.status == "failed":
        error = job.error
        message = (error.message if error is not None and error.message else "no reason given")
        code = f" [{error.code}]" if error is not None and error.code else ""
        raise ProviderError(BAD_REQUEST, redact(f"fine-tune: job {job.id} failed: {message}{code}", api_key))
    return {"job_id": job.id, "status": job.status, "fine_tuned_model": job.fine_tuned_model,
            "training_file": uploaded.id}
