"""The published release's folder layout, as the reference code writes and reads it.

The release (figshare DOI 10.6084/m9.figshare.28244480, reference README,
"Available Benchmarks") is the reference's `epbench/data` folder, zipped:

    U{universe}_S{styles}_seed{seed}/                     data_folder_experiment_func
        events.json, meta_events.json                     generate_1_events_and_meta_events.py
        books/model_{writer}_itermax_{n}_I{indexing}_nbchapters_{c}_nbtokens_{t}/
            book.json                                     the book text, one JSON string
            df_book_groundtruth.parquet                   one row per chapter
            df_qa.parquet                                 the question table
        answers/<the book folder's name>/
            answered_by_kind_prompting_model_{m}
            answered_by_kind_rag_model_{m}_chunk_{paragraph|chapter}_top{k}
            answered_by_kind_ftuning_model_{m}_fpolicy_{single|all}
                raw_answers/{q}.json           the answer text (JSON string)
                evaluated_answers/{q}.json     the judge's evaluation (dict)
                chronological_answers/{q}.json the chronological judgment (chronological questions)

Followed files (ahstat/episodic-memory-benchmark): epbench/src/io/io.py (every
folder and file name above), epbench/src/generation/benchmark_generation_wrapper.py
(book.json and the parquet files), generate_1_events_and_meta_events.py
(events.json: lists [t, s, e, c, detail]; meta_events.json), generate_4_books.py
(build_chapter: df_book_groundtruth's columns), qa_generation.py (df_qa's
columns), evaluation/generator_answers_1_prompting.py and scoring_answers.py
(the answer, evaluation and chronological files), README.md (the 11 books).

`{q}` is the row position in df_qa (not its `q_idx` column, which is the
template). The number of events behind a book is not in its folder name: it is
the size class its chapter count falls in (20, 200 or 2,000 events), checked
against the largest event index the book uses.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from providers.base import TulvingError

DOI = "10.6084/m9.figshare.28244480"
DOI_URL = f"https://doi.org/{DOI}.v1"
# figshare's download of the whole article (version 1): a zip. Not reachable from
# the machine this was written on: see docs/release.md.
DOWNLOAD_URL = "https://figshare.com/ndownloader/articles/28244480/versions/1"
WRITER_CLAUDE = "claude-3-5-sonnet-20240620"
WRITER_GPT4O = "gpt-4o-2024-05-13"
EVENT_SIZES = (20, 200, 2000)

BOOK_JSON = "book.json"
GROUNDTRUTH = "df_book_groundtruth.parquet"
QA = "df_qa.parquet"


class ReleaseError(TulvingError):
    """An archive or folder that is not the published release's layout."""


@dataclass(frozen=True, slots=True)
class Published:
    """One of the 11 released books, and the Tulving name it is installed under."""

    name: str
    experiment: str        # U{universe}_S{styles}_seed{seed}
    writer: str
    n_events: int
    universe: str          # Tulving's universe (engine/benchmark/data/universes/)
    universe_seed: int


CATALOGUE: tuple[Published, ...] = (
    Published("synaptic-echoes-short", "Udefault_Sdefault_seed0", WRITER_CLAUDE, 20, "default", 0),
    Published("synaptic-echoes", "Udefault_Sdefault_seed0", WRITER_CLAUDE, 200, "default", 0),
    Published("synaptic-echoes-1m", "Udefault_Sdefault_seed0", WRITER_CLAUDE, 2000, "default", 0),
    Published("synaptic-echoes-ordered-short", "UdefaultOrdered_Sdefault_seed0", WRITER_CLAUDE, 20, "default", 0),
    Published("synaptic-echoes-ordered", "UdefaultOrdered_Sdefault_seed0", WRITER_CLAUDE, 200, "default", 0),
    Published("synaptic-echoes-gpt4o-short", "Udefault_Sdefault_seed0", WRITER_GPT4O, 20, "default", 0),
    Published("synaptic-echoes-gpt4o", "Udefault_Sdefault_seed0", WRITER_GPT4O, 200, "default", 0),
    Published("synaptic-echoes-news-short", "Unews_Snews_seed1", WRITER_CLAUDE, 20, "news", 0),
    Published("synaptic-echoes-news", "Unews_Snews_seed1", WRITER_CLAUDE, 200, "news", 0),
    Published("synaptic-echoes-scifi-short", "Uscifi_Sscifi_seed2", WRITER_CLAUDE, 20, "scifi", 0),
    Published("synaptic-echoes-scifi", "Uscifi_Sscifi_seed2", WRITER_CLAUDE, 200, "scifi", 0),
)
EXPERIMENTS = tuple(dict.fromkeys(p.experiment for p in CATALOGUE))

_BOOK_DIR = re.compile(r"^model_(?P<writer>.+)_itermax_(?P<itermax>\d+)_I(?P<indexing>[^_]+)"
                       r"_nbchapters_(?P<chapters>\d+)_nbtokens_(?P<tokens>\d+)$")
_ANSWER_DIR = re.compile(r"^answered_by_kind_(?P<kind>prompting|rag|ftuning)_model_(?P<rest>.+)$")
_RAG_TAIL = re.compile(r"^(?P<model>.+)_chunk_(?P<chunk>paragraph|chapter)_top(?P<top>\d+)$")
_FT_TAIL = re.compile(r"^(?P<model>.+)_fpolicy_(?P<policy>single|all)$")


@dataclass(frozen=True, slots=True)
class ReleaseBook:
    """A book folder found in the release."""

    published: Published
    folder: Path           # .../books/<book dir>
    itermax: int
    n_chapters: int
    n_tokens: int
    indexing: str = "default"

    @property
    def experiment_dir(self) -> Path:
        return self.folder.parent.parent

    @property
    def answers_dir(self) -> Path:
        return self.experiment_dir / "answers" / self.folder.name


@dataclass(frozen=True, slots=True)
class AnswerDir:
    """One answering configuration of a book: a model in a memory mode."""

    folder: Path
    model: str
    mode: str              # Tulving's mode name
    kind: str              # the reference's kind


def size_class(n_chapters: int) -> int:
    """The number of events a book of n_chapters valid chapters was written from."""
    for size in EVENT_SIZES:
        if n_chapters <= size:
            return size
    raise ReleaseError(f"a book of {n_chapters} chapters: more than the release's largest (2000 events)")


def parse_book_dir(name: str) -> dict[str, str] | None:
    m = _BOOK_DIR.match(name)
    return m.groupdict() if m else None


def find_root(folder: Path, depth: int = 3) -> Path:
    """The folder holding the experiment folders: the given one, or one up to
    `depth` levels below it (a zip often wraps them in `data/` or
    `episodic-memory-benchmark/epbench/data/`)."""
    level = [folder]
    for _ in range(depth + 1):
        for candidate in level:
            if any((candidate / e).is_dir() for e in EXPERIMENTS):
                return candidate
        level = [c for f in level for c in sorted(f.iterdir()) if c.is_dir() and not c.name.startswith(".")]
    raise ReleaseError(f"{folder}: unknown layout: none of {', '.join(EXPERIMENTS)} found "
                       "(not the published release)")


def _candidates(books: Path, pub: Published) -> list[ReleaseBook]:
    if not books.is_dir():
        return []
    out = []
    for folder in sorted(books.iterdir()):
        parts = parse_book_dir(folder.name)
        if parts is None or parts["writer"] != pub.writer or int(parts["chapters"]) > EVENT_SIZES[-1]:
            continue
        if size_class(int(parts["chapters"])) != pub.n_events:
            continue
        out.append(ReleaseBook(pub, folder, int(parts["itermax"]), int(parts["chapters"]), int(parts["tokens"]),
                               parts["indexing"]))
    return out


def find_books(root: Path) -> list[ReleaseBook]:
    """Every book folder of the catalogue present under root (release order)."""
    found = []
    for pub in CATALOGUE:
        candidates = _candidates(root / pub.experiment / "books", pub)
        # the published books use the default indexing; another one is a variant
        preferred = [b for b in candidates if b.indexing == "default"] or candidates
        found.extend(preferred)
    if not found:
        raise ReleaseError(f"{root}: unknown layout: no book folder (books/model_..._nbchapters_..._nbtokens_...)")
    names = [b.published.name for b in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ReleaseError(f"{root}: several book folders for {', '.join(twice)}: cannot tell which is published")
    return found


def answer_mode(name: str) -> tuple[str, str, str] | None:
    """(model, Tulving mode, reference kind) of an answers folder name, or None."""
    m = _ANSWER_DIR.match(name)
    if m is None:
        return None
    kind, rest = m["kind"], m["rest"]
    if kind == "prompting":
        return rest, "in-context", kind
    if kind == "rag":
        tail = _RAG_TAIL.match(rest)
        return (tail["model"], f"rag-{tail['chunk']}", kind) if tail else None
    tail = _FT_TAIL.match(rest)
    if tail is None:
        return None
    # The paper fine-tuned on single-event questions ("single"); a model tuned on
    # every question ("all") is kept apart by its name.
    model = tail["model"] if tail["policy"] == "single" else f"{tail['model']}-fpolicy-all"
    return model, "finetuned", kind


def answer_dirs(book: ReleaseBook) -> list[AnswerDir]:
    """The answering configurations recorded for a book (none: an empty list)."""
    if not book.answers_dir.is_dir():
        return []
    out = []
    for folder in sorted(book.answers_dir.iterdir()):
        parsed = answer_mode(folder.name)
        if parsed is not None and (folder / "raw_answers").is_dir():
            out.append(AnswerDir(folder, parsed[0], parsed[1], parsed[2]))
    return out
