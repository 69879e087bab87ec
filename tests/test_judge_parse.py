"""The judge contract: the prompts (judge.py) and their replies as LLMs write them,
parsed when they have one reading and refused otherwise (judge_parse.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.benchmark.evaluation.judge import (
    CHRONO_SYSTEM_PROMPT,
    JUDGE_SYSTEM_PROMPT,
    chrono_judge_request,
    chrono_prompt,
    judge_prompt,
    judge_request,
)
from engine.benchmark.evaluation.judge_parse import JudgeReplyError, JudgeVerdict, parse_chrono_reply, parse_judge_reply
from engine.benchmark.evaluation.questions import Question

CLEAN = """{
    "identified_items_in_AI_answer": ["Central Park", "High Line"],
    "matching_score": [{"Central Park": 1}, {"Lincoln Center": 0}],
    "explanation": "Central Park found, Lincoln Center missed."
}"""


def test_clean_reply():
    v = parse_judge_reply(CLEAN, 2)
    assert v == JudgeVerdict(["Central Park", "High Line"], [1.0, 0.0], "Central Park found, Lincoln Center missed.")


@pytest.mark.parametrize("reply", [
    "```json\n" + CLEAN + "\n```",
    "```\n" + CLEAN + "\n```\nLet me know if you need more.",
    "Here is my evaluation:\n\n" + CLEAN + "\n\nThe answer was partly right.",
    # the published prompt's example has no comma after matching_score; judges copy it
    CLEAN.replace('0}],\n', '0}]\n'),
    # trailing commas
    CLEAN.replace('"High Line"]', '"High Line",]').replace('missed."\n}', 'missed.",\n}'),
    # Python literal with single quotes
    "{'identified_items_in_AI_answer': ['Central Park', 'High Line'], "
    "'matching_score': [{'Central Park': 1}, {'Lincoln Center': 0}], "
    "'explanation': 'Central Park found, Lincoln Center missed.'}",
    # scores as strings
    CLEAN.replace('"Central Park": 1', '"Central Park": "1"').replace('"Lincoln Center": 0', '"Lincoln Center": "0.0"'),
    # an explanation with unescaped quotes breaks the object: fields are read one by one
    CLEAN.replace('"Central Park found, Lincoln Center missed."', '"The answer says "Central Park" only."'),
    # matching_score as a mapping
    CLEAN.replace('[{"Central Park": 1}, {"Lincoln Center": 0}]', '{"Central Park": 1, "Lincoln Center": 0}'),
    # item/score objects
    CLEAN.replace('[{"Central Park": 1}, {"Lincoln Center": 0}]',
                  '[{"item": "Central Park", "score": 1}, {"item": "Lincoln Center", "score": 0}]'),
])
def test_repaired_replies(reply):
    v = parse_judge_reply(reply, 2)
    assert v.identified_items == ["Central Park", "High Line"]
    assert v.scores == [1.0, 0.0]


def test_missing_comma_between_lines_and_python_booleans():
    reply = ('{\n"identified_items_in_AI_answer": []\n"matching_score": [{"a": 0.5}]\n'
             '"explanation": "none", "confident": true\n}')
    assert parse_judge_reply(reply, 1) == JudgeVerdict([], [0.5], "none")


def test_percent_and_apostrophes():
    reply = ("{'identified_items_in_AI_answer': [\"Grand Central's hall\"], "
             "'matching_score': [{\"Grand Central Terminal\": '50%'}], 'explanation': 'half'}")
    v = parse_judge_reply(reply, 1)
    assert v.identified_items == ["Grand Central's hall"] and v.scores == [0.5]


def test_braces_inside_strings_and_two_objects():
    reply = ('Draft: {"note": "thinking {hard}"}\nFinal:\n'
             '{"identified_items_in_AI_answer": ["x {y}"], "matching_score": [{"x": 1}], "explanation": "ok"}')
    assert parse_judge_reply(reply, 1).identified_items == ["x {y}"]


def test_identified_items_forms():
    base = '{"identified_items_in_AI_answer": %s, "matching_score": [{"a": 1}]}'
    assert parse_judge_reply(base % "null", 1).identified_items == []
    assert parse_judge_reply(base % '"Central Park"', 1).identified_items == ["Central Park"]
    assert parse_judge_reply(base % '["a", 2025, null, ""]', 1).identified_items == ["a", "2025"]


def test_wrong_length_is_an_error_unless_realignable():
    reordered = ('{"identified_items_in_AI_answer": ["b"], '
                 '"matching_score": [{"B": 1}, {"a": 0.5}], "explanation": ""}')
    assert parse_judge_reply(reordered, ["a", "b"]).scores == [0.5, 1.0]
    merged = ('{"identified_items_in_AI_answer": ["t"], '
              '"matching_score": [{"Theater Performance": 1}, {"Carnival": 0}]}')
    # the judge merged a repeated ground-truth item: each copy gets its score
    assert parse_judge_reply(merged, ["Theater Performance", "Carnival", "Theater Performance"]).scores == [1, 0, 1]
    with pytest.raises(JudgeReplyError, match="2 entries for 3"):
        parse_judge_reply(merged, 3)
    short = '{"identified_items_in_AI_answer": [], "matching_score": [{"a": 1}]}'
    with pytest.raises(JudgeReplyError, match="1 entries for 2"):
        parse_judge_reply(short, ["a", "b"])


@pytest.mark.parametrize("reply, message", [
    ("", "empty"),
    ("I cannot evaluate this answer.", "no JSON object"),
    ('{"identified_items_in_AI_answer": ["a"]}', "matching_score"),
    ('{"identified_items_in_AI_answer": ["a"], "matching_score": [{"a": "score_between_0_and_1"}]}', "not a number"),
    ('{"identified_items_in_AI_answer": ["a"], "matching_score": [{"a": 2}]}', "outside 0..1"),
    ('{"identified_items_in_AI_answer": ["a"], "matching_score": [{"a": true}]}', "not a number"),
    ('{"identified_items_in_AI_answer": ["a"], "matching_score": [{"a": 1, "b": 0}]}', "one-key"),
    ('{"identified_items_in_AI_answer": ["a"], "matching_score": "1"}', "not a list"),
    ('{"identified_items_in_AI_answer": 3, "matching_score": [{"a": 1}]}', "not a list"),
])
def test_unreadable_replies(reply, message):
    with pytest.raises(JudgeReplyError, match=message):
        parse_judge_reply(reply, 1)


# -- chronological --------------------------------------------------------------------------
CHRONO = """{
    "groundtruth_indexes": [0, 1, 2],
    "predicted_indexes": [1, -1, 0],
    "explanation": "Theater Performance matches Theater Show (index 1)."
}"""


@pytest.mark.parametrize("reply", [
    CHRONO,
    "```json\n" + CHRONO + "\n```",
    "My evaluation:\n" + CHRONO.replace("[0, 1, 2],", "[0, 1, 2]"),
    CHRONO.replace("[1, -1, 0]", '["1", "-1", "0"]'),
    CHRONO.replace("[1, -1, 0]", "[1.0, -1, 0.0]"),
    "{'groundtruth_indexes': [0, 1, 2], 'predicted_indexes': [1, -1, 0], 'explanation': 'x'}",
])
def test_chrono_replies(reply):
    assert parse_chrono_reply(reply, 3, 3) == [1, -1, 0]


@pytest.mark.parametrize("reply, n_identified, n_gt, message", [
    (CHRONO, 2, 3, "3 entries for 2"),
    (CHRONO.replace("[1, -1, 0]", "[1, -1, 5]"), 3, 3, "index 5"),
    (CHRONO.replace("[1, -1, 0]", "[1, -2, 0]"), 3, None, "index -2"),
    (CHRONO.replace("[1, -1, 0]", "[1, 0.5, 0]"), 3, 3, "not an integer"),
    (CHRONO.replace("predicted_indexes", "indexes"), 3, 3, "predicted_indexes"),
    ("no idea", 3, 3, "no JSON object"),
])
def test_bad_chrono_replies(reply, n_identified, n_gt, message):
    with pytest.raises(JudgeReplyError, match=message):
        parse_chrono_reply(reply, n_identified, n_gt)


def test_empty_prediction_list():
    assert parse_chrono_reply('{"groundtruth_indexes": [0, 1], "predicted_indexes": []}', 0, 2) == []


# -- the prompts the replies answer (engine/benchmark/evaluation/judge.py) -------------------------------
PAPER = Path(__file__).resolve().parents[2] / "shared" / "paper" / "episodic-memory-benchmark.tex"
needs_paper = pytest.mark.skipif(not PAPER.exists(), reason=f"{PAPER} is absent (a clone without shared/ beside it): the paper's listings cannot be read")


def _listing(label: str) -> str:
    text = PAPER.read_text(encoding="utf-8")
    m = re.search(r"\\begin\{lstlisting\}\[[^\]]*label=\{" + re.escape(label) + r"\}\]\n(.*?)\\end\{lstlisting\}",
                  text, re.DOTALL)
    assert m, label
    return m.group(1)


@needs_paper
def test_chrono_prompt_is_the_papers():
    """The paper's listing, on the de-duplicated lists (the reference's
    remove_duplicates policy: a repeated item is sent once)."""
    gt, predicted = ["Carnival", "Ghost Tour", "Carnival"], ["ghost tour", "carnival", "ghost tour"]
    expected = (_listing("lst:evaluation_prompt_chrono").replace("{{", "{").replace("}}", "}")
                .replace("{groundtruth_items}", str(["Carnival", "Ghost Tour"])).replace("{groundtruth_indexes}", "[0, 1]")
                .replace("{predicted_items}", str(["ghost tour", "carnival"])))
    assert chrono_prompt(gt, predicted).rstrip() == expected.rstrip()


@needs_paper
def test_judge_prompt_holds_the_papers_instructions():
    prompt = judge_prompt("Spaces", ["Central Park", "High Line"], "Central Park.")
    for line in _listing("lst:evaluation_prompt").splitlines():
        if line.startswith(("You are an expert judge", "- ", "Your task:", "Provide your evaluation in")):
            assert line in prompt.splitlines(), line
    # the ground truth as the reference held it once read back from disk: str(numpy.array(items))
    assert "\nQuestion type: Spaces\nGroundtruth: ['Central Park' 'High Line']\nAI-generated answer: Central Park.\n" \
        in prompt
    scores_line = next(line for line in prompt.splitlines() if line.startswith('    "matching_score":'))
    assert json.loads(scores_line.split(": ", 1)[1]) == [{"Central Park": "score_between_0_and_1"},
                                                         {"High Line": "score_between_0_and_1"}]
    # evaluate_answer passes the ground truth as the long answer: the length line is in every prompt
    assert ('\n- The matching score should be of length 1, only "matching_score": '
            '[{"Central Park": "score_between_0_and_1"}, {"High Line": "score_between_0_and_1"}]\n') in prompt


def _question(**changes) -> Question:
    base = dict(question="q?", template=29, cue="(t, s, ent, c)", cue_completed="({a}, {b}, {c}, {d})",
                retrieval_type="Full event details", get="all", correct_answer=["Full chapter 2"], chapters=[2],
                n_chapters=1, bin="1", q_idx=0)
    return Question(**{**base, **changes})


class _Book:
    chapter_texts = ["first chapter text", "The second chapter, in full."]

    def chapter_text(self, k):
        return self.chapter_texts[k - 1]


def test_full_detail_requests_show_the_chapter():
    request = judge_request(_question(), "An answer.", book=_Book(), model="judge-model", draw=2, tag="t")
    assert request.model == "judge-model" and request.draw == 2 and request.tag == "t"
    system, user = request.messages
    assert system == {"role": "system", "content": JUDGE_SYSTEM_PROMPT}
    assert JUDGE_SYSTEM_PROMPT == "You are an expert in memory tests."
    assert "\nGroundtruth: The second chapter, in full.\n" in user["content"]
    assert ('- The matching score should be of length 1, only "matching_score": '
            '[{"Full chapter 2": "score_between_0_and_1"}]') in user["content"]
    # an empty full-detail question shows the empty list, as any other
    empty = judge_request(_question(correct_answer=[], chapters=[], n_chapters=0, bin="0"), "None.",
                          book=_Book(), model="m")
    assert "\nGroundtruth: []\n" in empty.messages[1]["content"]
    assert judge_request(_question().to_json(), "x", book=_Book(), model="m").messages == \
        judge_request(_question(), "x", book=_Book(), model="m").messages


def test_chrono_request():
    q = _question(retrieval_type="Times", get="chronological", correct_answer=["May 01, 2025", "June 02, 2025"])
    request = chrono_judge_request(q, "answer", ["June 02, 2025"], model="m", draw=1, tag=("chrono", 0))
    assert request.messages[0]["content"] == CHRONO_SYSTEM_PROMPT and request.draw == 1
    assert "    Groundtruth list: ['May 01, 2025', 'June 02, 2025']\n" in request.messages[1]["content"]
    assert "    Predicted list: ['June 02, 2025']\n" in request.messages[1]["content"]
