"""The judge prompts, and the judge requests built from a question and an answer.

Two prompts (paper, appendix "Evaluation strategy"; protocol.md, "Judging and
scores"), character for character as the published scores were judged with
them:

- the main judge prompt: the judge lists the items it identifies in the
  answer and gives a 0..1 score to each ground-truth item. The ground truth is
  shown as a list and `matching_score` as a JSON list of one-key objects in
  ground-truth order. For 'Full event details' the chapter text stands in the
  Groundtruth line and the judge is told the score list has length 1. (The
  published prompt has no comma after the `matching_score` line of its JSON
  example; it is kept, since it is the prompt the published numbers come
  from, and judge_parse.py repairs replies that copy it.)
- the chronological prompt: the judge maps each identified item to the first
  unused ground-truth index, or -1.

Replies are parsed by judge_parse.py; the built-in judge
(providers/builtin_judge.py) reads these exact prompts back.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

from engine.evaluation.templates import FULL_DETAILS
from engine.requests import ChatRequest

JUDGE_SYSTEM_PROMPT = "You are an expert in memory tests."
# protocol.md: "answering and judging: 'You are an expert in memory tests.'"
# (the reference code base also carries an alternative chronological-judge
# system prompt; the protocol pins the one behind the published numbers).
CHRONO_SYSTEM_PROMPT = JUDGE_SYSTEM_PROMPT

_JUDGE_TEMPLATE = """
You are an expert judge evaluating the accuracy of an AI-generated answer against a known groundtruth. Questions can probe for different types or aspects, like what actions or events took place, what people were involved, what were the dates, or what were the locations or spaces.


Question type: {retrieval_type}
Groundtruth: {groundtruth}
AI-generated answer: {answer}


Your task:
- Identify all unique items in the AI-generated answer that are relevant to the question type. Answer an empty list [] for this field in case of at least one negative information (e.g., when the answer begins by telling there is no information, or cannot answer)
- Determine a matching score between 0 and 1 for each ground truth item. Give 1 if the item has been found in the relevant items of the AI-generated answer, considering synonyms, paraphrases, or close meanings. Give 0.5 if the item could be considered related to any AI-generated item but without being explicitly stated as such. Give 0 if the item missed mentioning a specific AI-generated item.
- Provide a brief explanation of the evaluation
{length_note}

Provide your evaluation in the following JSON format:
{{
    "identified_items_in_AI_answer": ["AI_answer_item_1", "AI_answer_item_2", ...],
    "matching_score": {score_template}
    "explanation": "Brief explanation of your evaluation"
}}
"""

_CHRONO_TEMPLATE = """You are an expert judge evaluating the alignment between an AI-generated list and a known groundtruth list. Your task is to match items from the predicted list to the groundtruth list, considering their order and uniqueness.

    Given:
    Groundtruth list: {groundtruth_items}
    Groundtruth indexes: {groundtruth_indexes}
    Predicted list: {predicted_items}

    Instructions:
    1. For each item in the predicted list, find the first corresponding index from the groundtruth list that hasn't been used yet.
    2. Assign indexes based on these rules:
    a. If a match is found and the groundtruth index hasn't been used, assign that index.
    b. If no match is found, or if all matching indexes have already been used, assign -1.
    3. Always use the earliest matching index from the groundtruth list, even if there's an exact match later.
    4. Provide a brief explanation of your index assignments.

    Output your evaluation in the following JSON format:
    {{
        "groundtruth_indexes": {groundtruth_indexes},
        "predicted_indexes": [index1, index2, ...],
        "explanation": "Concise explanation of index assignments"
    }}

    Consider these examples:

    Example 1:
    Groundtruth list: ['Ice Preservation Discussions', 'Theater Show', 'Parkour Workshop']
    Predicted list: ['Theater Performance', 'Tech Hackathon', 'Ice Preservation Talks']
    {{
        "groundtruth_indexes": [0, 1, 2],
        "predicted_indexes": [1, -1, 0],
        "explanation": "Theater Performance matches Theater Show (index 1), Tech Hackathon has no match (-1), Ice Preservation Talks matches Ice Preservation Discussions (index 0)."
    }}

    Example 2:
    Groundtruth list: ['Ice Preservation Discussions', 'Theater Show', 'Parkour Workshop', 'Theater Performance']
    Predicted list: ['Theater Performance', 'Tech Hackathon', 'Ice Preservation Talks']
    {{
        "groundtruth_indexes": [0, 1, 2, 3],
        "predicted_indexes": [1, -1, 0],
        "explanation": "Theater Performance matches Theater Show (index 1, first available match), Tech Hackathon has no match (-1), Ice Preservation Talks matches Ice Preservation Discussions (index 0)."
    }}

    Now, please provide your evaluation for the given lists:
    """


def _field(question: Any, name: str) -> Any:
    return question[name] if isinstance(question, dict) else getattr(question, name)


def score_template(ground_truth: Sequence[str]) -> str:
    """The `matching_score` the judge is to fill: one object per item, in order."""
    return json.dumps([{item: "score_between_0_and_1"} for item in ground_truth])


def _chapter_text(book: Any, k: int) -> str:
    if hasattr(book, "chapter_text"):
        return book.chapter_text(k)
    return book.chapter_texts[k - 1]


def judge_prompt(retrieval_type: str, ground_truth: Sequence[str], answer: str,
                 chapter_text: str | None = None) -> str:
    """The main judge prompt. `chapter_text` (full-detail questions) is shown
    in place of the ground-truth list."""
    scores = score_template(ground_truth)
    if chapter_text is None:
        groundtruth, note = str(list(ground_truth)), ""
    else:
        groundtruth = chapter_text
        note = f'- The matching score should be of length 1, only "matching_score": {scores}'
    return _JUDGE_TEMPLATE.format(retrieval_type=retrieval_type, groundtruth=groundtruth, answer=answer,
                                  length_note=note, score_template=scores)


def chrono_prompt(ground_truth: Sequence[str], identified_items: Sequence[str]) -> str:
    return _CHRONO_TEMPLATE.format(groundtruth_items=list(ground_truth),
                                   groundtruth_indexes=list(range(len(ground_truth))),
                                   predicted_items=list(identified_items))


def judge_request(question: Any, answer_text: str, *, book: Any, model: str, draw: int = 0,
                  tag: Any = None) -> ChatRequest:
    """The judge call for one answer. `question` is a Question (or its JSON
    dict); `book` is needed for full-detail questions (chapter text)."""
    rtype = _field(question, "retrieval_type")
    ground_truth = list(_field(question, "correct_answer"))
    chapter_text = None
    if rtype == FULL_DETAILS and ground_truth:
        chapter_text = _chapter_text(book, _field(question, "chapters")[0])
    prompt = judge_prompt(rtype, ground_truth, answer_text, chapter_text)
    return ChatRequest(model=model, draw=draw, tag=tag, messages=(
        {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
        {"role": "user", "content": prompt}))


def chrono_judge_request(question: Any, answer_text: str, identified_items: Sequence[str], *, model: str,
                         draw: int = 0, tag: Any = None) -> ChatRequest:
    """The second judge call of a chronological question: the items the main
    judge identified in the answer, matched to ground-truth indexes.
    `answer_text` is accepted for symmetry with `judge_request` but is not
    shown: this judge sees the identified items only, as published."""
    del answer_text
    prompt = chrono_prompt(list(_field(question, "correct_answer")), list(identified_items))
    return ChatRequest(model=model, draw=draw, tag=tag, messages=(
        {"role": "system", "content": CHRONO_SYSTEM_PROMPT},
        {"role": "user", "content": prompt}))
