"""Chapter prompts, checks, the builtin writer and chapter generation through
the real engine (builtin provider and the loopback HTTP server)."""
from __future__ import annotations

import pytest

from engine.benchmark.builtin import writer as builtin_writer
from engine.benchmark.generation.chapters import ChapterGenerator
from engine.benchmark.generation.checks import exact_check, parse_llm_check
from engine.benchmark.generation.events import sample_events, sample_meta_events
from engine.benchmark.generation.prompts import CHECKER_SYSTEM_PROMPT, chapter_messages, verification_messages
from engine.benchmark.generation.stats import iteration_table
from engine.benchmark.generation.universe import load_universe
from engine.config import Config
from engine.loopback.server import LoopbackServer
from engine.scheduler import Engine

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["writer-http"]

# The reference's template (epbench/src/generation/prompts.py, complete_prompt_func) filled
# by hand for event 0 / meta-event 0: one opening line, "paragraphs", trailing newline
# (protocol.md, Chapters); content and detail lower-cased, 4th restriction.
EXPECTED_EVENT0 = """Write a detailed novel excerpt in a thriller style about Ezra Edwards attending a parkour workshop. \
The story takes place on September 13, 2025, at Bethpage Black Course, where Ezra Edwards demonstrated cat leaps. \
Follow these guidelines:

Structure and Information Reveal:
1. Divide the text into 7 paragraphs. Number each paragraph (1), (2), etc., while maintaining novel-appropriate paragraph lengths.
2. Gradually reveal key information:
- Full location 'Bethpage Black Course': must appear verbatim in paragraph 2 only and nowhere else in the text
- Full date 'September 13, 2025': must appear verbatim in paragraph 7 only and nowhere else in the text
- Full name 'Ezra Edwards': must appear verbatim in paragraph 2 only and nowhere else in the text
- Full detail that 'Ezra demonstrated cat leaps': must appear verbatim in paragraph 2 and nowhere else in the text
3. Subtly distribute details about location, date, main character, and event across all paragraphs.

Content and Setting:
1. Focus on Ezra's experiences, observations, and interactions during the parkour workshop.
2. Vividly describe surroundings, atmosphere, and Ezra's emotions.
3. Include the detail that Ezra demonstrated cat leaps.
4. Limit the timeframe to a single day and confine all action to Bethpage Black Course.

Characters:
1. Refer to other characters as $entity_X (where X is a number).
2. Omit background information about Ezra and other characters.

Style and Tone:
1. Use vivid, sensory details to bring the scene to life.
2. Incorporate elements of the thriller style, including excitement, danger, anticipation.
3. Maintain a consistent narrative voice throughout the excerpt.

Restrictions:
1. Only mention Bethpage Black Course and September 13, 2025; avoid other locations or dates.
2. Exclude explicit introductions, conclusions, or character backgrounds.
3. Focus exclusively on the events of this particular parkour workshop.
4. Do not use a too common starting sentence.

Craft a seamless narrative that gradually reveals information while maintaining reader engagement throughout the excerpt.
"""

EXPECTED_SYSTEM = ("You are a creative fiction writer specializing in detailed, atmospheric novel excerpts. "
                   "Your task is to generate vivid, immersive scenes based on specific prompts.")


@pytest.fixture(scope="module")
def universe():
    return load_universe("default")


@pytest.fixture(scope="module")
def events(universe):
    return sample_events(universe, 30), sample_meta_events(universe, 30)


def _prompt(universe, events, i, name="default"):
    evs, metas = events
    return chapter_messages(evs[i], metas[i], universe.spec.styles[metas[i]["style"]], name)


def test_chapter_prompt_of_event_0_is_the_papers_template(universe, events):
    system, user = _prompt(universe, events, 0)
    assert system == {"role": "system", "content": EXPECTED_SYSTEM}
    assert user["role"] == "user"
    assert user["content"] == EXPECTED_EVENT0


def test_single_paragraph_prompt(universe, events):
    user = _prompt(universe, events, 2)[1]["content"]  # event 2 has one paragraph
    assert ("\n1. Write a single paragraph. Number (1) before this single paragraph, while maintaining "
            "novel-appropriate paragraph lengths.\n") in user
    assert "Divide the text" not in user
    assert "Full detail that 'Henry explained post-processing techniques'" in user


def test_news_and_scifi_prompts():
    for name, opening in (("news", "Write a detailed news excerpt in a news style about "),
                          ("scifi", "Write a detailed scifi excerpt in a scifi style about ")):
        u = load_universe(name)
        ev, meta = sample_events(u, 1)[0], sample_meta_events(u, 1)[0]
        user = chapter_messages(ev, meta, u.spec.styles[meta["style"]], name)[1]["content"]
        assert user.startswith(opening + f"{ev['entity']} witnessing a {ev['content']}.")
        assert f"where {ev['entity']} witnessed a {ev['content']}." in user
        assert "4. Do not use a too common starting sentence." in user
        if name == "news":
            assert "news-appropriate paragraph lengths" in user
            assert "3. Maintain a consistent news voice throughout the excerpt." in user
            assert "\n5. Do not put any title\n" in user
            assert user.endswith("Craft a seamless news that gradually reveals information while "
                                 "maintaining reader engagement throughout the excerpt.\n")
        else:
            assert "5. Do not put any title" not in user


def test_verification_prompt_is_the_reference_string():
    system, user = verification_messages("(1) Some chapter.\n\n(2) More.")
    assert system["content"] == CHECKER_SYSTEM_PROMPT
    assert CHECKER_SYSTEM_PROMPT.startswith("You are a content checker AI. Your tasks:\n1. Read the given text")
    # the body is indented by 4 spaces: only the chapter's first line is
    assert "\n\n    [TEXT START]\n    (1) Some chapter.\n\n(2) More.\n    [TEXT END]\n" in user["content"]
    assert "    4. Does the following text has a single main event happening at that location that day " \
           "(further cut into the events of the day)?" in user["content"]
    assert user["content"].endswith('    {\n        "1": [boolean],\n        "2": [boolean],\n'
                                    '        "3": [boolean],\n        "4": [boolean]\n    }\n    ')


@pytest.mark.parametrize("reply, passed", [
    ('{"1": true, "2": true, "3": true, "4": true}', True),
    ('Here you go:\n```json\n{\n "1": true,\n "2": true,\n "3": true,\n "4": true\n}\n```', True),
    ('{"1": True, "2": True, "3": True, "4": True}', True),
    ('{"1": true, "2": false, "3": true, "4": true}', False),
    ('{"1": true, "2": true, "3": true}', False),
    ('{"1": true, "2": true, "3": true, "4": "yes"}', False),
    ('{"1": true, "2": true, "3": true, "4": true, "5": true}', False),
    ("All true.", False),
])
def test_llm_check_reply_parsing(reply, passed):
    assert parse_llm_check(reply)[0] is passed


def test_builtin_writer_obeys_the_prompt_and_answers_honestly(universe, events):
    evs, metas = events
    for i in range(30):
        messages = _prompt(universe, events, i)
        text = builtin_writer.respond(messages, {"seed": 0, "flaw_rate": 0.0})
        assert exact_check(text, evs[i], metas[i]) is None, i
        assert "$entity_1" in text
        assert builtin_writer.respond(messages, {"seed": 0, "flaw_rate": 0.0}) == text  # deterministic
        verdict = builtin_writer.respond(verification_messages(text), {})
        assert parse_llm_check(verdict) == (True, None)
    # every candidate flawed: each fails either the exact checks or the LLM check
    kinds = set()
    for i in range(30):
        for draw in range(3):
            text = builtin_writer.respond(_prompt(universe, events, i), {"seed": draw, "flaw_rate": 1.0})
            problem = exact_check(text, evs[i], metas[i])
            if problem is None:
                passed, problem = parse_llm_check(builtin_writer.respond(verification_messages(text), {}))
                assert not passed
                kinds.add("llm")
            else:
                kinds.add("exact")
    assert kinds == {"exact", "llm"}


def _config(flaw_rate: float | None = None, **endpoint) -> Config:
    params = {"temperature": 1.0, "max_tokens": 4096}
    if flaw_rate is not None:
        params["flaw_rate"] = flaw_rate
    endpoints = {"builtin": {"kind": "builtin", "max_concurrency": 64, "max_attempts": 1}}
    models = {"writer": {"endpoint": "builtin", "model": "writer", "params": params}}
    if endpoint:
        endpoints["loop"] = endpoint
        models["loop-writer"] = {"endpoint": "loop", "model": "writer-http", "params": params}
    return Config.from_dicts(endpoints, models)


async def _generate(config, events, universe, cache, model="writer", **options):
    evs, metas = events
    async with Engine(config, cache_path=str(cache) if cache else None) as engine:
        return await ChapterGenerator(engine, evs, metas, universe.spec.styles, model=model, **options).run()


async def test_generation_retries_logs_and_replays_from_cache(tmp_path, universe, events):
    config = _config(flaw_rate=0.5)
    cache = tmp_path / "cache.sqlite"
    run = await _generate(config, events, universe, cache)
    outcomes = {r["outcome"] for r in run.log}
    assert {"valid", "failed_exact", "failed_llm"} <= outcomes
    assert run.cache_hits == 0 and run.calls > 30
    # every event: a chapter, or itermax failed candidates
    for i in range(30):
        records = [r for r in run.log if r["event"] == i]
        assert [r["draw"] for r in records] == list(range(len(records)))
        if i in run.valid:
            assert records[-1]["outcome"] == "valid" and run.valid[i][0] == records[-1]["draw"]
            assert all(r["outcome"] != "valid" for r in records[:-1])
        else:
            assert i in run.failed_events and len(records) == 10
        assert all(r["reason"] for r in records if r["outcome"] != "valid")
    evs, metas = events
    for i, (_draw, text) in run.valid.items():
        assert exact_check(text, evs[i], metas[i]) is None
    table = iteration_table(run.log, 30)
    assert table[0]["remaining"] == 30
    assert table[-1]["valid_so_far"] == len(run.valid)
    for prev, row in zip(table, table[1:]):
        assert row["remaining"] == 30 - prev["valid_so_far"]
    # rerun: identical result, zero calls
    again = await _generate(config, events, universe, cache)
    assert again.calls == 0 and again.cache_hits == run.calls
    assert again.valid == run.valid and again.log == run.log


async def test_itermax_drops_events(tmp_path, universe, events):
    run = await _generate(_config(flaw_rate=0.9), events, universe, tmp_path / "c.sqlite", itermax=1)
    assert run.failed_events and len(run.valid) + len(run.failed_events) == 30
    assert all(r["draw"] == 0 for r in run.log)


async def test_generation_over_http_loopback(tmp_path, universe, events):
    def reply(api, body):
        return builtin_writer.respond(body["messages"], body)

    async with LoopbackServer(in_process=True, models=SERVED, reply=reply) as server:
        config = _config(flaw_rate=0.3, kind="openai", base_url=server.openai_base_url, max_concurrency=16)
        run = await _generate(config, events, universe, tmp_path / "c.sqlite", model="loop-writer",
                              seed_draws=True)
        sent = server.stats.by_path["/v1/chat/completions"]
        assert sent == run.calls == len(run.log) + sum(1 for r in run.log if r["outcome"] != "failed_exact")
        assert len(run.valid) >= 25
        server.stats.by_path.clear()
        again = await _generate(config, events, universe, tmp_path / "c.sqlite", model="loop-writer",
                                seed_draws=True)
        assert server.stats.by_path["/v1/chat/completions"] == 0 and again.valid == run.valid


async def test_fatal_errors_stop_the_run(tmp_path, universe, events, monkeypatch):
    monkeypatch.delenv("TULVING_TEST_KEY", raising=False)
    config = _config(kind="openai", base_url="http://127.0.0.1:9/v1", key_env="TULVING_TEST_KEY")
    with pytest.raises(Exception) as info:
        await _generate(config, events, universe, None, model="loop-writer")
    assert "TULVING_TEST_KEY" in str(info.value)


async def test_a_larger_book_reuses_the_smaller_books_chapters(tmp_path, universe, events):
    config = _config()
    cache = tmp_path / "cache.sqlite"
    evs, metas = events
    small = await _generate(config, (evs[:12], metas[:12]), universe, cache)
    large = await _generate(config, events, universe, cache)
    assert large.cache_hits == small.calls
    assert {i: v for i, v in large.valid.items() if i < 12} == small.valid
    assert large.log[:len(small.log)] == small.log


async def test_realism_rating_through_the_engine(tmp_path):
    from engine.benchmark.generation import load_book
    from engine.benchmark.generation.derived import parse_realism, rate_realism

    book = load_book("synaptic-echoes-short")
    async with Engine(_config(), cache_path=str(tmp_path / "c.sqlite")) as engine:
        rows = await rate_realism(engine, book, "writer")
    assert [r["chapter"] for r in rows] == list(range(1, 20))
    assert all(r["realism"] in (1, 2, 3, 4, 5) for r in rows)
    assert parse_realism('Sure: {"realism": 4, "reason": "plausible"}') == 4
    assert parse_realism('{"realism": 9}') is None and parse_realism("four") is None


async def test_a_refused_key_stops_generation_with_one_clear_error(tmp_path, universe, events, monkeypatch):
    from engine.benchmark.generation.chapters import GenerationError

    monkeypatch.setenv("TULVING_TEST_KEY", "sk-wrong-key-123")
    async with LoopbackServer(in_process=True, models=SERVED, api_keys=["sk-right"]) as server:
        config = _config(kind="openai", base_url=server.openai_base_url, key_env="TULVING_TEST_KEY")
        with pytest.raises(GenerationError) as info:
            await _generate(config, events, universe, tmp_path / "c.sqlite", model="loop-writer")
    message = str(info.value)
    assert message.startswith("generation with loop-writer stopped: auth") and "\n" not in message
    assert "sk-wrong-key-123" not in message
