"""Every prompt string against the reference implementation's, character for
character (protocol.md; issue "fidelity", points 5-9).

The fixtures under tests/data/fidelity/ were rendered by
tests/data/fidelity/make_prompt_fixtures.py, which holds the reference's
prompt strings verbatim and none of Tulving's code; the same module renders
the chapter prompts of 200 events of each universe for the sweep below.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from engine.benchmark.evaluation.answers import SYSTEM_PROMPT, finetuned_prompt, finetuning_system_prompt
from engine.benchmark.evaluation.finetune import training_examples
from engine.benchmark.evaluation.judge import (
    CHRONO_SYSTEM_PROMPT,
    JUDGE_SYSTEM_PROMPT,
    chrono_judge_request,
    judge_prompt,
    judge_request,
)
from engine.benchmark.generation.events import sample_events, sample_meta_events
from engine.benchmark.generation.prompts import chapter_user_prompt, verification_messages
from engine.benchmark.generation.universe import load_universe

FIXTURES = Path(__file__).parent / "data" / "fidelity"
CASES = json.loads((FIXTURES / "cases.json").read_text(encoding="utf-8"))


def _fixture(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_bytes().decode("utf-8")


def _reference():
    spec = importlib.util.spec_from_file_location("make_prompt_fixtures", FIXTURES / "make_prompt_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- chapters (point 5) and the LLM check (point 6) ------------------------------------------------
@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("chapter_")])
def test_chapter_prompt_fixtures(name):
    case = CASES[name]
    universe = load_universe(case["universe"])
    meta = case["meta"]
    prompt = chapter_user_prompt(case["event"], meta, universe.spec.styles[meta["style"]], case["universe"])
    assert prompt == _fixture(name)


@pytest.mark.parametrize("universe_name", ["default", "news", "scifi"])
def test_chapter_prompts_of_200_events_per_universe(universe_name):
    reference = _reference()
    universe = load_universe(universe_name)
    events, metas = sample_events(universe, 200), sample_meta_events(universe, 200)
    for event, meta in zip(events, metas):
        adjectives = universe.spec.styles[meta["style"]]
        expected = reference.chapter_prompt(event, meta["nb_paragraphs"], meta["idx_paragraph"], meta["style"],
                                            ", ".join(adjectives), universe_name)
        assert chapter_user_prompt(event, meta, adjectives, universe_name) == expected


def test_chapter_prompt_details():
    text = _fixture("chapter_news_1p")
    assert "paragraph(s)" not in text and text.endswith("excerpt.\n")
    assert ("1. Write a single paragraph. Number (1) before this single paragraph, while maintaining "
            "news-appropriate paragraph lengths.\n") in text
    assert "\nCraft a seamless news that gradually" in text
    assert ". Follow these guidelines:\n" in _fixture("chapter_default_event0").split("\n")[0] + "\n"
    assert "Divide the text into 7 paragraphs. Number each" in _fixture("chapter_default_event0")


def test_verification_prompt_fixture():
    user = verification_messages(CASES["verification"]["text"])[1]["content"]
    assert user == _fixture("verification")
    assert user.endswith("}\n    ")


# -- judging (points 7, 8) ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in CASES if n.startswith("judge_")])
def test_judge_prompt_fixtures(name):
    case = CASES[name]
    prompt = judge_prompt(case["retrieval_type"], case["ground_truth"], case["answer"], case.get("chapter_text"))
    assert prompt == _fixture(name)
    assert '\n- The matching score should be of length 1, only "matching_score": [' in prompt


def test_judge_request_sends_the_reference_prompt():
    question = {"retrieval_type": "Spaces", "correct_answer": CASES["judge_spaces"]["ground_truth"], "chapters": [1]}
    request = judge_request(question, CASES["judge_spaces"]["answer"], book=None, model="j")
    assert request.messages[0] == {"role": "system", "content": JUDGE_SYSTEM_PROMPT}
    assert request.messages[1]["content"] == _fixture("judge_spaces")


def test_chronological_judge_fixture():
    case = CASES["chrono_repeated"]
    question = {"correct_answer": case["ground_truth"]}
    request = chrono_judge_request(question, "", case["identified"], model="j")
    assert request.messages[0]["content"] == CHRONO_SYSTEM_PROMPT == (
        "You are an expert judge evaluating the alignment between an AI-generated list and a known groundtruth list.")
    assert request.messages[1]["content"] == _fixture("chrono_repeated")
    assert "Groundtruth list: ['Woolworth Building', 'Yankee Stadium']\n" in request.messages[1]["content"]


# -- fine-tuning (point 9) ----------------------------------------------------------------------------
def test_finetuning_strings():
    question = CASES["finetune_user"]["question"]
    assert finetuned_prompt(question) == _fixture("finetune_user")
    assert "/n/n Question: " in finetuned_prompt(question)
    assert finetuning_system_prompt() == _fixture("finetune_system")


def test_training_examples_use_the_reference_strings(long_book, long_questions):
    single = [q for q in long_questions if q.n_chapters == 1][:5]
    examples = training_examples(long_book, single)
    for q, example in zip(single, examples):
        system, user, _ = example["messages"]
        assert system["content"] == _fixture("finetune_system")
        assert user["content"] == _reference().finetuning_user_prompt(q.question)
    assert SYSTEM_PROMPT == "You are an expert in memory tests."  # answering calls keep it
