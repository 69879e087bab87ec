"""The judge prompts, and the judge requests built from a question and an answer.

Two prompts (protocol.md, "Judging and scores"), character for character as
the reference implementation sent them (ahstat/episodic-memory-benchmark, MIT,
`epbench/src/evaluation/scoring_answers.py`):

- the main judge prompt (`judge_prompt_func` as `evaluate_answer` calls it):
  the judge lists the items it identifies in the answer and gives a 0..1
  score to each ground-truth item. `evaluate_answer` passes the ground truth
  as the "long" answer when there is no chapter text, so the line
  `- The matching score should be of length 1, only "matching_score": [...]`
  is in every prompt. `matching_score` is a JSON list of one-key objects in
  ground-truth order (repeats kept). The Groundtruth line shows the items as
  the reference held them once its question set was read back from disk:
  `str(numpy.array(items))`; for 'Full event details' the chapter text stands
  there. (The prompt's JSON example has no comma after the `matching_score`
  line; it is kept, and judge_parse.py repairs replies that copy it.)
- the chronological prompt (`judge_prompt_chronological_func`, system prompt
  of `evaluate_chronological`): the judge maps each identified item to the
  first unused ground-truth index, or -1. Both lists are de-duplicated first
  (first occurrence kept, order kept), the reference's default
  `remove_duplicates` policy.

Replies are parsed by judge_parse.py; the built-in judge
(engine/benchmark/builtin/judge.py) reads these exact prompts back.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TypedDict

import numpy as np

from engine.benchmark.evaluation.questions import Question
from engine.benchmark.evaluation.scores import distinct
from engine.benchmark.evaluation.templates import FULL_DETAILS
from engine.benchmark.generation.bookdir import Book
from engine.requests import ChatRequest

JUDGE_SYSTEM_PROMPT = "You are an expert in memory tests."
# reference: scoring_answers.py, evaluate_chronological's system_prompt
CHRONO_SYSTEM_PROMPT = ("You are an expert judge evaluating the alignment between an AI-generated list and a known "
                        "groundtruth list.")

# reference: scoring_answers.py, judge_prompt_func (prompt 3), verbatim
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

# reference: scoring_answers.py, judge_prompt_chronological_func, verbatim
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


class QuestionFields(TypedDict, total=False):
    """The fields of a question the judge prompts read, as its JSON dict holds them."""

    retrieval_type: str
    correct_answer: Sequence[str]
    chapters: Sequence[int]


QuestionLike = Question | QuestionFields


def _retrieval_type(question: QuestionLike) -> str:
    return question["retrieval_type"] if isinstance(question, dict) else question.retrieval_type


def _correct_answer(question: QuestionLike) -> list[str]:
    return list(question["correct_answer"] if isinstance(question, dict) else question.correct_answer)


def _first_chapter(question: QuestionLike) -> int:
    return question["chapters"][0] if isinstance(question, dict) else question.chapters[0]


def score_template(ground_truth: Sequence[str]) -> str:
    """The `matching_score` the judge is to fill: one object per item, in order."""
    return json.dumps([{item: "score_between_0_and_1"} for item in ground_truth])


def _chapter_text(book: Book, k: int) -> str:
    if hasattr(book, "chapter_text"):
        return book.chapter_text(k)
    return book.chapter_texts[k - 1]


def groundtruth_text(ground_truth: Sequence[str]) -> str:
    """The Groundtruth line's items: `str(numpy.array(items))` under numpy's
    default print options (no commas, wrapped at 75 columns), e.g.
    "['Brooklyn Museum' 'American Museum of Natural History' 'High Line'\\n 'One World Trade Center']"."""
    with np.printoptions(linewidth=75, threshold=1000, edgeitems=3, legacy=False):
        return str(np.array(list(ground_truth)))


def judge_prompt(retrieval_type: str, ground_truth: Sequence[str], answer: str,
                 chapter_text: str | None = None) -> str:
    """The main judge prompt. `chapter_text` (full-detail questions) is shown
    in place of the ground-truth items."""
    scores = score_template(ground_truth)
    groundtruth = groundtruth_text(ground_truth) if chapter_text is None else chapter_text
    note = f'- The matching score should be of length 1, only "matching_score": {scores}'
    return _JUDGE_TEMPLATE.format(retrieval_type=retrieval_type, groundtruth=groundtruth, answer=answer,
                                  length_note=note, score_template=scores)


def chrono_prompt(ground_truth: Sequence[str], identified_items: Sequence[str]) -> str:
    """The chronological prompt, on the de-duplicated lists."""
    ground_truth, identified_items = distinct(ground_truth), distinct(identified_items)
    return _CHRONO_TEMPLATE.format(groundtruth_items=list(ground_truth),
                                   groundtruth_indexes=list(range(len(ground_truth))),
                                   predicted_items=list(identified_items))


def judge_request(question: QuestionLike, answer_text: str, *, book: Book | None, model: str,
                  draw: int = 0, tag: object = None) -> ChatRequest:
    """The judge call for one answer. `question` is a Question (or its JSON
    dict); `book` is needed for full-detail questions (chapter text)."""
    rtype = _retrieval_type(question)
    ground_truth = _correct_answer(question)
    chapter_text = None
    if rtype == FULL_DETAILS and ground_truth:
        if book is None:
            raise ValueError("the judge prompt of a full-detail question shows its chapter: pass the book")
        chapter_text = _chapter_text(book, _first_chapter(question))
    prompt = judge_prompt(rtype, ground_truth, answer_text, chapter_text)
    return ChatRequest(model=model, draw=draw, tag=tag, messages=(
        {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
        {"role": "user", "content": prompt}))


def chrono_judge_request(question: QuestionLike, answer_text: str, identified_items: Sequence[str],
                         *, model: str, draw: int = 0, tag: object = None) -> ChatRequest:
    """The second judge call of a chronological question: the items the main
    judge identified in the answer, matched to ground-truth indexes.
    `answer_text` is accepted for symmetry with `judge_request` but is not
    shown: this judge sees the identified items only, as published. Both
    lists are de-duplicated: the reply holds one index per distinct
    identified item, each an index of the distinct ground-truth items."""
    del answer_text
    prompt = chrono_prompt(_correct_answer(question), list(identified_items))
    return ChatRequest(model=model, draw=draw, tag=tag, messages=(
        {"role": "system", "content": CHRONO_SYSTEM_PROMPT},
        {"role": "user", "content": prompt}))
