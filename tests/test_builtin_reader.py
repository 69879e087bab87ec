"""builtin:reader answers from the context it is given, by lexical matching only.

The expected answers come from the published ground truth (chapters.json),
never from the reader itself.
"""
from __future__ import annotations

import json
import tracemalloc

import pytest

from engine.benchmark.builtin import reader as builtin_reader
from engine.benchmark.builtin.reader import NO_MATCH, parse_question, respond
from engine.benchmark.datadir import published_book_dir
from engine.benchmark.evaluation.answers import in_context_prompt, messages, rag_prompt
from engine.benchmark.evaluation.rag import paragraph_chunks
from engine.benchmark.evaluation.templates import TEMPLATES


@pytest.fixture(scope="module")
def long_book():
    folder = published_book_dir("synaptic-echoes")
    return (folder / "book.txt").read_text(), json.loads((folder / "chapters.json").read_text())


def ask(context_prompt: str) -> str:
    return respond(messages(context_prompt), {"temperature": 1.0})


def by_entity(chapters, name):
    return [c for c in chapters if c["entity"] == name]


def test_parses_every_template_back():
    values = ("May 07, 2024", "Central Park", "Jackson Ramos", "Flash Mob")
    for template in TEMPLATES:
        question, _ = template.fill(*values)
        parsed = parse_question(question)
        assert parsed is not None, template.text
        assert parsed.trace == template.retrieval_type and parsed.get == template.get
        fixed = dict(zip(("date", "location", "entity", "content"), values))
        expected = {k: v for k, v, on in zip(fixed, fixed.values(), template.fixed) if on}
        assert parsed.cue == expected


def test_dates_of_an_entity_in_context(long_book):
    text, chapters = long_book
    name = "Jackson Ramos"
    truth = by_entity(chapters, name)
    assert len(truth) >= 3  # a cue matching several chapters
    question = TEMPLATES[6].fill("", "", name, "")[0]
    answer = ask(in_context_prompt(text, question))
    for chapter in truth:
        assert chapter["date"] in answer
    assert answer.count(", 20") == len(truth)  # one date per matching chapter, no extra


def test_chronological_and_latest_follow_story_time(long_book):
    text, chapters = long_book
    name = "Jackson Ramos"
    from datetime import datetime

    ordered = sorted(by_entity(chapters, name), key=lambda c: datetime.strptime(c["date"], "%B %d, %Y"))
    chrono = ask(in_context_prompt(text, TEMPLATES[33].fill("", "", name, "")[0]))
    positions = [chrono.index(c["date"]) for c in ordered]
    assert positions == sorted(positions)
    latest = ask(in_context_prompt(text, TEMPLATES[30].fill("", "", name, "")[0]))
    assert latest == ordered[-1]["date"]


def test_protagonists_at_a_location(long_book):
    text, chapters = long_book
    location = chapters[0]["location"]
    truth = {c["entity"] for c in chapters if c["location"] == location}
    answer = ask(in_context_prompt(text, TEMPLATES[4].fill("", location, "", "")[0]))
    # One protagonist per matching chapter; lexically picked, so most (not
    # all) are right: the reader is a baseline, not an oracle.
    matching = [c for c in chapters if c["location"] == location]
    assert len(answer.split(", ")) <= len(matching) and len(truth) >= 5
    assert sum(name in answer for name in truth) >= 0.7 * len(truth)


def test_no_matching_event_says_so(long_book):
    text, _ = long_book
    question = TEMPLATES[0].fill("February 30, 2031", "", "", "")[0]
    assert ask(in_context_prompt(text, question)) == NO_MATCH


def test_other_entities_of_one_event(long_book):
    text, chapters = long_book
    c = chapters[0]
    question = TEMPLATES[28].fill(c["date"], c["location"], c["entity"], c["content"])[0]
    answer = ask(in_context_prompt(text, question))
    for other in c["secondary_entities"]:
        assert other in answer
    assert c["entity"] not in answer


def test_reads_only_the_retrieved_chunks(long_book):
    text, chapters = long_book
    c = chapters[0]
    paragraphs = [p for p in paragraph_chunks(text) if p.startswith("Chapter 1, ")]
    question = TEMPLATES[30].fill("", "", c["entity"], "")[0]  # latest date of the entity
    with_date = rag_prompt(paragraphs, question)
    assert ask(with_date) == c["date"]
    date_paragraph = f"Chapter 1, Paragraph {c['paragraph_of']['date']}\n\n"
    without = rag_prompt([p for p in paragraphs if not p.startswith(date_paragraph)], question)
    assert c["date"] not in ask(without)  # the date is only in its own paragraph


def test_finetuned_prompt_without_context_knows_nothing():
    from engine.benchmark.evaluation.answers import finetuned_prompt

    question = TEMPLATES[6].fill("", "", "Ezra Edwards", "")[0]
    assert ask(finetuned_prompt(question)) == NO_MATCH


def test_knows_no_universe_list():
    source = open(builtin_reader.__file__).read()
    assert "universe" not in source.split('"""', 2)[2].lower()  # code after the docstring


def test_events_kept_for_every_question_are_those_matching_each_event_alone(long_book):
    """The reader splits a context once and reuses it for the next questions
    (by its text): the events it keeps for each question of the book, in
    context and over retrieved paragraphs, are exactly those the per-event
    test `matches` accepts on a fresh split of that context."""
    from engine.benchmark.evaluation.questions import build_questions
    from engine.benchmark.generation.published import load_book

    book_text, _ = long_book
    paragraphs = paragraph_chunks(book_text)
    questions = build_questions(load_book("synaptic-echoes"))[::7]
    assert len(questions) > 50
    for n, q in enumerate(questions):
        prompt = in_context_prompt(book_text, q.question) if n % 2 else rag_prompt(paragraphs[n:n + 60], q.question)
        context, question = builtin_reader.split_prompt(prompt)
        assert question == q.question and context is not None
        parsed = parse_question(question)
        assert parsed is not None
        fresh = [e for e in builtin_reader.split_events(context) if builtin_reader.matches(e, parsed.cue)]
        assert builtin_reader._parsed(context).matching(parsed.cue) == fresh, q.question


def test_a_prompt_without_question_heading_has_no_context():
    context, question = builtin_reader.split_prompt("## The Text to Memorize:\n\nsome text")
    assert (context, question) == ("", "some text")


def test_threads_asking_about_one_book_at_once_parse_it_once_and_answer_as_alone(long_book):
    """The book in each prompt is compared in place with the latest contexts
    (no copy per question), and parsed once however many threads ask at once."""
    from concurrent.futures import ThreadPoolExecutor

    from engine.benchmark.evaluation.questions import build_questions
    from engine.benchmark.generation.published import load_book

    book_text, _ = long_book
    questions = [q.question for q in build_questions(load_book("synaptic-echoes"))[::31]][:8]
    prompts = [in_context_prompt(book_text + "\n", q) for q in questions]  # a book no earlier test parsed
    builtin_reader._parsed.cache_clear()
    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(ask, prompts))
    assert builtin_reader._parsed.cache_info().misses == 1
    alone = [builtin_reader.answer(*builtin_reader.split_prompt(p)) for p in prompts]
    assert replies == alone and len(set(replies)) > 1
    tracemalloc.start()
    try:
        ask(in_context_prompt(book_text + "\n", questions[0]))  # (the prompt itself is built before the reset)
        tracemalloc.reset_peak()
        prompt = in_context_prompt(book_text + "\n", questions[1])
        built = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        ask(prompt)
        most = tracemalloc.get_traced_memory()[1] - built
    finally:
        tracemalloc.stop()
    assert most < len(book_text) // 2, (most, len(book_text))


# -- JSON mode: the offline stand-in for a memory system's extraction LLM ------------

JSON_OBJECT = {"temperature": 0.1, "response_format": {"type": "json_object"}}


def additive_extraction_prompt(new_messages: str, earlier: str) -> str:
    """A user prompt laid out as mem0 2.x's generate_additive_extraction_prompt lays it out."""
    return "\n\n".join([
        "## Summary\n", f'## Last k Messages\n[{{"role": "user", "content": "{earlier}"}}]',
        "## Recently Extracted Memories\n[]", f'## Existing Memories\n[{{"id": "0", "text": "{earlier}"}}]',
        f"## New Messages\n{new_messages}", "## Observation Date\n2026-11-28", "## Current Date\n2026-11-28",
        "# Output:"])


def test_json_mode_extracts_the_new_messages_sentences_verbatim_as_add_memories():
    from engine.benchmark.generation.published import load_book

    paragraphs = [p for p in load_book("synaptic-echoes-short").chapter_texts[0].split("\n") if p.strip()][:3]
    earlier = "Mara Ledbetter sang at the harbour."
    new = "".join(f"user: {p}\n" for p in paragraphs)
    reply = respond([{"role": "system", "content": "You are a Memory Extractor. Return JSON."},
                     {"role": "user", "content": additive_extraction_prompt(new, earlier)}], JSON_OBJECT)
    memories = json.loads(reply)["memory"]
    assert [m["id"] for m in memories] == [str(n) for n in range(len(memories))]
    assert all(m["attributed_to"] == "user" and set(m) == {"id", "text", "attributed_to"} for m in memories)
    texts = [m["text"] for m in memories]
    # Verbatim, in order, nothing left out, nothing from the other sections.
    assert " ".join(texts) == " ".join(" ".join(p.split()) for p in paragraphs)
    assert not any("Mara Ledbetter sang" in t or "user:" in t for t in texts)
    assert all(len(t.split()) >= 15 for t in texts[:-1]) and len(texts) > len(paragraphs)
    # Without response_format the same prompt is an ordinary (non-JSON) question.
    plain = respond([{"role": "user", "content": additive_extraction_prompt(new, earlier)}], {"temperature": 0.1})
    assert not plain.startswith("{")


def test_json_mode_answers_mem0_1x_fact_extraction_and_update_prompts():
    text = "Ezra Edwards led a parkour workshop at Bethpage Black Course. He demonstrated cat leaps to the crowd."
    facts = json.loads(respond([{"role": "system", "content": "Return the facts in json."},
                                {"role": "user", "content": f"Input:\nuser: {text}\n"}], JSON_OBJECT))["facts"]
    assert facts == [text]
    update = ("You are a smart memory manager.\n    Current memory is empty.\n    The new retrieved facts are mentioned "
              "in the triple backticks.\n\n    ```\n    ['Fact one here.', 'Fact two.']\n    ```\n\n"
              "    You must return your response in the following JSON structure only:")
    reply = json.loads(respond([{"role": "user", "content": update}], {"response_format": {"type": "json_schema"}}))
    assert reply == {"memory": [{"id": "0", "text": "Fact one here.", "event": "ADD"},
                                {"id": "1", "text": "Fact two.", "event": "ADD"}]}


def test_json_mode_sentences_keep_their_closing_quotes_and_rebuild_every_paragraph():
    from engine.benchmark.generation.published import load_book

    assert builtin_reader.sentences('She waved. "Time for vaults, folks!" Owen froze.') == [
        "She waved.", '"Time for vaults, folks!"', "Owen froze."]
    for text in load_book("synaptic-echoes").chapter_texts:
        for paragraph in filter(None, (p.strip() for p in text.split("\n"))):
            assert " ".join(builtin_reader.sentences(paragraph)) == " ".join(paragraph.split())


def graph_call(schema: str, user: str) -> dict:
    return json.loads(respond([{"role": "user", "content": user}],
                              {"response_format": {"type": "json_schema", "json_schema": {"name": schema}}}))


def test_json_mode_answers_graphitis_structured_outputs_lexically():
    text = ("At Bethpage Black Course, Ezra Edwards demonstrated cat leaps. Noa Middleton, the lead instructor, "
            "nodded to Ezra Edwards. He smiled.")
    entities = graph_call("ExtractedEntities", f"<ENTITY TYPES>\n[]\n</ENTITY TYPES>\n\n<TEXT>\n{text}\n</TEXT>")
    names = [e["name"] for e in entities["extracted_entities"]]
    assert set(names) == {"Ezra Edwards", "Noa Middleton", "Bethpage Black Course"}
    listed = json.dumps([{"id": n, "name": name} for n, name in enumerate(names)])
    edges = graph_call("ExtractedEdges", f"<CURRENT_MESSAGE>\n{text}\n</CURRENT_MESSAGE>\n\n<ENTITIES>\n{listed}\n</ENTITIES>")
    facts = {(frozenset((e["source_entity_name"], e["target_entity_name"])), e["fact"]) for e in edges["edges"]}
    assert facts == {  # a fact per pair of entities named in one sentence: the sentence, verbatim
        (frozenset(("Ezra Edwards", "Bethpage Black Course")), "At Bethpage Black Course, Ezra Edwards demonstrated cat leaps."),
        (frozenset(("Ezra Edwards", "Noa Middleton")), "Noa Middleton, the lead instructor, nodded to Ezra Edwards.")}
    existing = json.dumps([{"candidate_id": 7, "name": "noa middleton"}])
    resolved = graph_call("NodeResolutions", f"<ENTITIES>\n{listed}\n</ENTITIES>\n<EXISTING ENTITIES>\n{existing}\n</EXISTING ENTITIES>")
    assert {r["name"]: r["duplicate_candidate_id"] for r in resolved["entity_resolutions"]} == {
        "Ezra Edwards": -1, "Noa Middleton": 7, "Bethpage Black Course": -1}
    assert graph_call("EdgeTimestamps", "<FACT>\nx\n</FACT>") == {"valid_at": None, "invalid_at": None}
