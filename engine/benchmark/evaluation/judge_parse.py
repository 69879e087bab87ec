"""Reading judge replies: the JSON the judge prompts ask for, written by an LLM.

Replies come wrapped in code fences or prose, with single quotes (Python
literals), a missing comma (the published prompt's own example lacks one
after `matching_score`), trailing commas, scores as strings, or an
explanation with unescaped quotes. The parser repairs what has one obvious
reading and raises `JudgeReplyError` for the rest; the pipeline then asks for
a new draw (a few times) before it records a judge failure.

Decisions where a reply disagrees with the ground truth:
- When the ground-truth items are given and every one of them is found by
  name among the reply's keys, the scores are taken by name (a judge that
  reorders or merges repeated items still scored each item). Otherwise they
  are taken in order, and a `matching_score` list of the wrong length is an
  error (the published scoring refused such replies too).
- Scores must be numbers in [0, 1] (or strings holding one, "0.5", "1", "50%").
- Chronological replies must give exactly one index per identified item, each
  -1 or a valid ground-truth index.
"""
from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

ITEMS_KEY = "identified_items_in_AI_answer"
SCORES_KEY = "matching_score"
PREDICTED_KEY = "predicted_indexes"
_KNOWN_KEYS = (ITEMS_KEY, SCORES_KEY, "explanation", "groundtruth_indexes", PREDICTED_KEY)


class JudgeReplyError(Exception):
    """A judge reply that cannot be read as the verdict the prompt asks for."""


@dataclass(frozen=True, slots=True)
class JudgeVerdict:
    identified_items: list[str]
    scores: list[float]          # one per ground-truth item, in ground-truth order
    explanation: str = ""


# -- finding and loading the JSON object ---------------------------------------------
_FENCE = re.compile(r"```[a-zA-Z]*\s*\n?(.*?)```", re.DOTALL)


def _balanced_objects(text: str) -> Iterator[str]:
    """Every top-level {...} span, skipping braces inside quoted strings."""
    depth, start, quote, escaped = 0, -1, "", False
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote or ch == "\n":  # a newline ends a runaway string
                quote = ""
            continue
        if ch == '"' and depth > 0:
            quote = ch
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                yield text[start:i + 1]


def _candidate_texts(text: str) -> list[str]:
    out = [m.group(1) for m in _FENCE.finditer(text)]
    first, last = text.find("{"), text.rfind("}")
    if first != -1 and last > first:
        out.append(text[first:last + 1])
    out.extend(_balanced_objects(text))
    return list(dict.fromkeys(s.strip() for s in out if s.strip()))


_KEYS_ALT = "|".join(_KNOWN_KEYS)
_MISSING_COMMA_KEY = re.compile(r'([\]}"\d]|true|false|null)(\s*)(["\'](?:' + _KEYS_ALT + r')["\']\s*:)')
_MISSING_COMMA_LINE = re.compile(r'([\]}"])(\s*\n\s*)(["{\[])')
_TRAILING_COMMA = re.compile(r",(\s*[\]}])")


def _repair(s: str) -> str:
    s = _MISSING_COMMA_KEY.sub(r"\1,\2\3", s)
    s = _MISSING_COMMA_LINE.sub(r"\1,\2\3", s)
    s = _TRAILING_COMMA.sub(r"\1", s)
    return s


def _python_literal(s: str) -> object:
    s = re.sub(r"\btrue\b", "True", s)
    s = re.sub(r"\bfalse\b", "False", s)
    s = re.sub(r"\bnull\b", "None", s)
    return ast.literal_eval(s)


def _loads(s: str) -> object:
    """JSON, else repaired JSON, else a Python literal; None if nothing works."""
    for attempt in (s, _repair(s)):
        try:
            return json.loads(attempt)
        except ValueError:
            pass
        try:
            return _python_literal(attempt)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return None


def _value_after_key(text: str, key: str) -> object:
    """The JSON value following `"key":` in otherwise broken text (e.g. an
    explanation with unescaped quotes): the bracketed span is cut out and
    loaded alone."""
    m = re.search(r'["\']' + re.escape(key) + r'["\']\s*:\s*', text)
    if not m:
        return None
    i = m.end()
    if i >= len(text) or text[i] not in "[{":
        return None
    opening = text[i]
    closing = "]" if opening == "[" else "}"
    depth, quote, escaped = 0, "", False
    for j in range(i, len(text)):
        ch = text[j]
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
            continue
        if ch in "\"'":
            # an apostrophe inside a word is not a quote ("Grand Central's")
            if ch == "'" and j > 0 and text[j - 1].isalnum() and j + 1 < len(text) and text[j + 1].isalnum():
                continue
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth == 0:
                return _loads(text[i:j + 1]) if text[j] == closing else None
    return None


def _reply_object(text: str, required: Sequence[str]) -> dict[str, object]:
    """The reply's JSON object holding the `required` keys."""
    if not isinstance(text, str) or not text.strip():
        raise JudgeReplyError("empty judge reply")
    for candidate in _candidate_texts(text):
        obj = _loads(candidate)
        if isinstance(obj, dict) and all(k in obj for k in required):
            return obj
    # Field by field, for objects broken beyond repair elsewhere.
    found = {k: _value_after_key(text, k) for k in required}
    if all(v is not None for v in found.values()):
        return found
    missing = [k for k, v in found.items() if v is None]
    raise JudgeReplyError(f"no JSON object with {', '.join(missing)} in the judge reply")


# -- values ------------------------------------------------------------------------------
def _score(value: object) -> float:
    if isinstance(value, bool) or value is None:
        raise JudgeReplyError(f"score {value!r} is not a number")
    if isinstance(value, (int, float)):
        x = float(value)
    elif isinstance(value, str):
        s = value.strip()
        try:
            x = float(s[:-1]) / 100 if s.endswith("%") else float(s)
        except ValueError:
            raise JudgeReplyError(f"score {value!r} is not a number") from None
    else:
        raise JudgeReplyError(f"score {value!r} is not a number")
    if not 0.0 <= x <= 1.0:
        raise JudgeReplyError(f"score {value!r} is outside 0..1")
    return x


def _score_pairs(raw: object) -> list[tuple[str | None, object]]:
    """(ground-truth key or None, raw score) pairs from the forms judges use."""
    if isinstance(raw, dict):
        return [(str(k), v) for k, v in raw.items()]
    if not isinstance(raw, list):
        raise JudgeReplyError(f"{SCORES_KEY} is not a list")
    pairs: list[tuple[str | None, object]] = []
    for entry in raw:
        if isinstance(entry, dict):
            if len(entry) == 1:
                (k, v), = entry.items()
                pairs.append((str(k), v))
            elif "score" in entry:  # {"item": ..., "score": ...}
                key = next((entry[k] for k in ("item", "groundtruth", "ground_truth", "name") if k in entry), None)
                pairs.append((None if key is None else str(key), entry["score"]))
            else:
                raise JudgeReplyError(f"{SCORES_KEY} entry {entry!r} is not a one-key object")
        else:
            pairs.append((None, entry))
    return pairs


def _norm_key(s: str) -> str:
    return " ".join(s.casefold().split())


def _align(pairs: list[tuple[str | None, object]], ground_truth: int | Sequence[str]) -> list[float]:
    n = ground_truth if isinstance(ground_truth, int) else len(ground_truth)
    keyed = [(k, v) for k, v in pairs if k is not None]
    if not isinstance(ground_truth, int) and len(keyed) == len(pairs):
        by_key: dict[str, object] = {}
        for k, v in keyed:
            by_key.setdefault(_norm_key(k), v)
        wanted = [_norm_key(g) for g in ground_truth]
        if all(w in by_key for w in wanted):
            return [_score(by_key[w]) for w in wanted]
    if len(pairs) == n:
        return [_score(v) for _, v in pairs]
    raise JudgeReplyError(f"{SCORES_KEY} has {len(pairs)} entries for {n} ground-truth items")


def _items(raw: object) -> list[str]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [raw] if raw.strip() else []
    if not isinstance(raw, (list, tuple)):
        raise JudgeReplyError(f"{ITEMS_KEY} is not a list")
    out = []
    for x in raw:
        if x is None:
            continue
        text = x if isinstance(x, str) else json.dumps(x) if isinstance(x, (dict, list)) else str(x)
        if text.strip():
            out.append(text)
    return out


# -- public ------------------------------------------------------------------------------
def parse_judge_reply(text: str, n_ground_truth: int | Sequence[str]) -> JudgeVerdict:
    """The main judge's verdict. `n_ground_truth` is the number of ground-truth
    items, or the items themselves (which also allows realigning a reply
    that lists them in another order)."""
    obj = _reply_object(text, (ITEMS_KEY, SCORES_KEY))
    scores = _align(_score_pairs(obj[SCORES_KEY]), n_ground_truth)
    explanation = obj.get("explanation", "")
    return JudgeVerdict(identified_items=_items(obj[ITEMS_KEY]), scores=scores,
                        explanation=explanation if isinstance(explanation, str) else str(explanation))


def _index(value: object) -> int:
    if isinstance(value, bool):
        raise JudgeReplyError(f"index {value!r} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    raise JudgeReplyError(f"index {value!r} is not an integer")


def parse_chrono_reply(text: str, n_identified: int, n_ground_truth: int | None = None) -> list[int]:
    """The chronological judge's index per identified item (-1: no match)."""
    obj = _reply_object(text, (PREDICTED_KEY,))
    raw = obj[PREDICTED_KEY]
    if not isinstance(raw, (list, tuple)):
        raise JudgeReplyError(f"{PREDICTED_KEY} is not a list")
    indices = [_index(v) for v in raw]
    if len(indices) != n_identified:
        raise JudgeReplyError(f"{PREDICTED_KEY} has {len(indices)} entries for {n_identified} identified items")
    upper = n_ground_truth if n_ground_truth is not None else None
    for i in indices:
        if i < -1 or (upper is not None and i >= upper):
            raise JudgeReplyError(f"index {i} is not -1 or a ground-truth index")
    return indices
