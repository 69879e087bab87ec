"""Books derived from a book: its chronological variant, and a realism rating
of its events by an LLM judge.

Chronological variant (paper, "unordered vs ordered books"): the same chapter
texts sorted by story date (ties keep chapter order), renumbered from 1; the
ground truth moves with them (`chapter` renumbered, `event_index` kept).

Realism rating (paper, "realistic vs non-realistic events"): each chapter's
event is shown to a judge model with REALISM_PROMPT; the reply is a JSON
object {"realism": 1..5, "reason": "..."}. The prompt is ours (the paper does
not print one); calls go through the engine, so they cache and replay.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from engine.benchmark.generation.assemble import assemble_book
from engine.benchmark.generation.bookdir import Book, ChapterRecord
from engine.requests import ChatRequest
from engine.scheduler import Engine

REALISM_SYSTEM_PROMPT = "You are an expert in judging the plausibility of events."
REALISM_PROMPT = """Rate the realism of the following event on a scale from 1 (impossible or absurd) to 5 (entirely ordinary), considering whether such an event could plausibly take place at that location.

Event: {entity} attended a {content} at {location} on {date}, where {entity} {detail}.

Answer only with a JSON object: {{"realism": <integer 1-5>, "reason": "<one sentence>"}}"""


def story_date(chapter: ChapterRecord) -> dt.date:
    return dt.datetime.strptime(chapter["date"], "%B %d, %Y").date()


def chronological_book(book: Book, name: str | None = None) -> Book:
    order = sorted(range(len(book.chapters)), key=lambda i: (story_date(book.chapters[i]), i))
    chapters: list[ChapterRecord] = [{**book.chapters[i], "chapter": k} for k, i in enumerate(order, start=1)]
    texts = [book.chapter_texts[i] for i in order]
    text = assemble_book(texts)
    metadata = {**book.metadata, "name": name or f"{book.name}-chrono", "derived_from": book.name,
                "order": "chronological"}
    return Book(name=metadata["name"], text=text, chapters=chapters, events=book.events,
                meta_events=book.meta_events, universe=book.universe, n_tokens=book.n_tokens,
                metadata=metadata, chapter_texts=texts)


def realism_request(chapter: ChapterRecord, model: str) -> ChatRequest:
    detail = chapter["detail"][:1].lower() + chapter["detail"][1:]
    prompt = REALISM_PROMPT.format(entity=chapter["entity"], content=chapter["content"].lower(),
                                   location=chapter["location"], date=chapter["date"], detail=detail)
    return ChatRequest(model=model, messages=[{"role": "system", "content": REALISM_SYSTEM_PROMPT},
                                              {"role": "user", "content": prompt}],
                       tag=chapter["chapter"])


def parse_realism(reply: str) -> int | None:
    match = re.search(r"\{.*?\}", reply, re.DOTALL)
    if match:
        try:
            value = json.loads(match.group(0)).get("realism")
        except (json.JSONDecodeError, AttributeError):
            value = None
        if isinstance(value, int) and 1 <= value <= 5:
            return value
    return None


async def rate_realism(engine: Engine, book: Book, model: str) -> list[dict[str, Any]]:
    """One record per chapter: chapter, event_index, realism (None if unparsable), reply."""
    outcomes = await engine.run([realism_request(c, model) for c in book.chapters], label="realism")
    rows = []
    for chapter, outcome in zip(book.chapters, outcomes):
        reply = outcome.text if outcome.ok else f"error: {outcome.error}"
        rows.append({"chapter": chapter["chapter"], "event_index": chapter["event_index"],
                     "realism": parse_realism(reply) if outcome.ok else None, "reply": reply})
    return rows
