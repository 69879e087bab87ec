"""builtin:writer -- a deterministic stand-in for the chapter-writing LLM.

Not a language model: it parses the chapter prompt (engine/benchmark/generation/
prompts.py) and writes a chapter that obeys it -- the paragraph count and
numbering, each of date / location / full name / detail verbatim in its
paragraph only, `$entity_X` secondary characters, the style's adjectives. A
share of candidates (`flaw_rate`, default 0.2) is deliberately flawed so that
the retry path runs: some flaws break an exact check (paragraph count,
numbering, a misplaced item, a stray "entity"), others pass the exact checks
but not the content check (a second day, a second place).

Every choice comes from a SHA-256 of the messages and `params["seed"]`: the
generation passes the candidate's draw index as `seed` to builtin models, so
draws of the same prompt differ and replay identically.

It also answers the verification prompt honestly, by reading the text for the
markers of a second day or place, and the realism prompt of
engine/benchmark/generation/derived.py with a deterministic rating.
"""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

DEFAULT_FLAW_RATE = 0.2
EXACT_FLAWS = ("paragraph_count", "numbering", "misplaced_item", "stray_entity")
LLM_FLAWS = ("second_day", "second_place")
DAY_SHIFT_MARKERS = ("the next day", "the following day", "days later")
PLACE_SHIFT_MARKERS = ("across town", "in another city", "miles away from there")

_FILLERS = (
    "The light shifted slowly, and every sound seemed to carry a meaning of its own.",
    "A murmur ran through the crowd as the moment drew closer.",
    "She noticed the small things first: a trembling hand, a half-finished sentence, a glance held too long.",
    "The air smelled of rain and something sweeter underneath.",
    "Time seemed to stretch, each minute heavier than the one before.",
    "Somewhere behind the gathering, a door creaked and fell silent again.",
    "Her heartbeat kept its own rhythm, steady beneath the noise.",
    "Laughter rose, then faded into an expectant hush.",
    "Shadows lengthened across the floor as the hours moved on.",
    "Every step felt deliberate, as if the ground itself were listening.",
    "A sudden gust of wind scattered a few loose papers.",
    "The conversation turned, and with it the mood of the whole room.",
)
_SECONDARY_LINES = (
    "{who} leaned closer and whispered a question nobody else heard.",
    "{who} offered a quick nod, eyes bright with {adj}.",
    "Across the way, {who} raised a hand in greeting.",
    "{who} laughed softly, the sound tinged with {adj}.",
)


@dataclass
class ChapterSpec:
    kind: str
    style: str
    adjectives: list[str]
    content: str
    nb_paragraphs: int
    date: str
    location: str
    entity: str
    detail_phrase: str          # "{first_name} {detail}"
    position: dict[str, int]    # item -> paragraph (1-based)


def _field(pattern: str, text: str) -> re.Match[str]:
    match = re.search(pattern, text, re.MULTILINE)
    if match is None:
        raise ValueError(pattern)
    return match


def parse_chapter_prompt(prompt: str) -> ChapterSpec:
    """Read the event and meta-data back out of a chapter prompt."""
    head = _field(r"^Write a detailed (\w+) excerpt in a (.+?) style about .+? (?:attending|witnessing) a (.+?)\. "
                  r"The story takes place on ", prompt)
    if "Write a single paragraph." in prompt:
        nb = 1
    else:
        nb = int(_field(r"Divide the text into (\d+) paragraph", prompt).group(1))
    position = {}
    values = {}
    for key, label in (("location", "Full location"), ("date", "Full date"), ("entity", "Full name"),
                       ("content", "Full detail that")):
        m = _field(rf"^- {label} '(.*)': must appear verbatim in paragraph (\d+)", prompt)
        values[key], position[key] = m.group(1), int(m.group(2))
    adjectives = _field(r"style, including (.+)\.$", prompt).group(1).split(", ")
    return ChapterSpec(kind=head.group(1), style=head.group(2), adjectives=adjectives, content=head.group(3),
                       nb_paragraphs=nb, date=values["date"], location=values["location"],
                       entity=values["entity"], detail_phrase=values["content"], position=position)


_T = TypeVar("_T")


class _Dice:
    """Deterministic choices from a hash stream."""

    def __init__(self, *parts: object):
        self._seed = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).digest()
        self._counter = 0

    def unit(self) -> float:
        self._counter += 1
        digest = hashlib.sha256(self._seed + self._counter.to_bytes(8, "big")).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def pick(self, options: Sequence[_T]) -> _T:
        return options[int(self.unit() * len(options))]

    def integer(self, low: int, high: int) -> int:
        return low + int(self.unit() * (high - low + 1))


def _item_sentence(key: str, spec: ChapterSpec, dice: _Dice) -> str:
    adj = dice.pick(spec.adjectives)
    if key == "location":
        return f"At {spec.location}, the atmosphere was thick with {adj}."
    if key == "date":
        return f"It was {spec.date}, a day that already felt charged with {adj}."
    if key == "entity":
        return f"{spec.entity} took in the scene, alert to every sign of {adj}."
    if spec.content.lower() in spec.detail_phrase.lower():
        return f"Before long, {spec.detail_phrase}, and the moment was full of {adj}."
    return f"Before long, {spec.detail_phrase} during the {spec.content}, and the moment was full of {adj}."


def _add_flaw(paragraphs: list[list[str]], spec: ChapterSpec, dice: _Dice, flaw: str | None) -> None:
    """The deliberate flaw a chapter is written with, for the checks to catch (write_chapter numbers)."""
    if flaw == "paragraph_count":
        if spec.nb_paragraphs > 1 and dice.unit() < 0.5:
            last = paragraphs.pop()
            paragraphs[-1].extend(last)
        else:
            paragraphs.append([dice.pick(_FILLERS)])
    elif flaw == "misplaced_item":
        key = dice.pick(("date", "location", "entity"))
        if spec.nb_paragraphs == 1:
            paragraphs[0] = [s for s in paragraphs[0] if getattr(spec, key) not in s] + [dice.pick(_FILLERS)]
        else:
            others = [i for i in range(spec.nb_paragraphs) if i != spec.position[key] - 1]
            paragraphs[dice.pick(others)].append(_item_sentence(key, spec, dice))
    elif flaw == "stray_entity":
        paragraphs[-1].append("Another entity seemed to watch from the edge of the crowd.")
    elif flaw == "second_day":
        paragraphs[-1].append("The next day, she came back to see what remained.")
    elif flaw == "second_place":
        paragraphs[-1].append("Later, across town, the story took another turn.")


def write_chapter(spec: ChapterSpec, dice: _Dice, flaw: str | None) -> str:
    n_secondary = dice.integer(1, 3)
    paragraphs: list[list[str]] = [[] for _ in range(spec.nb_paragraphs)]
    for i, sentences in enumerate(paragraphs, start=1):
        sentences.append(dice.pick(_FILLERS))
        for key in ("date", "location", "entity", "content"):
            if spec.position[key] == i:
                sentences.append(_item_sentence(key, spec, dice))
        sentences.append(dice.pick(_FILLERS))
    for x in range(1, n_secondary + 1):
        target = paragraphs[dice.integer(0, spec.nb_paragraphs - 1)]
        line = dice.pick(_SECONDARY_LINES).format(who=f"$entity_{x}", adj=dice.pick(spec.adjectives))
        target.insert(1, line)
    _add_flaw(paragraphs, spec, dice, flaw)
    numbers = list(range(1, len(paragraphs) + 1))
    if flaw == "numbering":
        if len(numbers) > 1:
            numbers[0], numbers[1] = numbers[1], numbers[0]
        else:
            numbers[0] = 2
    return "\n\n".join(f"({n}) " + " ".join(sentences) for n, sentences in zip(numbers, paragraphs))


def answer_verification(text: str) -> str:
    # the markers are also named in the prompt's first sentence: take the block
    # (the reference's prompt indents the block's lines by 4 spaces)
    start = text.rfind("[TEXT START]\n")
    end = text.rfind("[TEXT END]")
    body = text[start + len("[TEXT START]\n"):end].lower() if 0 <= start < end else text.lower()
    single_place = not any(m in body for m in PLACE_SHIFT_MARKERS)
    single_day = not any(m in body for m in DAY_SHIFT_MARKERS)
    answers = {"1": single_place, "2": single_day, "3": True, "4": single_place and single_day}
    return json.dumps(answers, indent=4)


def answer_realism(prompt: str, dice: _Dice) -> str:
    score = dice.integer(1, 5)
    return json.dumps({"realism": score, "reason": "deterministic rating of the builtin writer"})


def respond(messages: Sequence[Mapping[str, str]], params: Mapping[str, Any]) -> str:
    user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    dice = _Dice([dict(m) for m in messages], params.get("seed"))
    if "[TEXT START]" in user and "[TEXT END]" in user:
        return answer_verification(user)
    if "Rate the realism" in user:
        return answer_realism(user, dice)
    try:
        spec = parse_chapter_prompt(user)
    except ValueError:
        return "I can only write chapters from the benchmark's chapter prompt."
    flaw_rate = float(params.get("flaw_rate", DEFAULT_FLAW_RATE))
    flaw = None
    if dice.unit() < flaw_rate:
        flaw = dice.pick(EXACT_FLAWS + LLM_FLAWS)
    return write_chapter(spec, dice, flaw)
