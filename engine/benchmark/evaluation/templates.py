"""The 36 question templates of the benchmark (paper, Appendix "Creation of the
question/answer pairs", table of templates), word for word.

A template is a cue (which of t, s, e, c are fixed), a trace (the retrieval
type to recall from each matching event) and a get (all / latest /
chronological). `fill` turns a template and a (t, s, e, c) into the question
text and the filled cue string, e.g. "({May 14, 2025}, *, *, *)", which the
question selection sorts on.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from engine.benchmark.generation.bookdir import Item

# Retrieval types (traces), as named in the published question sets.
TIMES = "Times"
SPACES = "Spaces"
ENTITIES = "Entities"
CONTENTS = "Event contents"
OTHER_ENTITIES = "Other entities"
FULL_DETAILS = "Full event details"
RETRIEVAL_TYPES = (TIMES, SPACES, ENTITIES, CONTENTS, OTHER_ENTITIES, FULL_DETAILS)

# The cue's four slots, in order; a template's cue keeps the placeholder name
# of each fixed slot and "*" for the others: "(t, *, ent, *)".
SLOTS = ("t", "s", "ent", "c")
FIELDS: tuple[Item, ...] = ("date", "location", "entity", "content")  # the chapter field of each slot


@dataclass(frozen=True, slots=True)
class Template:
    index: int
    cue: str             # "(t, *, *, *)"
    retrieval_type: str
    get: str
    text: str            # with {t}, {s}, {ent}, {c} placeholders

    @property
    def fixed(self) -> tuple[bool, bool, bool, bool]:
        """Which of (date, location, entity, content) the cue fixes."""
        t, s, e, c = (p != "*" for p in cue_parts(self.cue))
        return t, s, e, c

    def fill(self, t: str, s: str, ent: str, c: str) -> tuple[str, str]:
        """(question text, filled cue) for these cue values."""
        values = {"t": t, "s": s, "ent": ent, "c": c}
        question = self.text
        for slot in SLOTS:  # one slot at a time, as the published questions were made
            question = question.replace("{" + slot + "}", values[slot])
        filled = ", ".join("{" + values[p] + "}" if p != "*" else "*" for p in cue_parts(self.cue))
        return question, f"({filled})"


@lru_cache(maxsize=64)
def cue_parts(cue: str) -> tuple[str, ...]:
    """"(t, *, ent, *)" -> ("t", "*", "ent", "*")."""
    parts = tuple(p.strip() for p in cue.strip("()").split(","))
    if len(parts) != 4 or any(p not in ("*", slot) for p, slot in zip(parts, SLOTS)):
        raise ValueError(f"malformed cue {cue!r}")
    return parts


def _t(cue: str, retrieval_type: str, get: str, text: str) -> tuple[str, str, str, str]:
    return cue, retrieval_type, get, text


_TABLE = [
    # (t, *, *, *)
    _t("(t, *, *, *)", SPACES, "all", "Recall all the events that occurred on {t}. Without describing the events, list all the unique locations where these events took place."),
    _t("(t, *, *, *)", ENTITIES, "all", "Consider all events that happened on {t}. Provide a list of all protagonists involved in any of these events, without describing the events themselves."),
    _t("(t, *, *, *)", CONTENTS, "all", "Reflect on {t}. Describe all the key events that occurred on this date, focusing on what happened rather than who was involved or where it took place."),
    # (*, s, *, *)
    _t("(*, s, *, *)", TIMES, "all", "Think about all events that have occurred at {s}. Provide a list of all dates when these events took place, without describing the events."),
    _t("(*, s, *, *)", ENTITIES, "all", "Consider the location {s}. List all protagonists that have been involved in any events at this location, without mentioning the events themselves."),
    _t("(*, s, *, *)", CONTENTS, "all", "Recall the various events that have taken place at {s}. Describe what happened during these events, focusing on the actions or occurrences rather than the timing or people involved."),
    # (*, *, ent, *)
    _t("(*, *, ent, *)", TIMES, "all", "Reflect on all events involving {ent}. Provide a list of all dates when these events occurred, without describing the events."),
    _t("(*, *, ent, *)", SPACES, "all", "Consider all events that {ent} has been involved in. List all the locations where these events took place, without mentioning the events themselves."),
    _t("(*, *, ent, *)", CONTENTS, "all", "Think about {ent}'s experiences. Describe all the key events they've been involved in, focusing on what happened rather than when or where it occurred."),
    # (*, *, *, c)
    _t("(*, *, *, c)", TIMES, "all", "Recall all events related to {c}. Provide a list of all dates when these events occurred, without describing the events."),
    _t("(*, *, *, c)", SPACES, "all", "Consider all events involving {c}. List all the locations where these events took place, without mentioning the events themselves."),
    _t("(*, *, *, c)", ENTITIES, "all", "Reflect on events related to {c}. Provide a list of all protagonists involved in these events, without describing the events."),
    # (t, s, *, *)
    _t("(t, s, *, *)", ENTITIES, "all", "Think about what happened at {s} on {t}. List all protagonists involved in any events at this time and place, without describing the events."),
    _t("(t, s, *, *)", CONTENTS, "all", "Recall the key events that occurred at {s} on {t}. Describe what happened, focusing on the actions or occurrences rather than who was involved."),
    # (t, *, ent, *)
    _t("(t, *, ent, *)", SPACES, "all", "Consider the events involving {ent} on {t}. List all the locations where these events took place, without describing the events themselves."),
    _t("(t, *, ent, *)", CONTENTS, "all", "Reflect on what {ent} experienced on {t}. Describe all the key events they were involved in, focusing on what happened rather than where it occurred."),
    # (t, *, *, c)
    _t("(t, *, *, c)", SPACES, "all", "Recall the events related to {c} that occurred on {t}. List all the locations where these events took place, without describing the events themselves."),
    _t("(t, *, *, c)", ENTITIES, "all", "Think about the events involving {c} on {t}. Provide a list of all protagonists involved in these events, without describing the events."),
    # (*, s, ent, *)
    _t("(*, s, ent, *)", TIMES, "all", "Consider all events involving {ent} at {s}. Provide a list of all dates when these events occurred, without describing the events."),
    _t("(*, s, ent, *)", CONTENTS, "all", "Reflect on {ent}'s experiences at {s}. Describe all the key events they've been involved in at this location, focusing on what happened rather than when it occurred."),
    # (*, s, *, c)
    _t("(*, s, *, c)", TIMES, "all", "Recall all events related to {c} that occurred at {s}. Provide a list of all dates when these events took place, without describing the events."),
    _t("(*, s, *, c)", ENTITIES, "all", "Think about the events involving {c} at {s}. List all protagonists involved in these events, without mentioning the events themselves."),
    # (*, *, ent, c)
    _t("(*, *, ent, c)", TIMES, "all", "Consider all events involving both {ent} and {c}. Provide a list of all dates when these events occurred, without describing the events."),
    _t("(*, *, ent, c)", SPACES, "all", "Reflect on the experiences of {ent} related to {c}. List all the unique locations where these events took place, without mentioning the events themselves."),
    # three and four fixed slots
    _t("(t, s, ent, *)", CONTENTS, "all", "Recall what happened involving {ent} at {s} on {t}. Describe the key events or activities that occurred, focusing on what happened."),
    _t("(t, s, *, c)", ENTITIES, "all", "Think about the events related to {c} that occurred at {s} on {t}. List all protagonists involved in these events, without describing the events themselves."),
    _t("(t, *, ent, c)", SPACES, "all", "Consider the events involving both {ent} and {c} on {t}. List all the locations where these events took place, without describing the events themselves."),
    _t("(*, s, ent, c)", TIMES, "all", "Consider all events involving both {ent} and {c} at {s}. Provide a list of all dates when these events occurred, without describing the events."),
    _t("(t, s, ent, c)", OTHER_ENTITIES, "all", "Recall what happened involving {ent} and {c} at {s} on {t} and list only who else was involved (if anyone)."),
    _t("(t, s, ent, c)", FULL_DETAILS, "all", "Provide a comprehensive account of what happened involving {ent} and {c} at {s} on {t}. Include all relevant details about the event(s), including what occurred and any other pertinent information."),
    # latest
    _t("(*, *, ent, *)", TIMES, "latest", "What is the most recent date {ent} was observed or mentioned in the story's chronology?"),
    _t("(*, *, ent, *)", SPACES, "latest", "What is the most recent location where {ent} was observed in the story's chronological timeline?"),
    _t("(*, *, ent, *)", CONTENTS, "latest", "What was {ent} doing the last time they were observed in the story's timeline?"),
    # chronological
    _t("(*, *, ent, *)", TIMES, "chronological", "Provide a chronological list of all dates when {ent} was observed, from earliest to latest in the story's timeline."),
    _t("(*, *, ent, *)", SPACES, "chronological", "List all locations visited by {ent} in chronological order according to the story's timeline."),
    _t("(*, *, ent, *)", CONTENTS, "chronological", "Enumerate all activities that {ent} has been involved in, ordered from earliest to latest in the story's chronology."),
]

TEMPLATES: tuple[Template, ...] = tuple(Template(i, *row) for i, row in enumerate(_TABLE))
