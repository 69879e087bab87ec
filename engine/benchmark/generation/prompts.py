"""Chapter-writing and chapter-verification prompts, character for character the
strings of the reference implementation (ahstat/episodic-memory-benchmark, MIT,
`epbench/src/generation/prompts.py`: `complete_prompt_func`,
`system_prompt_func`, `system_prompt_verification_func`,
`verification_prompt_func`), as protocol.md ("Chapters") pins them. They
differ from the paper's typeset listings (one opening line, "paragraphs",
the length clause also for a single paragraph, the indented verification
body), and every difference changes every prompt, hence every cache key and
every writer's output.

Details: the content is lower-cased; the detail's first letter is
lower-cased. The news universe writes "a detailed news excerpt ... about
{entity} witnessing a {content}" with news wording, a 5th restriction and
the closing "Craft a seamless news that ..." (sic); the sci-fi universe
writes "a detailed scifi excerpt ... witnessing a {content}". The variant
follows the universe's name ("news", "scifi"); any other universe uses the
default novel wording.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from engine.benchmark.generation.bookdir import MetaEvent
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

# reference: epbench/src/generation/prompts.py, verification_prompt_func, verbatim (its
# body is indented by 4 spaces inside the function, and the f-string keeps them: only
# the chapter's first line is indented; the prompt ends with "}\n    ").
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
    }}
    """

# reference: epbench/src/generation/prompts.py, complete_prompt_func, verbatim; its three
# variants (default, news, scifi) differ only in the fields below. The first two
# sentences and "Follow these guidelines:" are one line; the prompt ends with a newline.
_CHAPTER_TEMPLATE = """\
Write a detailed {kind} excerpt in a {style} style about {entity} {verb} a {content}. \
The story takes place on {date}, at {location}, where {entity} {detail}. Follow these guidelines:

Structure and Information Reveal:
{numbering}, while maintaining {lengths} paragraph lengths.
2. Gradually reveal key information:
- Full location '{location}': must appear verbatim in paragraph {idx_location} only and nowhere else in the text
- Full date '{date}': must appear verbatim in paragraph {idx_date} only and nowhere else in the text
- Full name '{entity}': must appear verbatim in paragraph {idx_entity} only and nowhere else in the text
- Full detail that '{first_name} {detail}': must appear verbatim in paragraph {idx_content} and nowhere else in the text
3. Subtly distribute details about location, date, main character, and event across all paragraphs.

Content and Setting:
1. Focus on {first_name}'s experiences, observations, and interactions during the {content}.
2. Vividly describe surroundings, atmosphere, and {first_name}'s emotions.
3. Include the detail that {first_name} {detail}.
4. Limit the timeframe to a single day and confine all action to {location}.

Characters:
1. Refer to other characters as $entity_X (where X is a number).
2. Omit background information about {first_name} and other characters.

Style and Tone:
1. Use vivid, sensory details to bring the scene to life.
2. Incorporate elements of the {style} style, including {style_description}.
3. Maintain a consistent {voice} voice throughout the excerpt.

Restrictions:
1. Only mention {location} and {date}; avoid other locations or dates.
2. Exclude explicit introductions, conclusions, or character backgrounds.
3. Focus exclusively on the events of this particular {content}.
4. Do not use a too common starting sentence.
{extra_restriction}
Craft a seamless {closing} that gradually reveals information while maintaining reader engagement throughout the excerpt.
"""

# Per-universe wording: (kind of text, verb, paragraph-length word, voice, 5th restriction line, closing noun)
_VARIANTS = {
    "default": ("novel", "attending", "novel-appropriate", "narrative", "", "narrative"),
    "news": ("news", "witnessing", "news-appropriate", "news", "5. Do not put any title\n", "news"),
    "scifi": ("scifi", "witnessing", "novel-appropriate", "narrative", "", "narrative"),
}


def lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


def variant_of(universe: str) -> str:
    """Prompt variant for a universe name (custom universes use the default)."""
    return universe if universe in _VARIANTS else "default"


def chapter_user_prompt(event: Mapping[str, str], meta: MetaEvent, style_adjectives: Sequence[str],
                        universe: str = "default") -> str:
    kind, verb, lengths, voice, extra, closing = _VARIANTS[variant_of(universe)]
    nb = meta["nb_paragraphs"]
    idx = meta["idx_paragraph"]
    if nb > 1:
        numbering = f"1. Divide the text into {nb} paragraphs. Number each paragraph (1), (2), etc."
    else:
        numbering = "1. Write a single paragraph. Number (1) before this single paragraph"
    entity = event["entity"]
    return _CHAPTER_TEMPLATE.format(
        kind=kind, verb=verb, lengths=lengths, voice=voice, extra_restriction=extra, closing=closing,
        style=meta["style"], style_description=", ".join(style_adjectives), numbering=numbering,
        date=event["date"], location=event["location"], entity=entity, first_name=entity.split(" ")[0],
        content=event["content"].lower(), detail=lower_first(event["detail"]),
        idx_location=idx["location"], idx_date=idx["date"], idx_entity=idx["entity"], idx_content=idx["content"])


def chapter_messages(event: Mapping[str, str], meta: MetaEvent, style_adjectives: Sequence[str],
                     universe: str = "default") -> list[Message]:
    return [{"role": "system", "content": WRITER_SYSTEM_PROMPT},
            {"role": "user", "content": chapter_user_prompt(event, meta, style_adjectives, universe)}]


def verification_messages(candidate: str) -> list[Message]:
    return [{"role": "system", "content": CHECKER_SYSTEM_PROMPT},
            {"role": "user", "content": CHECKER_USER_TEMPLATE.format(chapter=candidate)}]
