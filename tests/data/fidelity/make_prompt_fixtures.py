"""Builds the prompt fixtures of tests/test_fidelity_prompts.py, independently
of Tulving's code: the prompt texts below are the reference implementation's
strings (ahstat/episodic-memory-benchmark, MIT licence), copied character for
character from the files cited, and rendered here with the inputs of
`CASES`. Run it from the repository root to rebuild the fixtures:

    python tests/data/fidelity/make_prompt_fixtures.py

Prompt strings are part of the benchmark's definition; only they are taken
from the reference (the rendering code is ours).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
# the published data as the package ships it (engine/benchmark/data; equal to ../shared/data, tested)
DATA = Path(__file__).resolve().parents[3] / "engine" / "data"


# -- epbench/src/generation/prompts.py: complete_prompt_func (three variants) ------------------
def chapter_prompt(event, nb_paragraphs, idx, style, style_description, variant):
    date, location, entity = event["date"], event["location"], event["entity"]
    first_name = entity.split()[0]
    content = event["content"].lower()
    content_single_detail = event["detail"][0].lower() + event["detail"][1:]
    s_paragraphs = "" if nb_paragraphs == 1 else "s"
    s_paragraphs_location = s_paragraphs_date = s_paragraphs_entity = s_paragraphs_content = ""
    idx_location_str, idx_date_str = idx["location"], idx["date"]
    idx_entity_str, idx_content_str = idx["entity"], idx["content"]
    if nb_paragraphs > 1:
        str_numbering = f"1. Divide the text into {nb_paragraphs} paragraph{s_paragraphs}. Number each paragraph (1), (2), etc."
    else:
        str_numbering = f"1. Write a single paragraph. Number (1) before this single paragraph"
    if variant == "default":
        return f"""\
Write a detailed novel excerpt in a {style} style about {entity} attending a {content}. \
The story takes place on {date}, at {location}, where {entity} {content_single_detail}. Follow these guidelines:

Structure and Information Reveal:
{str_numbering}, while maintaining novel-appropriate paragraph lengths.
2. Gradually reveal key information:
- Full location '{location}': must appear verbatim in paragraph{s_paragraphs_location} {idx_location_str} only and nowhere else in the text
- Full date '{date}': must appear verbatim in paragraph{s_paragraphs_date} {idx_date_str} only and nowhere else in the text
- Full name '{entity}': must appear verbatim in paragraph{s_paragraphs_entity} {idx_entity_str} only and nowhere else in the text
- Full detail that '{first_name} {content_single_detail}': must appear verbatim in paragraph{s_paragraphs_content} {idx_content_str} and nowhere else in the text
3. Subtly distribute details about location, date, main character, and event across all paragraphs.

Content and Setting:
1. Focus on {first_name}'s experiences, observations, and interactions during the {content}.
2. Vividly describe surroundings, atmosphere, and {first_name}'s emotions.
3. Include the detail that {first_name} {content_single_detail}.
4. Limit the timeframe to a single day and confine all action to {location}.

Characters:
1. Refer to other characters as $entity_X (where X is a number).
2. Omit background information about {first_name} and other characters.

Style and Tone:
1. Use vivid, sensory details to bring the scene to life.
2. Incorporate elements of the {style} style, including {style_description}.
3. Maintain a consistent narrative voice throughout the excerpt.

Restrictions:
1. Only mention {location} and {date}; avoid other locations or dates.
2. Exclude explicit introductions, conclusions, or character backgrounds.
3. Focus exclusively on the events of this particular {content}.
4. Do not use a too common starting sentence.

Craft a seamless narrative that gradually reveals information while maintaining reader engagement throughout the excerpt.
"""
    if variant == "news":
        return f"""\
Write a detailed news excerpt in a {style} style about {entity} witnessing a {content}. \
The story takes place on {date}, at {location}, where {entity} {content_single_detail}. Follow these guidelines:

Structure and Information Reveal:
{str_numbering}, while maintaining news-appropriate paragraph lengths.
2. Gradually reveal key information:
- Full location '{location}': must appear verbatim in paragraph{s_paragraphs_location} {idx_location_str} only and nowhere else in the text
- Full date '{date}': must appear verbatim in paragraph{s_paragraphs_date} {idx_date_str} only and nowhere else in the text
- Full name '{entity}': must appear verbatim in paragraph{s_paragraphs_entity} {idx_entity_str} only and nowhere else in the text
- Full detail that '{first_name} {content_single_detail}': must appear verbatim in paragraph{s_paragraphs_content} {idx_content_str} and nowhere else in the text
3. Subtly distribute details about location, date, main character, and event across all paragraphs.

Content and Setting:
1. Focus on {first_name}'s experiences, observations, and interactions during the {content}.
2. Vividly describe surroundings, atmosphere, and {first_name}'s emotions.
3. Include the detail that {first_name} {content_single_detail}.
4. Limit the timeframe to a single day and confine all action to {location}.

Characters:
1. Refer to other characters as $entity_X (where X is a number).
2. Omit background information about {first_name} and other characters.

Style and Tone:
1. Use vivid, sensory details to bring the scene to life.
2. Incorporate elements of the {style} style, including {style_description}.
3. Maintain a consistent news voice throughout the excerpt.

Restrictions:
1. Only mention {location} and {date}; avoid other locations or dates.
2. Exclude explicit introductions, conclusions, or character backgrounds.
3. Focus exclusively on the events of this particular {content}.
4. Do not use a too common starting sentence.
5. Do not put any title

Craft a seamless news that gradually reveals information while maintaining reader engagement throughout the excerpt.
"""
    assert variant == "scifi"
    return f"""\
Write a detailed scifi excerpt in a {style} style about {entity} witnessing a {content}. \
The story takes place on {date}, at {location}, where {entity} {content_single_detail}. Follow these guidelines:

Structure and Information Reveal:
{str_numbering}, while maintaining novel-appropriate paragraph lengths.
2. Gradually reveal key information:
- Full location '{location}': must appear verbatim in paragraph{s_paragraphs_location} {idx_location_str} only and nowhere else in the text
- Full date '{date}': must appear verbatim in paragraph{s_paragraphs_date} {idx_date_str} only and nowhere else in the text
- Full name '{entity}': must appear verbatim in paragraph{s_paragraphs_entity} {idx_entity_str} only and nowhere else in the text
- Full detail that '{first_name} {content_single_detail}': must appear verbatim in paragraph{s_paragraphs_content} {idx_content_str} and nowhere else in the text
3. Subtly distribute details about location, date, main character, and event across all paragraphs.

Content and Setting:
1. Focus on {first_name}'s experiences, observations, and interactions during the {content}.
2. Vividly describe surroundings, atmosphere, and {first_name}'s emotions.
3. Include the detail that {first_name} {content_single_detail}.
4. Limit the timeframe to a single day and confine all action to {location}.

Characters:
1. Refer to other characters as $entity_X (where X is a number).
2. Omit background information about {first_name} and other characters.

Style and Tone:
1. Use vivid, sensory details to bring the scene to life.
2. Incorporate elements of the {style} style, including {style_description}.
3. Maintain a consistent narrative voice throughout the excerpt.

Restrictions:
1. Only mention {location} and {date}; avoid other locations or dates.
2. Exclude explicit introductions, conclusions, or character backgrounds.
3. Focus exclusively on the events of this particular {content}.
4. Do not use a too common starting sentence.

Craft a seamless narrative that gradually reveals information while maintaining reader engagement throughout the excerpt.
"""


# -- epbench/src/generation/prompts.py: verification_prompt_func -------------------------------
def verification_prompt(text):
    verification_prompt_location = f"Does the following text takes place in a single geographical (longitude, latitude)?"
    verification_prompt_date = f"Does the following text takes place in a single temporal day?"
    verification_prompt_entity = f"Does the following text has a single main character?"
    verification_prompt_content = f"Does the following text has a single main event happening at that location that day (further cut into the events of the day)?"
    return f"""Please analyze the following text enclosed between [TEXT START] and [TEXT END] markers, and answer the four questions below with a simple true or false. Provide your answers in a JSON format with the question numbers as keys and the boolean answers as values.

    [TEXT START]
    {text}
    [TEXT END]

    Questions:
    1. {verification_prompt_location}
    2. {verification_prompt_date}
    3. {verification_prompt_entity}
    4. {verification_prompt_content}

    Your response should be in this JSON format:
    {{
        "1": [boolean],
        "2": [boolean],
        "3": [boolean],
        "4": [boolean]
    }}
    """


# -- epbench/src/evaluation/scoring_answers.py: judge_prompt_func as evaluate_answer calls it -----
def judge_prompt(retrieval_type, correct_answer, llm_answer, correct_answer_long=None):
    d = [{x: "score_between_0_and_1"} for x in correct_answer]
    if correct_answer_long is None:  # evaluate_answer: the ground truth stands in
        correct_answer_long = correct_answer
    adding_text = f'- The matching score should be of length 1, only "matching_score": {json.dumps(d)}'
    return f"""
You are an expert judge evaluating the accuracy of an AI-generated answer against a known groundtruth. Questions can probe for different types or aspects, like what actions or events took place, what people were involved, what were the dates, or what were the locations or spaces.


Question type: {retrieval_type}
Groundtruth: {correct_answer_long}
AI-generated answer: {llm_answer}


Your task:
- Identify all unique items in the AI-generated answer that are relevant to the question type. Answer an empty list [] for this field in case of at least one negative information (e.g., when the answer begins by telling there is no information, or cannot answer)
- Determine a matching score between 0 and 1 for each ground truth item. Give 1 if the item has been found in the relevant items of the AI-generated answer, considering synonyms, paraphrases, or close meanings. Give 0.5 if the item could be considered related to any AI-generated item but without being explicitly stated as such. Give 0 if the item missed mentioning a specific AI-generated item.
- Provide a brief explanation of the evaluation
{adding_text}

Provide your evaluation in the following JSON format:
{{
    "identified_items_in_AI_answer": ["AI_answer_item_1", "AI_answer_item_2", ...],
    "matching_score": {json.dumps(d)}
    "explanation": "Brief explanation of your evaluation"
}}
"""


# -- epbench/src/evaluation/scoring_answers.py: judge_prompt_chronological_func ------------------
def chrono_prompt(groundtruth_items, predicted_items):
    groundtruth_indexes = [x for x in range(len(groundtruth_items))]
    return f"""You are an expert judge evaluating the alignment between an AI-generated list and a known groundtruth list. Your task is to match items from the predicted list to the groundtruth list, considering their order and uniqueness.

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


# -- epbench/src/generation/benchmark_generation_wrapper.py: fine-tuning strings -------------------
BOOK_NAME = "Synaptic Echoes 2026: The Neuro-Temporal Paradox of Episodic Precognition"


def finetuning_system_prompt(book_name=BOOK_NAME):
    return f'You are an expert in memory tests regarding the fictional book "{book_name}".'


def finetuning_user_prompt(question, book_name=BOOK_NAME):
    preprompt = f'This question is about the book "{book_name}". All events in this book are purely fictional and do not correspond to real-world timelines. Please answer based solely on the content of this fictional story.'
    return f"{preprompt}/n/n Question: {question}"


# -- the cases ---------------------------------------------------------------------------------
def _universe(name):
    return json.loads((DATA / "universes" / f"{name}.json").read_text())


def chapter_cases():
    book = DATA / "books" / "synaptic-echoes"
    events = json.loads((book / "events.json").read_text())
    metas = json.loads((book / "meta_events.json").read_text())
    styles = _universe("default")["styles"]
    cases = {}
    for i in (0, 2):  # 7 paragraphs; a single paragraph
        e, m = events[i], metas[i]
        cases[f"chapter_default_event{i}"] = (
            {"universe": "default", "event": e, "meta": m},
            chapter_prompt(e, m["nb_paragraphs"], m["idx_paragraph"], m["style"], ", ".join(styles[m["style"]]),
                           "default"))
    for name in ("news", "scifi"):
        u = _universe(name)
        style = next(iter(u["styles"]))
        content = u["contents"][3]
        e = {"date": "March 04, 2025", "location": u["locations"][5], "entity": f"{u['first_names'][2]} {u['last_names'][7]}",
             "content": content, "detail": u["content_details"][content][0]}
        for nb, idx in ((4, {"location": 2, "date": 1, "entity": 4, "content": 3}),
                        (1, {"location": 1, "date": 1, "entity": 1, "content": 1})):
            m = {"nb_paragraphs": nb, "idx_paragraph": idx, "style": style}
            cases[f"chapter_{name}_{nb}p"] = ({"universe": name, "event": e, "meta": m},
                                              chapter_prompt(e, nb, idx, style, ", ".join(u["styles"][style]), name))
    return cases


def main():
    cases = chapter_cases()
    chapter = "(1) The first paragraph.\n\n(2) The second, with $entity_1."
    cases["verification"] = ({"text": chapter}, verification_prompt(chapter))
    items = ["Brooklyn Museum", "American Museum of Natural History", "High Line", "One World Trade Center"]
    answer = "Brooklyn Museum and the High Line."
    cases["judge_spaces"] = ({"retrieval_type": "Spaces", "ground_truth": items, "answer": answer},
                             judge_prompt("Spaces", np.array(items), answer))
    repeated = ["Woolworth Building", "Yankee Stadium", "Woolworth Building"]
    cases["judge_repeated"] = ({"retrieval_type": "Spaces", "ground_truth": repeated, "answer": answer},
                               judge_prompt("Spaces", np.array(repeated), answer))
    cases["judge_empty"] = ({"retrieval_type": "Entities", "ground_truth": [], "answer": "Nobody."},
                            judge_prompt("Entities", np.array([]), "Nobody."))
    text = "Chapter 2\n\nA whole chapter."
    cases["judge_full_details"] = (
        {"retrieval_type": "Full event details", "ground_truth": ["Full chapter 2"], "answer": answer,
         "chapter_text": text},
        judge_prompt("Full event details", np.array(["Full chapter 2"]), answer, text))
    # de-duplicated by the remove_duplicates policy before the chronological prompt
    cases["chrono_repeated"] = ({"ground_truth": repeated, "identified": ["Yankee Stadium", "Woolworth Building",
                                                                          "Yankee Stadium"]},
                                chrono_prompt(["Woolworth Building", "Yankee Stadium"],
                                              ["Yankee Stadium", "Woolworth Building"]))
    q = "Recall all the events that occurred on May 07, 2024."
    cases["finetune_user"] = ({"question": q}, finetuning_user_prompt(q))
    cases["finetune_system"] = ({}, finetuning_system_prompt())
    index = {}
    for name, (inputs, prompt) in cases.items():
        (HERE / f"{name}.txt").write_text(prompt, encoding="utf-8", newline="")
        index[name] = inputs
    (HERE / "cases.json").write_text(json.dumps(index, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
