"""The built-in judge: the two judge contracts, answered by fuzzy matching.

A free, deterministic judge, and a yardstick for an LLM judge (see
`engine.benchmark.evaluation.scores.agreement`). It reads the prompts of
engine/benchmark/evaluation/judge.py back (question type, ground truth, answer; or the
ground-truth and predicted lists) and replies with the JSON they ask for.

Main judge:
- An answer whose first sentence is negative ("There is no information...",
  "I don't know", "None of the chapters...") identifies no item, as the
  prompt instructs.
- Otherwise the answer is cut into items: lines, bullets and numbering,
  sentences, then commas and semicolons (dates are first rewritten
  "YYYY-MM-DD" so their commas do not cut them). For Times the items are the
  dates found in the answer.
- Every ground-truth item is matched to at most one answer item and an answer
  item to at most one ground-truth item (best pairs first), so the sum of the
  scores never exceeds the number of identified items. Scores: dates 1 when
  equal, 0.5 when the same month; names 1 for the full name, 0.5 for a first
  or last name alone; other items 1 from a fuzzy score of 90, 0.5 from 75
  (rapidfuzz, on text normalised for case, punctuation and date formats).
- Full event details: the share of the chapter's dates and capitalised names
  found in the answer (1 from one half, 0.5 from one quarter).

Chronological judge: each predicted item takes the earliest unused
ground-truth index it matches fully, else the earliest it matches partly,
else -1.
"""
from __future__ import annotations

import ast
import datetime as dt
import json
import re
from collections.abc import Callable, Mapping, Sequence

from rapidfuzz import fuzz

from engine.benchmark.evaluation.judge import groundtruth_text

_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september",
           "october", "november", "december"]
_MONTH_RE = (r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
             r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)")
_MDY = re.compile(r"\b" + _MONTH_RE + r"\.?\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})\b", re.IGNORECASE)
_DMY = re.compile(r"\b(\d{1,2})(?:st|nd|rd|th)?\s+(?:of\s+)?" + _MONTH_RE + r"\.?,?\s+(\d{4})\b", re.IGNORECASE)
_ISO = re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b")
_US = re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4})\b")

FULL_MATCH = 90   # fuzzy score from which an item is found
PARTIAL_MATCH = 75  # fuzzy score from which an item is related (0.5)


# -- normalisation -------------------------------------------------------------------------
def _month(name: str) -> int:
    return next(i for i, m in enumerate(_MONTHS, start=1) if m.startswith(name.lower()[:3]))


def _iso(y: str | int, m: int, d: str | int) -> str | None:
    try:
        return dt.date(int(y), int(m), int(d)).isoformat()
    except ValueError:
        return None


def iso_dates(text: str) -> str:
    """The text with every recognised date rewritten YYYY-MM-DD."""
    def sub(pattern: re.Pattern[str], build: Callable[[re.Match[str]], str | None]) -> None:
        nonlocal text
        text = pattern.sub(lambda m: build(m) or m.group(0), text)
    sub(_MDY, lambda m: _iso(m.group(3), _month(m.group(1)), m.group(2)))
    sub(_DMY, lambda m: _iso(m.group(3), _month(m.group(2)), m.group(1)))
    sub(_ISO, lambda m: _iso(m.group(1), int(m.group(2)), m.group(3)))
    sub(_US, lambda m: _iso(m.group(3), int(m.group(1)), m.group(2)))
    return text


def find_dates(text: str) -> list[dt.date]:
    """Every date of the text, in order, once each."""
    found = [dt.date.fromisoformat(m.group(0)) for m in re.finditer(r"\b\d{4}-\d{2}-\d{2}\b", iso_dates(text))]
    return list(dict.fromkeys(found))


def normalise(text: str) -> str:
    """Case, punctuation, apostrophes and date formats folded away."""
    text = iso_dates(text)
    text = re.sub(r"\b(\d{4})-(\d{2})-(\d{2})\b", r"d\1\2\3", text)  # one token per date
    text = text.casefold().replace("'", "").replace("\u2019", "")
    text = re.sub(r"[^\w\s]", " ", text)
    return " ".join(text.split())


# -- negative answers and items ------------------------------------------------------------
# Negative wording anywhere in the first sentence...
_NEGATIVE = re.compile(
    r"\bno (?:information|mention|record|records|events?|relevant|details?|data|specific|such|"
    r"protagonists?|locations?|dates?|activities)\b"
    r"|\bnot (?:mentioned|provided|specified|stated|available|described|found|included|recorded)\b"
    r"|\b(?:i|we) (?:do not|dont|cannot|cant) (?:know|find|recall|determine|answer)\b"
    r"|\b(?:cannot|can not|cant|unable to) (?:answer|determine|find|identify|provide|recall|locate)\b"
    r"|\bthere (?:is|are|were|was) no\b|\bnone of\b"
    r"|\b(?:does|do|did) not (?:mention|contain|include|describe|appear|specify)\b"
    r"|\b(?:doesnt|dont|didnt) (?:mention|contain|include|describe|appear|specify)\b"
    r"|\bnever (?:mentioned|appears|occurs|described)\b")
# ...and words that are negative only when the answer opens with them
# ("No one else was involved", but not "Ezra was there; no one else").
_NEGATIVE_START = re.compile(r"^(?:based on (?:the|this) (?:text|book|story)(?: provided)?|according to the text|"
                             r"unfortunately|sorry|im sorry)?\s*(?:no one|nobody|none|no other|nothing|unknown)\b")


def is_negative(answer: str) -> bool:
    """Whether the answer begins by saying it has nothing to report."""
    text = answer.strip()
    first = normalise(re.split(r"(?<=[.!?])\s+|\n", text, maxsplit=1)[0]) if text else ""
    return not first or bool(_NEGATIVE.search(first) or _NEGATIVE_START.search(first))


_BULLET = re.compile(r"^\s*(?:[-*\u2022\u2013>]+|\d+[.)]|\(\d+\)|[a-z][.)])\s+", re.IGNORECASE)


def extract_items(answer: str, *, commas: bool = True) -> list[str]:
    """The answer cut into candidate items (see the module docstring);
    `commas=False` stops at sentences (descriptions of a whole event)."""
    text = iso_dates(answer).replace("**", "").replace("__", "").replace("`", "")
    items: list[str] = []
    # one item per line, also for inline enumerations "are: 1. a 2. b"
    for line in re.split(r"\n|(?<=\s)\d{1,2}[.)]\s+", text):
        line = _BULLET.sub("", line.strip().lstrip("#").strip())
        if not line or line.endswith(":"):
            continue
        head, sep, tail = line.partition(":")
        if sep and tail.strip() and len(head) < 60:
            line = tail.strip()
        for sentence in re.split(r"(?<=[.!?])\s+", line):
            for part in re.split(r"[;,]", sentence) if commas else [sentence]:
                part = re.sub(r"^(?:and|or|&)\s+", "", part.strip(), flags=re.IGNORECASE).strip(" .!?\"'()[]")
                if part and re.search(r"\w", part):
                    items.append(part)
    seen: set[str] = set()
    out = []
    for item in items:
        key = normalise(item)
        if key and key not in seen:
            seen.add(key)
            out.append(item)
    return out


# -- matching ------------------------------------------------------------------------------
def _as_date(text: str) -> dt.date | None:
    dates = find_dates(text)
    return dates[0] if len(dates) == 1 and len(normalise(text).split()) <= 2 else None


def item_score(ground: str, item: str, kind: str = "") -> float:
    """0, 0.5 or 1: how well an answer item matches a ground-truth item."""
    g_date = _as_date(ground)
    if g_date is not None or kind == "Times":
        if g_date is None:
            return 0.0
        dates = find_dates(item)
        if g_date in dates:
            return 1.0
        return 0.5 if any((d.year, d.month) == (g_date.year, g_date.month) for d in dates) else 0.0
    g, it = normalise(ground), normalise(item)
    if not g or not it:
        return 0.0
    ratio = fuzz.partial_ratio(g, it) if len(it) >= len(g) else fuzz.ratio(g, it)
    if ratio >= FULL_MATCH:
        return 1.0
    if kind in ("Entities", "Other entities"):
        words = set(it.split())
        return 0.5 if any(len(w) >= 3 and w in words for w in g.split()) else 0.0
    return 0.5 if ratio >= PARTIAL_MATCH else 0.0


def _assign(ground: Sequence[str], items: Sequence[str], kind: str) -> list[float]:
    """Scores per ground-truth item, each answer item used at most once."""
    pairs = []
    for gi, g in enumerate(ground):
        for ii, it in enumerate(items):
            s = item_score(g, it, kind)
            if s > 0:
                pairs.append((-s, gi, ii))
    scores = [0.0] * len(ground)
    used_g: set[int] = set()
    used_i: set[int] = set()
    for neg, gi, ii in sorted(pairs):
        if gi not in used_g and ii not in used_i:
            used_g.add(gi)
            used_i.add(ii)
            scores[gi] = -neg
    return scores


_PROPER = re.compile(r"\b[A-Z][a-z]+(?:\s+(?:of|the|de|and|&)?\s*[A-Z][a-z]+)+\b")


def chapter_coverage(chapter: str, answer: str) -> float:
    """1, 0.5 or 0: how much of a chapter's dates and names the answer holds."""
    facts = {normalise(d.isoformat()) for d in find_dates(chapter)}
    facts |= {normalise(m.group(0)) for m in _PROPER.finditer(chapter)}
    facts.discard("")
    if not facts:
        return 0.0
    said = f" {normalise(answer)} "
    share = sum(f" {f} " in said for f in facts) / len(facts)
    return 1.0 if share >= 0.5 else 0.5 if share >= 0.25 else 0.0


def judge(kind: str, ground_truth: Sequence[str], answer: str, chapter: str | None = None) -> dict[str, object]:
    """The main judge's verdict as the prompt's JSON object."""
    distinct = list(dict.fromkeys(ground_truth))
    if is_negative(answer):
        items: list[str] = []
        scores = [0.0] * len(distinct)
        why = "The answer reports no information, so no item is identified."
    elif chapter is not None:
        items = extract_items(answer, commas=False)
        scores = [chapter_coverage(chapter, answer)] * len(distinct)
        why = "Share of the chapter's dates and names found in the answer."
    else:
        if kind == "Times":
            items = [d.isoformat() for d in find_dates(answer)]
        else:
            items = []
            for segment in extract_items(answer):
                found = [g for g in distinct if item_score(g, segment, kind) == 1.0]
                items.extend(found if len(found) >= 2 else [segment])  # a segment naming several items
            items = list(dict.fromkeys(items))
        scores = _assign(distinct, items, kind)
        why = f"{sum(s == 1 for s in scores)} ground-truth item(s) found, {sum(s == 0.5 for s in scores)} related."
    by_item = dict(zip(distinct, scores))
    return {"identified_items_in_AI_answer": items,
            "matching_score": [{g: by_item[g]} for g in ground_truth],
            "explanation": why}


def chrono(ground_truth: Sequence[str], predicted: Sequence[str]) -> dict[str, object]:
    """The chronological judge's index per predicted item."""
    used: set[int] = set()
    indexes = []
    for p in predicted:
        choice = -1
        for wanted in (1.0, 0.5):
            choice = next((i for i, g in enumerate(ground_truth) if i not in used and item_score(g, p) >= wanted), -1)
            if choice != -1:
                break
        if choice != -1:
            used.add(choice)
        indexes.append(choice)
    return {"groundtruth_indexes": list(range(len(ground_truth))), "predicted_indexes": indexes,
            "explanation": "Each predicted item takes the earliest unused ground-truth item it matches."}


# -- reading the prompts back --------------------------------------------------------------
def _literal_line(content: str, label: str) -> list[str]:
    m = re.search(r"^\s*" + re.escape(label) + r" (.*)$", content, re.MULTILINE)
    if not m:
        raise ValueError(f"no {label!r} line")
    value = ast.literal_eval(m.group(1))
    return [str(x) for x in value]


def _judge_from_prompt(content: str) -> dict[str, object]:
    kind = re.search(r"^Question type: (.*)$", content, re.MULTILINE)
    gt_at = content.find("\nGroundtruth: ")
    answer_at = content.find("\nAI-generated answer: ", gt_at)
    end = content.rfind("\n\n\nYour task:\n")
    scores_at = content.rfind('"matching_score": ')
    if not kind or min(gt_at, answer_at, end, scores_at) < 0:
        raise ValueError("not the judge prompt")
    template = json.loads(content[scores_at + len('"matching_score": '):].split("\n", 1)[0])
    ground_truth = [next(iter(entry)) for entry in template]
    answer = content[answer_at + len("\nAI-generated answer: "):end]
    # The Groundtruth line holds the items (as judge.groundtruth_text writes
    # them) or, for full-detail questions, the chapter text.
    shown = content[gt_at + len("\nGroundtruth: "):answer_at]
    chapter = None if shown == groundtruth_text(ground_truth) else shown
    return judge(kind.group(1).strip(), ground_truth, answer, chapter)


def respond(messages: Sequence[Mapping[str, str]], params: Mapping[str, object]) -> str:
    """Reply to a judge prompt of engine/benchmark/evaluation/judge.py."""
    content = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
    try:
        if "Groundtruth indexes:" in content and "Predicted list:" in content:
            reply = chrono(_literal_line(content, "Groundtruth list:"), _literal_line(content, "Predicted list:"))
        elif "identified_items_in_AI_answer" in content:
            reply = _judge_from_prompt(content)
        else:
            return "The built-in judge only answers the benchmark's judge prompts."
    except (ValueError, SyntaxError, StopIteration, json.JSONDecodeError) as exc:
        return f"The built-in judge could not read this prompt ({exc.__class__.__name__})."
    return json.dumps(reply, ensure_ascii=False, indent=4)
