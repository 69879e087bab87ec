"""`tulving run --temperature / --max-tokens` travel as request settings
(engine/requests.py `RequestSettings`), not as a changed config; and the one
reading of a call's output-token limit (`output_tokens_allowed`)."""
from __future__ import annotations

import dataclasses

from engine.benchmark.evaluation import answers as A
from engine.benchmark.evaluation import pipeline
from engine.benchmark.evaluation.questions import build_questions
from engine.benchmark.generation.published import load_book
from engine.config import Config
from engine.requests import UNLIMITED_OUTPUT_TOKENS, ChatRequest, RequestSettings, output_tokens_allowed
from engine.resolve import resolve_many


def _config() -> Config:
    return Config.from_dicts({"api": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}},
                             {"m": {"endpoint": "api", "model": "m-1", "params": {"temperature": 1.0, "max_tokens": 64}}})


def test_settings_fill_what_a_request_leaves_unset_and_keep_what_it_sets():
    settings = RequestSettings(temperature=0.0, max_tokens=7)
    plain = ChatRequest(model="m", messages=[{"role": "user", "content": "q"}])
    assert settings.apply(plain) == dataclasses.replace(plain, temperature=0.0, max_tokens=7)
    own = dataclasses.replace(plain, max_tokens=3)
    assert settings.apply(own).max_tokens == 3 and settings.apply(own).temperature == 0.0
    assert RequestSettings().apply(plain) is plain


def test_a_setting_on_the_request_is_the_same_call_as_the_alias_carrying_it():
    """Same wire parameters, same cache key: a rerun of a run made when
    --max-tokens changed the alias finds its answers."""
    config = _config()
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "q"}])
    [by_settings] = resolve_many(config, [RequestSettings(temperature=0.0, max_tokens=7).apply(request)])
    changed = _config()
    alias = changed.models["m"]
    changed.models["m"] = dataclasses.replace(alias, params={**alias.params, "temperature": 0.0, "max_tokens": 7})
    [by_alias] = resolve_many(changed, [request])
    assert by_settings.params == by_alias.params == {"temperature": 0.0, "max_tokens": 7}
    assert by_settings.key == by_alias.key
    assert config.models["m"].params == {"temperature": 1.0, "max_tokens": 64}  # the config is left as it was


def test_planned_jobs_carry_the_settings_to_every_answer_request():
    book = load_book("synaptic-echoes-short")
    questions = build_questions(book)[:3]
    settings = RequestSettings(max_tokens=5)
    [job] = pipeline.plan_jobs(questions, ["m"], [A.IN_CONTEXT], settings=settings)
    requests = list(A.answer_requests(job.questions, model=job.model, mode=job.mode, book=book,
                                      settings=job.settings))
    assert len(requests) == 3 and all(r.max_tokens == 5 and r.temperature is None for r in requests)


def test_one_reading_of_the_output_token_limit():
    assert output_tokens_allowed({"max_tokens": 12}) == 12
    assert output_tokens_allowed({"max_completion_tokens": 34}) == 34
    assert output_tokens_allowed({}) == UNLIMITED_OUTPUT_TOKENS == 4096
