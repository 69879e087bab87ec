"""The memory systems nobody here wrote (engine/benchmark/memory/adapters/),
driven through their real libraries on the short published book, offline.

mem0 talks to an OpenAI-compatible server on loopback (engine/loopback/,
which refuses what the real API refuses) whose chat replies are the built-in
reader's (its JSON mode for mem0's extraction) and whose embeddings are its
hashed bag of words; LanceDB embeds through the services with the real
MiniLM (providers/local_embed.py). The ground truth (which chapters match a
question) comes from the published book, never from the systems. Every
socket opened meanwhile is checked to be on loopback: nothing phones home.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from engine.benchmark.builtin import reader
from engine.benchmark.evaluation.questions import Question, build_questions
from engine.benchmark.generation.published import load_book
from engine.benchmark.memory.contract import Budget, Chapter, MemoryError, MemorySystem
from engine.loopback.server import LoopbackServer
from providers import local_embed

BOOK = "synaptic-echoes-short"
CHAT_MODEL, EMBED_MODEL = "builtin:reader", "local:minilm"
BUDGET = Budget(passages=12, tokens=None)  # the paper's rag-paragraph top-K on the short book


def needs(module: str, extra: str) -> None:
    """Skip without the system's library, except in CI (CI=true), where that fails: .ci/run installs the extras."""
    if find_spec(module) is None:
        why = f"{module} is not installed (pip install -e '.[{extra}]')"
        if os.environ.get("CI") == "true":
            pytest.fail(f"the memory adapters' tests need their libraries in CI: {why}")
        pytest.skip(why)


def mem0_installed() -> None:
    needs("mem0", "mem0")


def lancedb_installed() -> None:
    needs("lancedb", "lancedb")


def graphiti_installed() -> None:
    needs("graphiti_core", "graphiti")
    needs("kuzu", "graphiti")


# -- the book, its questions, and the ground truth Tulving keeps ----------------------

@pytest.fixture(scope="module")
def book():
    return load_book(BOOK)


@pytest.fixture(scope="module")
def chapters(book) -> list[Chapter]:
    return [Chapter(id=k, text=text) for k, text in enumerate(book.chapter_texts, 1)]


def single_chapter_questions(book) -> list[Question]:
    """Per chapter, the question that matches it alone with the most cue
    fields (date, location, entity, content): the chapter a retriever must find."""
    picked: dict[int, Question] = {}
    for q in build_questions(book):
        if q.n_chapters != 1:
            continue
        best = picked.get(q.chapters[0])
        if best is None or q.cue.count("*") < best.cue.count("*"):
            picked[q.chapters[0]] = q
    return [picked[k] for k in sorted(picked)]


# -- what Tulving lends a system (contract.MemoryServices), over loopback -------------

@dataclass
class LoopbackServices:
    """MemoryServices for a test: chat through the built-in reader, embeddings
    through the real MiniLM, and an OpenAI-compatible endpoint on loopback."""

    workdir: Path
    openai_base_url: str | None
    openai_api_key: str | None
    chat_model: str | None = CHAT_MODEL
    embed_model: str | None = EMBED_MODEL
    models: Sequence[str] = (CHAT_MODEL, EMBED_MODEL)
    embedded: list[str] = field(default_factory=list)

    async def chat(self, messages: Sequence[Mapping[str, str]], *, model: str | None = None,
                   temperature: float | None = None, max_tokens: int | None = None,
                   response_format: Mapping[str, object] | None = None) -> str:
        return reader.respond(messages, {"response_format": response_format} if response_format else {})

    async def embed(self, texts: Sequence[str], *, model: str | None = None) -> np.ndarray:
        self.embedded.extend(texts)
        return await asyncio.to_thread(local_embed.encode, list(texts))


def reader_reply(api: str, body: dict) -> str:
    schema = (body.get("response_format") or {}).get("json_schema") or {}
    ASKED.append(schema.get("name") or (body.get("response_format") or {}).get("type") or "text")
    return reader.respond(body["messages"], body)


ASKED: list[str] = []  # what each chat call asked for: a json_schema's name, "json_object" or "text"


@pytest.fixture
async def endpoint():
    key = "sk-run-" + secrets.token_hex(8)
    async with LoopbackServer(reply=reader_reply, api_keys=[key], embed_dim=384, models=[CHAT_MODEL, EMBED_MODEL],
                              tokens="cheap") as server:
        yield server, key


@pytest.fixture
def services(tmp_path, endpoint):
    server, key = endpoint
    return LoopbackServices(workdir=tmp_path / "memory", openai_base_url=server.openai_base_url, openai_api_key=key)


# -- nothing leaves the machine -----------------------------------------------------

_connections: list[object] = []
_watching = False


def _audit(event: str, args: tuple) -> None:
    if _watching and event == "socket.connect":
        _connections.append(args[1])


sys.addaudithook(_audit)


@pytest.fixture
def no_outside_connections():
    """Every socket.connect made during the test goes to a loopback address (or a Unix socket)."""
    global _watching
    _connections.clear()
    _watching = True
    yield _connections
    _watching = False
    outside = [a for a in _connections if isinstance(a, tuple) and not _is_loopback(str(a[0]))]
    assert not outside, f"connections outside loopback: {outside}"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def test_the_audit_hook_sees_a_connection_outside_loopback(no_outside_connections):
    with socket.socket() as s:
        s.setblocking(False)
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed; the hook fires before any packet
        except OSError:
            pass
    assert ("192.0.2.1", 9) in no_outside_connections
    no_outside_connections.clear()


# -- declared, and imported only when opened ------------------------------------------

ADAPTERS = {
    "mem0": "engine.benchmark.memory.adapters.mem0_memory:Mem0Memory",
    "mem0-extract": "engine.benchmark.memory.adapters.mem0_memory:Mem0ExtractMemory",
    "lancedb": "engine.benchmark.memory.adapters.lancedb_memory:LanceDBMemory",
    "graphiti": "engine.benchmark.memory.adapters.graphiti_memory:GraphitiMemory",
}


def test_each_adapter_is_an_entry_point_of_tulving_memories():
    mem0_installed()
    lancedb_installed()
    graphiti_installed()
    declared = {ep.name: ep for ep in entry_points(group="tulving.memories")}
    for name, value in ADAPTERS.items():
        assert declared[name].value == value
        system = declared[name].load()(name=name, options={})
        assert isinstance(system, MemorySystem) and system.requires and system.description
        assert system.unavailable() is None  # their extras are installed here (.ci/run)


def test_importing_the_adapters_imports_none_of_their_libraries():
    modules = sorted({v.split(":")[0] for v in ADAPTERS.values()})
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            "print([m for m in ('mem0', 'qdrant_client', 'lancedb', 'pyarrow', 'openai', 'graphiti_core', 'kuzu')"
            " if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


# -- LanceDB ----------------------------------------------------------------------------

def paper_paragraph_chunks(book) -> list[tuple[int, str]]:
    from engine.benchmark.evaluation.rag import paragraph_chunks

    return [(int(c.split(",", 1)[0].removeprefix("Chapter ")), c) for c in paragraph_chunks(book.text)]


async def test_lancedb_finds_exactly_the_nearest_paragraphs_and_the_questions_chapter(
        book, chapters, services, no_outside_connections):
    lancedb_installed()
    from engine.benchmark.memory.adapters.lancedb_memory import LanceDBMemory

    system = LanceDBMemory(name="lancedb")
    await system.open(services)
    await system.ingest(chapters)
    await system.ready()
    chunks = paper_paragraph_chunks(book)
    assert services.embedded == [c for _, c in chunks]  # the paper's paragraph chunks, in book order
    vectors = local_embed.encode([c for _, c in chunks])
    questions = single_chapter_questions(book)
    assert len(questions) >= 8
    found_chapter = 0
    for q in questions:
        recall = await system.recall(q.question, BUDGET)
        assert len(recall.passages) == BUDGET.passages
        cosines = vectors @ local_embed.encode([q.question])[0]
        kth = np.sort(cosines)[-BUDGET.passages]
        by_text = {c: (k, float(cosines[i])) for i, (k, c) in enumerate(chunks)}
        for passage in recall.passages:
            chapter, cosine = by_text[passage.text]
            assert passage.chapter == chapter
            assert passage.score == pytest.approx(cosine, abs=1e-4) and cosine >= kth - 1e-4  # exact top-k
        found_chapter += q.chapters[0] in {p.chapter for p in recall.passages}
    assert found_chapter >= len(questions) - 2, f"{found_chapter}/{len(questions)} questions found their chapter"
    await system.close()
    assert (services.workdir / "lancedb" / "passages.lance").is_dir()  # a database on disk, not a list in memory


# -- mem0 -------------------------------------------------------------------------------

def chat_bodies(server: LoopbackServer) -> int:
    return server.stats.by_path.get("/v1/chat/completions", 0)


async def test_mem0_stores_each_paragraph_as_it_is_and_searches_it(
        book, chapters, services, endpoint, no_outside_connections, monkeypatch):
    mem0_installed()
    from engine.benchmark.memory.adapters.mem0_memory import USER_ID, Mem0Memory

    monkeypatch.setenv("OPENAI_BASE_URL", "http://192.0.2.1/v1")  # must not be used: the config names the endpoint
    server, _ = endpoint
    system = Mem0Memory(name="mem0")
    await system.open(services)
    await system.ingest(chapters)
    await system.ready()
    stored = (await system._memory.get_all(filters={"user_id": USER_ID}, top_k=1000))["results"]
    chunks = dict((c, k) for k, c in paper_paragraph_chunks(book))
    assert sorted(m["memory"] for m in stored) == sorted(chunks)
    assert all(m["metadata"]["chapter"] == chunks[m["memory"]] for m in stored)
    assert chat_bodies(server) == 0  # infer=False: mem0 never called its LLM
    questions = single_chapter_questions(book)
    found = 0
    for q in questions:
        recall = await system.recall(q.question, BUDGET)
        assert 0 < len(recall.passages) <= BUDGET.passages
        assert all(chunks[p.text] == p.chapter for p in recall.passages)
        found += q.chapters[0] in {p.chapter for p in recall.passages}
    assert found >= 0.9 * len(questions), f"{found}/{len(questions)}"
    await system.close()
    assert (services.workdir / "qdrant").is_dir() and (services.workdir / "history.db").is_file()


async def test_mem0_extraction_runs_its_whole_pipeline_offline(
        book, chapters, services, endpoint, no_outside_connections):
    mem0_installed()
    from engine.benchmark.memory.adapters.mem0_memory import USER_ID, Mem0ExtractMemory

    server, _ = endpoint
    system = Mem0ExtractMemory(name="mem0-extract")
    await system.open(services)
    await system.ingest(chapters)
    assert chat_bodies(server) == len(chapters)  # one extraction call per chapter
    stored = (await system._memory.get_all(filters={"user_id": USER_ID}, top_k=5000))["results"]
    assert len(stored) > 2 * len(chapters)
    flat = {c.id: " ".join(c.text.split()) for c in chapters}
    # Each memory is sentences of its own chapter, verbatim: extracted from it and labelled with it.
    wrong = [m for m in stored if " ".join(m["memory"].split()) not in flat[m["metadata"]["chapter"]]]
    assert not wrong, wrong[:3]
    questions = single_chapter_questions(book)
    found = 0
    for q in questions:
        recall = await system.recall(q.question, BUDGET)
        found += q.chapters[0] in {p.chapter for p in recall.passages}
    assert found >= 0.75 * len(questions), f"{found}/{len(questions)}"
    await system.close()


async def test_mem0_without_the_runs_endpoint_says_so_in_one_line(tmp_path):
    from engine.benchmark.memory.adapters.mem0_memory import Mem0ExtractMemory, Mem0Memory

    with pytest.raises(MemoryError, match=r"^memory system 'mem0' failed at open: mem0 needs the run's OpenAI"):
        await Mem0Memory(name="mem0").open(LoopbackServices(tmp_path, None, None))
    no_chat = LoopbackServices(tmp_path, "http://127.0.0.1:9/v1", "k", chat_model=None)
    with pytest.raises(MemoryError, match="needs a chat model for its extraction"):
        await Mem0ExtractMemory(name="x").open(no_chat)
    with pytest.raises(MemoryError, match=r"option unit = 'page'"):
        await Mem0Memory(name="x", options={"unit": "page"}).open(LoopbackServices(tmp_path, "http://127.0.0.1:9/v1", "k"))


def test_the_reader_json_mode_answers_mem0s_own_extraction_prompt(book):
    """mem0's prompt builder (the installed version's), not a copy of it."""
    mem0_installed()
    from mem0.configs.prompts import ADDITIVE_EXTRACTION_PROMPT, generate_additive_extraction_prompt
    from mem0.memory.utils import parse_messages

    paragraphs = [p for p in book.chapter_texts[2].split("\n") if p.strip()]
    user = generate_additive_extraction_prompt(
        existing_memories=[{"id": "0", "text": "an older memory."}],
        new_messages=parse_messages([{"role": "user", "content": p} for p in paragraphs]),
        last_k_messages=[{"role": "user", "content": "An earlier paragraph."}])
    reply = reader.respond([{"role": "system", "content": ADDITIVE_EXTRACTION_PROMPT}, {"role": "user", "content": user}],
                           {"response_format": {"type": "json_object"}})
    texts = [m["text"] for m in json.loads(reply)["memory"]]
    assert " ".join(texts) == " ".join(" ".join(p.split()) for p in paragraphs)


# -- graphiti on Kuzu ---------------------------------------------------------------------

async def test_graphiti_builds_its_graph_on_kuzu_and_recalls_facts_of_their_own_chapters(
        book, chapters, services, endpoint, no_outside_connections):
    graphiti_installed()
    from engine.benchmark.memory.adapters.graphiti_memory import GraphitiMemory

    server, _ = endpoint
    ASKED.clear()
    system = GraphitiMemory(name="graphiti")
    await system.open(services)
    await system.ingest(chapters)
    # Its own pipeline, through the endpoint: entities and facts extracted per chapter (structured outputs).
    assert ASKED.count("ExtractedEntities") == ASKED.count("ExtractedEdges") == len(chapters)
    assert chat_bodies(server) == len(ASKED) and "text" not in ASKED
    flat = {c.id: " ".join(c.text.split()) for c in chapters}
    found, passages = 0, 0
    for q in single_chapter_questions(book):
        recall = await system.recall(q.question, BUDGET)
        assert len(recall.passages) <= BUDGET.passages
        for passage in recall.passages:  # a fact is a sentence of the chapter graphiti says it came from
            assert passage.chapter is not None and passage.text in flat[passage.chapter], passage
        passages += len(recall.passages)
        found += q.chapters[0] in {p.chapter for p in recall.passages}
    assert passages > 0 and found >= 3, (found, passages)
    await system.close()
    assert (services.workdir / "graph.kuzu").exists()
