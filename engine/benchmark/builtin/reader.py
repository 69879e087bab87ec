"""builtin:reader -- a lexical baseline, not a language model.

It answers a benchmark question from the context it is given (the whole book
in-context, or the retrieved chunks in RAG modes) by string matching only, and
so measures how much of the benchmark a lexical shortcut solves:

1. Parse the question against the 36 templates: which cue fields are fixed
   (date, location, entity, content) and their values, which trace is asked,
   and whether all / the latest / the chronological list is wanted.
2. Split the context into events (chapters; retrieved paragraphs are grouped
   by their "Chapter k" label) and keep those mentioning every cue value
   (case-insensitive; a content matches when each of its words does).
3. Extract the trace from each kept event, lexically: dates by the universe's
   date format ("May 07, 2024"); places and people among the capitalised
   phrases (places: after "at", "in", ...; the protagonist: the person named
   most often by first name alone -- secondary characters are always written
   in full); event contents as the most repeated word pair of the event.
   It knows no universe list.
4. Order by date for latest / chronological, and answer "a, b, and c", the
   event text for full-detail questions, or that no event matches.

Its reply depends only on the messages, so it caches like any model's.

JSON mode (a request with `response_format` {"type": "json_object"} or
"json_schema"): the extraction calls of memory systems that ask their LLM for
JSON (mem0's memory extraction). The reader is an offline stand-in for that
LLM, not an LLM: it returns the sentences of the text it was given, verbatim,
as the memories (consecutive sentences joined up to about 15 words, the least
mem0's prompt asks of a memory), every one an ADD; it never invents or
rewrites a fact. So such a system's whole pipeline (extract, embed, store,
search) runs offline; what it measures is that pipeline, not extraction.
graphiti's structured outputs (`json_schema` named ExtractedEntities,
ExtractedEdges, NodeResolutions, EdgeDuplicate, EdgeTimestamps,
SummarizedEntities) are answered the same way: entities are the named people
and places found as above, a fact is a sentence naming two of them, verbatim;
no date is inferred, no summary written, only same-name entities are merged.
"""
from __future__ import annotations

import ast
import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from engine.benchmark.evaluation.templates import TEMPLATES, Template

NO_MATCH = "No event in the text matches this question."

_MONTHS = ("January|February|March|April|May|June|July|August|September|October|November|December")
DATE = re.compile(rf"\b(?:{_MONTHS}) \d{{1,2}}, \d{{4}}\b")
_CHAPTER_HEAD = re.compile(r"^Chapter (\d+)(?:, Paragraph (\d+))?\s*$", re.M)

# Words that start a capitalised run without being part of a name.
_FUNCTION = frozenset("""a an the at in on of to from for and but or nor as when while with within without
by near into onto inside outside across around through toward towards after before during beneath under
above over beside between beyond his her their its my our your this that these those he she they it we i
you there here then now yet still even just once suddenly meanwhile later soon finally despite amid among
against along behind upon every each all some no not what who whom whose which where why how if though
although because since unless until""".split())
_PLACE_PREPOSITIONS = frozenset("at on in inside near outside within across around through toward towards "
                                "into onto from to beneath under above beyond".split())
_WEEKDAYS = frozenset("monday tuesday wednesday thursday friday saturday sunday".split())
_MONTH_WORDS = frozenset(m.lower() for m in _MONTHS.split("|"))
_STOP = _FUNCTION | frozenset("""was were is are be been being had has have do did does would could should
might must can will shall may one two three more most much many very like than so such own other another
same new old first last only also into about against himself herself themselves itself air eyes hands
face voice room moment time way something nothing everything anyone someone everyone""".split())

_WORD = re.compile(r"[A-Za-z][A-Za-z'’\-]*")
_CAPITALISED_RUN = re.compile(r"[A-Z][A-Za-z'’\-.]*(?:\s+(?:(?:of|the|de|du|la|on|at|in)\s+)*[A-Z][A-Za-z'’\-.]*)*")


# -- question ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ParsedQuestion:
    cue: dict[str, str]    # "date" | "location" | "entity" | "content" -> value
    trace: str             # a retrieval type of engine/benchmark/evaluation/templates.py
    get: str               # all | latest | chronological


@lru_cache(maxsize=1)
def _template_patterns() -> list[tuple[re.Pattern[str], Template]]:
    patterns = []
    for template in TEMPLATES:
        regex = re.escape(template.text)
        for slot in ("t", "s", "ent", "c"):
            regex = regex.replace(re.escape("{" + slot + "}"), f"(?P<{slot}>.+?)", 1)
        patterns.append((re.compile(rf"^{regex}$", re.S), template))
    return patterns


_SLOT_FIELD = {"t": "date", "s": "location", "ent": "entity", "c": "content"}


def parse_question(question: str) -> ParsedQuestion | None:
    question = question.strip()
    best = None
    for pattern, template in _template_patterns():
        match = pattern.match(question)
        # Several templates can match ("involving {ent} on {t}" also matches
        # "involving both {ent} and {c} on {t}"): the most specific one wins.
        if match and (best is None or len(match.groupdict()) > len(best[0].groupdict())):
            best = (match, template)
    if best is None:
        return None
    match, template = best
    cue = {_SLOT_FIELD[k]: v for k, v in match.groupdict().items()}
    return ParsedQuestion(cue=cue, trace=template.retrieval_type, get=template.get)


# -- context ----------------------------------------------------------------------

_CONTEXT_STARTS = ("## The Text to Memorize:\n\n", "## Retrieved Relevant Chunks from the Book:\n\n")
_QUESTION_HEAD = "\n\n## Question:\n\n"


def split_prompt(prompt: str) -> tuple[str | None, str]:
    """(context, question) from an answering prompt of engine/benchmark/evaluation/answers.py.

    Found by position and cut once: a book-sized context is copied only once."""
    span, question = _split(prompt)
    return (None if span is None else prompt[span[0]:span[1]]), question


def _split(prompt: str) -> tuple[tuple[int, int] | None, str]:
    """(where the context is in the prompt, or None when it has none; the question)."""
    for start in _CONTEXT_STARTS:
        begin = prompt.find(start)
        if begin >= 0:
            begin += len(start)
            end = prompt.rfind(_QUESTION_HEAD, begin)
            # No question heading: no context, the rest is the question.
            tail = prompt[begin:] if end < 0 else prompt[end + len(_QUESTION_HEAD):]
            question = tail.split("\n\nPlease answer the question", 1)[0]
            return ((begin, begin) if end < 0 else (begin, end)), question
    _, sep, question = prompt.rpartition("Question:")
    return None, (question if sep else prompt).strip()


@dataclass(slots=True)
class Event:
    chapter: int
    text: str


def split_events(context: str) -> list[Event]:
    """Chapters of the context; retrieved paragraphs grouped by their chapter."""
    if '"""' in context:
        pieces = [p.strip() for p in re.split(r'\n?"""\n?', context) if p.strip()]
    else:
        pieces = [p.strip() for p in context.split("\n\n\n") if p.strip()]
    grouped: dict[int, list[str]] = {}
    for n, piece in enumerate(pieces):
        head = _CHAPTER_HEAD.match(piece.split("\n", 1)[0])
        chapter = int(head.group(1)) if head else -(n + 1)
        body = piece.split("\n", 1)[1].strip() if head and "\n" in piece else piece
        grouped.setdefault(chapter, []).append(body)
    return [Event(chapter=k, text="\n\n".join(parts)) for k, parts in grouped.items()]


# -- matching and extraction ----------------------------------------------------

def _content_words(content: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(content) if len(w) >= 3]


def _words_start_with(words: str, content_words: Sequence[str]) -> bool:
    """`words`: an event's distinct lower-case words, each after a space."""
    return all(" " + w[:max(4, len(w) - 2)] in words for w in content_words)


def _word_index(text_lower: str) -> str:
    """The distinct words of a text, each after a space (a compact set for prefix tests)."""
    return "".join(" " + w for w in dict.fromkeys(_WORD.findall(text_lower)))


def _content_matches(content: str, text_lower: str) -> bool:
    if content.lower() in text_lower:
        return True
    words = _content_words(content)
    return bool(words) and _words_start_with(_word_index(text_lower), words)


def matches(event: Event, cue: Mapping[str, str]) -> bool:
    lower = event.text.lower()
    for field, value in cue.items():
        if field == "content":
            if not _content_matches(value, lower):
                return False
        elif value.lower() not in lower:
            return False
    return True


class _ParsedContext:
    """A context split into events once, with their lower-case texts and (built
    when first needed) their word indexes: every question over the same book
    reuses it instead of splitting and lower-casing the whole book again."""

    __slots__ = ("events", "lowers", "_words", "_lock")

    def __init__(self, context: str):
        self.events = split_events(context)
        self.lowers = [e.text.lower() for e in self.events]
        self._words: dict[int, str] = {}
        self._lock = threading.Lock()

    def words(self, i: int) -> str:
        found = self._words.get(i)
        if found is None:
            found = _word_index(self.lowers[i])
            with self._lock:
                self._words[i] = found
        return found

    def matching(self, cue: Mapping[str, str]) -> list[Event]:
        fixed = [v.lower() for k, v in cue.items() if k != "content"]
        content = cue.get("content")
        content_lower = content.lower() if content is not None else ""
        content_words = _content_words(content) if content is not None else []
        out = []
        for i, lower in enumerate(self.lowers):
            if not all(v in lower for v in fixed):
                continue
            if content is not None and content_lower not in lower and not (
                    content_words and _words_start_with(self.words(i), content_words)):
                continue
            out.append(self.events[i])
        return out


# A few contexts (the book in context, or recent RAG chunks); the key is the
# context text itself, so a hit is exact.
@lru_cache(maxsize=2)
def _parsed(context: str) -> _ParsedContext:
    return _ParsedContext(context)


# The contexts of the latest prompts (the keys of `_parsed`'s entries): a
# prompt holding one again is answered without cutting a copy of it.
_recent: list[str] = []
_recent_lock = threading.Lock()


def _parsed_in(prompt: str, begin: int, end: int) -> _ParsedContext:
    """`_parsed(prompt[begin:end])`, compared in place with the latest contexts
    before cutting it out: the book in context is not copied for every
    question. One thread at a time, so threads asking at once for a book not
    parsed yet parse it once, not once each."""
    with _recent_lock:
        for context in _recent:
            if len(context) == end - begin and prompt.startswith(context, begin):
                return _parsed(context)
        context = prompt[begin:end]
        _recent.append(context)
        del _recent[:-2]
        return _parsed(context)


def dates(text: str) -> list[str]:
    return DATE.findall(text)


def _date_value(text: str) -> datetime | None:
    found = dates(text)
    if not found:
        return None
    try:
        return datetime.strptime(found[0], "%B %d, %Y")
    except ValueError:
        return None


def _runs(text: str) -> list[tuple[str, str]]:
    """Capitalised phrases with the word before each: (phrase, preceding word)."""
    out = []
    for m in _CAPITALISED_RUN.finditer(text):
        words = m.group(0).rstrip(".").split()
        before = text[max(0, m.start() - 40):m.start()].split()
        prev = before[-1].lower().strip(",;:") if before else ""
        if prev == "the" and len(before) > 1:  # "at the High Line": the preposition counts
            prev = "the " + before[-2].lower().strip(",;:")
        # Drop capitalised function words at the front ("At Bethpage ...").
        while words and words[0].lower() in _FUNCTION:
            prev = words.pop(0).lower()
        while words and words[-1].lower() in _FUNCTION:
            words.pop()
        if words:
            out.append((" ".join(words), prev))
    return out


def _clean(phrase: str) -> str:
    return re.sub(r"['’]s$", "", phrase).strip(" ,.;:")


def _is_calendar(phrase: str) -> bool:
    first = phrase.split()[0].lower()
    return first in _MONTH_WORDS or first in _WEEKDAYS or bool(DATE.search(phrase))


def people(text: str) -> list[str]:
    """Two- or three-word capitalised names not placed after a place preposition,
    in order of first appearance."""
    found: dict[str, None] = {}
    places = set(places_in(text))
    for phrase, prev in _runs(text):
        phrase = _clean(phrase)
        words = phrase.split()
        if not 2 <= len(words) <= 3 or _is_calendar(phrase) or phrase in places:
            continue
        if any(w.lower() in _STOP or not w[0].isupper() for w in words):
            continue
        if prev in _PLACE_PREPOSITIONS or prev.startswith("the"):  # people are never "the ..."
            continue
        found.setdefault(phrase, None)
    return list(found)


def places_in(text: str) -> list[str]:
    """Capitalised phrases after a place preposition ("at", "in the", ...) or
    "the", best first: after a preposition, then most frequent, then first seen."""
    scores: Counter[str] = Counter()
    first_seen: dict[str, int] = {}
    for n, (phrase, prev) in enumerate(_runs(text)):
        phrase = _clean(phrase)
        if _is_calendar(phrase) or (len(phrase.split()) == 1 and phrase.lower() in _STOP):
            continue
        bare = prev.removeprefix("the ").removeprefix("the")
        if prev in _PLACE_PREPOSITIONS or bare in _PLACE_PREPOSITIONS:
            scores[phrase] += 10 if len(phrase.split()) > 1 else 3
        elif prev.startswith("the"):
            scores[phrase] += 2
        else:
            continue
        first_seen.setdefault(phrase, n)
    return sorted(scores, key=lambda p: (-scores[p], first_seen[p]))


def protagonist(text: str, exclude: Sequence[str] = ()) -> str | None:
    """The person most often named by first name alone (secondary characters are
    always written in full); ties: the first named."""
    candidates = [p for p in people(text) if p not in exclude]
    if not candidates:
        return None

    def alone(name: str) -> int:
        first, last = name.split()[0], name.split()[-1]
        return len(re.findall(rf"\b{re.escape(first)}\b(?!\s+{re.escape(last)})", text))

    return max(candidates, key=lambda p: (alone(p), -candidates.index(p)))


def content_of(text: str) -> str | None:
    """The most repeated pair of content words (e.g. "parkour workshop")."""
    raw = _WORD.findall(text)
    words = [w.lower() for w in raw]
    pairs: Counter[tuple[str, str]] = Counter()
    for (ra, a), (rb, b) in zip(zip(raw, words), zip(raw[1:], words[1:])):
        if a in _STOP or b in _STOP or len(a) < 4 or len(b) < 4 or not (ra.islower() and rb.islower()) or "'" in a + b:
            continue
        pairs[(a, b)] += 1
    if not pairs:
        return None
    singles = Counter(w for w in words if w not in _STOP)
    best = max(pairs, key=lambda p: (pairs[p], singles[p[0]] + singles[p[1]]))
    return " ".join(best).title()


def extract(event: Event, parsed: ParsedQuestion) -> list[str]:
    text = event.text
    trace = parsed.trace
    cue_entity = parsed.cue.get("entity")
    not_people = [v for k, v in parsed.cue.items() if k in ("location", "content")]
    if trace == "Times":
        return dates(text)[:1]
    if trace == "Spaces":
        found = places_in(text)
        return found[:1]
    if trace == "Entities":
        name = cue_entity or protagonist(text, exclude=not_people)
        return [name] if name else []
    if trace == "Other entities":
        main = cue_entity or protagonist(text, exclude=not_people)
        return [p for p in people(text) if p != main and p not in not_people
                and (not main or p.split()[0] != main.split()[0])]
    if trace == "Full event details":
        return [text]
    # Event contents
    if parsed.cue.get("content"):
        return [parsed.cue["content"]]
    content = content_of(text)
    return [content] if content else []


def format_items(items: Sequence[str]) -> str:
    if not items:
        return NO_MATCH
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + f", and {items[-1]}"


def _in_time_order(events: list[Event]) -> list[Event]:
    """Dated events by date (ties in book order), then the undated ones."""
    dated = [(d, n, e) for n, e in enumerate(events) if (d := _date_value(e.text)) is not None]
    undated = [e for e in events if _date_value(e.text) is None]
    return [e for _, _, e in sorted(dated, key=lambda x: (x[0], x[1]))] + undated


def answer(context: str | None, question: str) -> str:
    return _answer(question, None if context is None else lambda: _parsed(context))


def _answer(question: str, parsed_context: Callable[[], _ParsedContext] | None) -> str:
    """The reply to `question` over the context `parsed_context()` gives (parsed only when the question is)."""
    parsed = parse_question(question)
    if parsed_context is None or parsed is None:
        return "I don't know." if parsed is None else NO_MATCH
    events = parsed_context().matching(parsed.cue)
    if not events:
        return NO_MATCH
    if parsed.get in ("latest", "chronological"):
        events = _in_time_order(events)
    per_event = [extract(e, parsed) for e in events]
    if parsed.trace == "Full event details":
        return "\n\n".join(items[0] for items in per_event if items) or NO_MATCH
    if parsed.get == "latest":
        return next((items[0] for items in reversed(per_event) if items), NO_MATCH)
    flat = [item for items in per_event for item in items]
    if parsed.get == "all":
        flat = list(dict.fromkeys(flat))
    return format_items(flat)


def respond(messages: Sequence[Mapping[str, str]], params: Mapping[str, object]) -> str:
    if _json_mode(params):
        return json_reply(messages, _schema_name(params))
    user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    span, question = _split(user)
    return _answer(question, None if span is None else lambda: _parsed_in(user, *span))


# -- JSON mode: memory systems' extraction calls ------------------------------------

# The space after a sentence's end (its closing quote or bracket kept with it).
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"”’)]))\s+(?=[\"“‘(]?[A-Z0-9])")
_ROLE_PREFIX = re.compile(r"^(?:user|assistant|system): ", re.M)
_MEMORY_WORDS = 15  # mem0's additive extraction prompt asks for memories of 15-80 words
# Where mem0 (2.x) puts the text to extract from in its additive extraction prompt.
_NEW_MESSAGES = re.compile(r"^## New Messages\n(.*?)(?=\n\n## |\Z)", re.S | re.M)
# mem0 (1.x) update prompt: the new facts are the last ``` block before the JSON structure.
_UPDATE_FACTS = re.compile(r"new retrieved facts.*?```\s*(.*?)\s*```", re.S)


def _json_mode(params: Mapping[str, object]) -> bool:
    response_format = params.get("response_format")
    return isinstance(response_format, Mapping) and response_format.get("type") in ("json_object", "json_schema")


def _schema_name(params: Mapping[str, object]) -> str | None:
    response_format = params.get("response_format")
    schema = response_format.get("json_schema") if isinstance(response_format, Mapping) else None
    name = schema.get("name") if isinstance(schema, Mapping) else None
    return name if isinstance(name, str) else None


def sentences(text: str) -> list[str]:
    """The sentences of `text` (paragraph by paragraph), verbatim and stripped."""
    out: list[str] = []
    for paragraph in text.split("\n"):
        out.extend(s.strip() for s in _SENTENCE_END.split(paragraph.strip()) if s.strip())
    return out


def memories_of(text: str) -> list[str]:
    """Consecutive sentences of `text` joined until each memory has at least
    _MEMORY_WORDS words (the last one may have fewer)."""
    out: list[str] = []
    current: list[str] = []
    for sentence in sentences(text):
        current.append(sentence)
        if sum(len(s.split()) for s in current) >= _MEMORY_WORDS:
            out.append(" ".join(current))
            current = []
    if current:
        out.append(" ".join(current))
    return out


def _listed(text: str) -> list[str]:
    """A list of strings written as JSON or as a Python literal, else the memories of the text."""
    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(text)
        except (ValueError, SyntaxError, TypeError):
            continue
        if isinstance(value, list):
            return [str(v) for v in value]
    return memories_of(text)


def _block(text: str, *tags: str) -> str | None:
    """The text between <TAG> and </TAG> (the first of `tags` found), as graphiti's prompts frame their inputs."""
    for tag in tags:
        found = re.search(rf"<{tag}>\n?(.*?)\n?</{tag}>", text, re.S)
        if found:
            return found.group(1)
    return None


def _json_block(text: str, tag: str) -> list[dict[str, object]]:
    block = _block(text, tag)
    try:
        value = json.loads(block) if block else []
    except ValueError:
        return []
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _entities(text: str) -> list[str]:
    """Named people and places of `text`, lexically (the reader's own extraction)."""
    places = [p for p in places_in(text) if len(p.split()) > 1]
    return list(dict.fromkeys(people(text) + places))


def _same_sentence_pairs(text: str, names: Sequence[str]) -> list[dict[str, object]]:
    """A fact per pair of named entities met one after the other in a sentence: the sentence, verbatim."""
    edges: list[dict[str, object]] = []
    for sentence in sentences(text):
        inside = [n for n in names if n in sentence]
        for source, target in zip(inside, inside[1:]):
            edges.append({"source_entity_name": source, "target_entity_name": target,
                          "relation_type": "MENTIONED_WITH", "fact": sentence})
    return edges


def _graph_reply(schema: str, user: str) -> dict[str, object] | None:
    """graphiti's structured outputs (its json_schema names), answered lexically: entities are
    the named people and places; a fact is a sentence naming two of them; no dates are
    inferred, no summary written, and only same-name entities are duplicates."""
    if schema == "ExtractedEntities":
        text = _block(user, "TEXT", "CURRENT_MESSAGE", "CURRENT MESSAGE") or ""
        return {"extracted_entities": [{"name": n, "entity_type_id": 0} for n in _entities(text)]}
    if schema == "ExtractedEdges":
        names = [str(e.get("name")) for e in _json_block(user, "ENTITIES")]
        return {"edges": _same_sentence_pairs(_block(user, "CURRENT_MESSAGE", "CURRENT MESSAGE") or "", names)}
    if schema == "NodeResolutions":
        existing = {str(e.get("name")).lower(): e.get("candidate_id") for e in _json_block(user, "EXISTING ENTITIES")}
        return {"entity_resolutions": [
            {"id": e.get("id"), "name": e.get("name"), "duplicate_candidate_id": existing.get(str(e.get("name")).lower(), -1)}
            for e in _json_block(user, "ENTITIES")]}
    if schema == "EdgeDuplicate":
        return {"duplicate_facts": [], "contradicted_facts": []}
    if schema == "EdgeTimestamps":
        return {"valid_at": None, "invalid_at": None}
    if schema == "SummarizedEntities":
        return {"summaries": []}
    return None


def json_reply(messages: Sequence[Mapping[str, str]], schema: str | None = None) -> str:
    """The reply to a JSON-mode request: the memories of the text it carries, in
    the shape the request's prompt asks for (mem0's additive extraction, its
    1.x fact extraction or memory update; else {"facts": [...]})."""
    user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    graph = _graph_reply(schema, user) if schema else None
    if graph is not None:
        return json.dumps(graph)
    found = _NEW_MESSAGES.search(user)
    if found:  # mem0 2.x: {"memory": [{"id", "text", "attributed_to"}]}, ADD only
        texts = memories_of(_ROLE_PREFIX.sub("", found.group(1)))
        return json.dumps({"memory": [{"id": str(n), "text": t, "attributed_to": "user"} for n, t in enumerate(texts)]})
    update = _UPDATE_FACTS.search(user)
    if update:  # mem0 1.x update: every new fact is an ADD
        facts = _listed(update.group(1))
        return json.dumps({"memory": [{"id": str(n), "text": f, "event": "ADD"} for n, f in enumerate(facts)]})
    text = user.removeprefix("Input:\n")  # mem0 1.x fact extraction
    return json.dumps({"facts": memories_of(_ROLE_PREFIX.sub("", text))})
