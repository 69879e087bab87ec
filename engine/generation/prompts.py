"""Chapter-writing and chapter-verification prompts (paper Listings
lst:chapter_generation_prompts and lst:chapter_generation_verification_llm,
with the protocol's exact details).

Protocol details applied here: the content is lower-cased; the detail's first
letter is lower-cased; a one-paragraph chapter gets the line "1. Write a single
paragraph. Number (1) before this single paragraph"; the Restrictions list has
a 4th line. The news universe writes "a detailed news excerpt ... about
{entity} witnessing a {content}" with news wording and a 5th restriction; the
sci-fi universe writes "a detailed scifi excerpt ... witnessing a {content}".
(The news/sci-fi wording beyond the protocol's quoted fragments follows the
default template.) The variant follows the universe's name ("news", "scifi");
any other universe uses the default novel wording.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from engine.requests import Message

WRITER_SYSTEM_PROMPT = (
    "You are a creative fiction writer specializing in detailed, atmospheric novel excerpts. "
    "Your task is to generate vivid, immersive scenes based on specific prompts.")

CHECKER_SYSTEM_PROMPT = (
    "You are a content checker AI. Your tasks:\n"
    "1. Read the given text carefully.\n"
    "2. Answer true/false questions about the text.\n"
    "3. Respond in JSON format.\n"
    "Be accurate and concise. Only use information explicitly stated in the text.")

CHECKER_USER_TEMPLATE = """Please analyze the following text enclosed between [TEXT START] and [TEXT END] markers, and answer the four questions below with a simple true or false. Provide your answers in a JSON format with the question numbers as keys and the boolean answers as values.

[TEXT START]
{chapter}
[TEXT END]

Questions:
1. Does the following text takes place in a single geographical (longitude, latitude)?
2. Does the following text takes place in a single temporal day?
3. Does the following text has a single main character?
4. Does the following text has a single main event happening at that location that day (further cut into the events of the day)?

Your response should be in this JSON format:
{{
    "1": [boolean],
    "2": [boolean],
    "3": [boolean],
    "4": [boolean]
}}"""

# Per-universe wording: (kind of text, verb phrase, paragraph-length word, voice, closing line)
_VARIANTS = {
    "default": ("novel", "attending", "novel-appropriate", "narrative", "Craft a seamless narrative"),
    "news": ("news", "witnessing", "news-appropriate", "news", "Craft a seamless news excerpt"),
    "scifi": ("scifi", "witnessing", "novel-appropriate", "narrative", "Craft a seamless narrative"),
}


def lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def variant_of(universe: str) -> str:
    """Prompt variant for a universe name (custom universes use the default)."""
    return universe if universe in _VARIANTS else "default"


def chapter_user_prompt(event: Mapping[str, str], meta: Mapping, style_adjectives: Sequence[str],
                        universe: str = "default") -> str:
    kind, verb, lengths, voice, closing = _VARIANTS[variant_of(universe)]
    date, location, entity = event["date"], event["location"], event["entity"]
    content = event["content"].lower()
    detail = lower_first(event["detail"])
    first_name = entity.split(" ")[0]
    style = meta["style"]
    nb = meta["nb_paragraphs"]
    idx = meta["idx_paragraph"]
    article = "a"
    if nb == 1:
        numbering = "1. Write a single paragraph. Number (1) before this single paragraph"
    else:
        numbering = (f"1. Divide the text into {nb} paragraph(s). Number each paragraph (1), (2), etc., "
                     f"while maintaining {lengths} paragraph lengths.")
    restrictions = [
        f"1. Only mention {location} and {date}; avoid other locations or dates.",
        "2. Exclude explicit introductions, conclusions, or character backgrounds.",
        f"3. Focus exclusively on the events of this particular {content}.",
        "4. Do not use a too common starting sentence.",
    ]
    if variant_of(universe) == "news":
        restrictions.append("5. Do not put any title")
    lines = [
        f"Write a detailed {kind} excerpt in a {style} style about {entity} {verb} {article} {content}.",
        f"The story takes place on {date}, at {location}, where {entity} {detail}.",
        "Follow these guidelines:",
        "",
        "Structure and Information Reveal:",
        numbering,
        "2. Gradually reveal key information:",
        f"- Full location '{location}': must appear verbatim in paragraph {idx['location']} only and nowhere else in the text",
        f"- Full date '{date}': must appear verbatim in paragraph {idx['date']} only and nowhere else in the text",
        f"- Full name '{entity}': must appear verbatim in paragraph {idx['entity']} only and nowhere else in the text",
        f"- Full detail that '{first_name} {detail}': must appear verbatim in paragraph {idx['content']} and nowhere else in the text",
        "3. Subtly distribute details about location, date, main character, and event across all paragraphs.",
        "",
        "Content and Setting:",
        f"1. Focus on {first_name}'s experiences, observations, and interactions during the {content}.",
        f"2. Vividly describe surroundings, atmosphere, and {first_name}'s emotions.",
        f"3. Include the detail that {first_name} {detail}.",
        f"4. Limit the timeframe to a single day and confine all action to {location}.",
        "",
        "Characters:",
        "1. Refer to other characters as $entity_X (where X is a number).",
        f"2. Omit background information about {first_name} and other characters.",
        "",
        "Style and Tone:",
        "1. Use vivid, sensory details to bring the scene to life.",
        f"2. Incorporate elements of the {style} style, including {', '.join(style_adjectives)}.",
        f"3. Maintain a consistent {voice} voice throughout the excerpt.",
        "",
        "Restrictions:",
        *restrictions,
        "",
        f"{closing} that gradually reveals information while maintaining reader engagement throughout the excerpt.",
    ]
    return "\n".join(lines)


def chapter_messages(event: Mapping[str, str], meta: Mapping, style_adjectives: Sequence[str],
                     universe: str = "default") -> list[Message]:
    return [{"role": "system", "content": WRITER_SYSTEM_PROMPT},
            {"role": "user", "content": chapter_user_prompt(event, meta, style_adjectives, universe)}]


def verification_messages(candidate: str) -> list[Message]:
    return [{"role": "system", "content": CHECKER_SYSTEM_PROMPT},
            {"role": "user", "content": CHECKER_USER_TEMPLATE.format(chapter=candidate)}]
