"""The response cache through real SQLite files: keys, hits and misses,
chunked long texts, vectors, explain, prune, export/import, bad files."""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import threading
from datetime import UTC

import numpy as np
import orjson
import pytest

from cache import admin
from cache.chunks import split_text
from cache.keys import canonical_bytes, request_key
from cache.store import CacheError, ResponseCache, entry_checksum
from engine.cli import cache as command
from engine.config import Config
from engine.errors import TulvingError
from engine.requests import ChatRequest, EmbedRequest
from engine.resolve import resolve
from providers.base import ChatResult, EmbedResult

CONFIG = Config.load(None)
SYSTEM = {"role": "system", "content": "You are an expert in memory tests."}


def chat_identity(**changes):
    identity = {"op": "chat", "kind": "openai", "base_url": "https://api.openai.com/v1", "model": "gpt-4o",
                "params": {"temperature": 1.0, "max_tokens": 4096},
                "messages": [SYSTEM, {"role": "user", "content": "Where was Jackson Ramos?"}], "draw": 0}
    identity.update(changes)
    return identity


def make_book(seed: int = 0, chapters: int = 120) -> str:
    """~500 KB in the protocol's book layout: chapters of paragraphs."""
    rng = random.Random(seed)
    words = "the of memory chapter event witnessed london paris garden museum storm quiet letter".split()
    return "\n\n\n".join(f"Chapter {k}\n\n" + "\n\n".join(" ".join(rng.choices(words, k=rng.randint(60, 160)))
                                                          for _ in range(rng.randint(3, 8)))
                         for k in range(1, chapters + 1))


def cli(cache_path, *argv, config=None):
    parser = argparse.ArgumentParser(prog="tulving")
    parser.add_argument("--cache")
    parser.add_argument("--config")
    command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["--cache", str(cache_path), *(["--config", str(config)] if config else []), *argv])
    return args.func(args)


# -- keys -------------------------------------------------------------------------
def test_key_normalises_numbers_and_containers():
    base = request_key(chat_identity())
    assert request_key(chat_identity(params={"temperature": 1, "max_tokens": 4096.0})) == base
    assert request_key(chat_identity(params={"max_tokens": 4096, "temperature": 1.0})) == base  # key order
    assert request_key(chat_identity(messages=(SYSTEM, {"content": "Where was Jackson Ramos?", "role": "user"}))) == base
    assert request_key(chat_identity(params={"temperature": 0.0, "max_tokens": 1})) == \
        request_key(chat_identity(params={"temperature": -0.0, "max_tokens": 1}))
    assert request_key(chat_identity(params={"temperature": 1.5, "max_tokens": 4096})) != base
    assert request_key(chat_identity(draw=True)) != request_key(chat_identity(draw=1))  # booleans stay booleans
    with pytest.raises(ValueError):
        request_key(chat_identity(params={"temperature": float("nan")}))


def test_key_changes_with_every_field():
    variants = [
        chat_identity(),
        chat_identity(kind="anthropic"),
        chat_identity(base_url="http://gpu-a:8000/v1"),
        chat_identity(model="gpt-4o-mini"),
        chat_identity(params={"temperature": 0.7, "max_tokens": 4096}),
        chat_identity(params={"temperature": 1.0, "max_tokens": 256}),
        chat_identity(params={"temperature": 1.0, "max_tokens": 4096, "seed": 1}),
        chat_identity(messages=[SYSTEM, {"role": "user", "content": "Where was Jackson Ramos!"}]),
        chat_identity(messages=[SYSTEM, {"role": "assistant", "content": "Where was Jackson Ramos?"}]),
        chat_identity(messages=[{"role": "user", "content": "Where was Jackson Ramos?"}, SYSTEM]),
        chat_identity(draw=1),
        chat_identity(op="embed"),
    ]
    assert len({request_key(v) for v in variants}) == len(variants)


def test_key_ignores_credentials_timeouts_and_retries():
    def key_with(**endpoint):
        config = Config.from_dicts(
            {"vllm": {"kind": "openai", "base_url": "http://gpu:8000/v1", **endpoint}},
            {"llama": {"endpoint": "vllm", "model": "llama-70b", "params": {"temperature": 1.0}}})
        return resolve(config, ChatRequest(model="llama", messages=[SYSTEM])).key

    assert key_with() == key_with(key_env="SECRET_KEY", timeout=5, max_attempts=2, max_concurrency=3, rpm=10)


def test_resolve_keys_equal_the_keys_of_their_identities():
    # engine/resolve.py normalises only the parts that may need it; its key
    # must be the key of the whole identity whatever the request holds.
    config = Config.from_dicts(
        {"ep": {"kind": "openai", "base_url": "http://gpu:8000/v1"}},
        {"plain": {"endpoint": "ep", "model": "m", "params": {"temperature": 1.0, "max_tokens": 64}},
         "floaty": {"endpoint": "ep", "model": "m", "params": {"temperature": 0.5, "top_p": np.float32(0.5)}}})
    user = {"role": "user", "content": "Where was Jackson Ramos?"}
    requests = [
        ChatRequest(model="plain", messages=[SYSTEM, user]),
        ChatRequest(model="plain", messages=[SYSTEM, user], draw=3),
        ChatRequest(model="plain", messages=[user], draw=np.int64(3)),
        ChatRequest(model="plain", messages=[user], draw=True),
        ChatRequest(model="plain", messages=[user], temperature=0.0, max_tokens=8.0, stop=("\n",)),
        ChatRequest(model="plain", messages=[user], extra={"logit_bias": {"42": -1.0}, "n": 1.0}),
        ChatRequest(model="floaty", messages=[SYSTEM, user]),
        EmbedRequest(model="plain", texts=("a", "b")),
    ]
    keys = set()
    for request in requests:
        resolved = resolve(config, request)
        assert resolved.key == request_key(resolved.identity), request
        assert resolved.canonical in (b"", canonical_bytes(resolved.identity))
        keys.add(resolved.key)
    assert len(keys) == len(requests)
    assert resolve(config, requests[2]).key == resolve(config, ChatRequest(model="plain", messages=[user], draw=3)).key


def test_keys_of_long_texts_hashed_in_pieces_equal_the_keys_of_their_identities():
    # Texts over 64 KB are serialised from a copy (cache.keys.key_and_canonical):
    # the key must be the one of the identity itself, whatever they hold.
    rng = random.Random(7)
    alphabet = "abc \n\n\"\\\x00\x1f\u2028é—’\U0001f600"
    def text(n):
        return "".join(rng.choice(alphabet) for _ in range(n))
    nul_text = "\x00stop\x00"
    requests = [
        ChatRequest(model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": make_book(seed=3) + "\n\nWhen?"}]),
        ChatRequest(model="gpt-4o", messages=[{"role": "user", "content": text(70_000)}, {"role": "user", "content": text(150_000)}]),
        ChatRequest(model="gpt-4o", messages=[{"role": "user", "content": text(70_000)}], extra={"stop": [nul_text]}),
        ChatRequest(model="gpt-4o", messages=[{"role": "user", "content": nul_text + text(70_000)}], draw=2),
        EmbedRequest(model="gpt-4o", texts=("short", text(80_000))),
    ]
    for request in requests:
        resolved = resolve(CONFIG, request)
        assert resolved.key == request_key(resolved.identity)
        assert resolved.canonical == b""


def test_resolving_a_book_prompt_leaves_no_copy_of_it_behind():
    # Serialising a non-ASCII str whole caches a UTF-8 copy inside it for its
    # life: every prompt pulled ahead would hold the book twice.
    import tracemalloc

    book = make_book(seed=4).replace("storm", "tempête")
    assert len(book) > 400_000
    tracemalloc.start()
    try:
        prompt = book + "\n\nWhere was Jackson Ramos?"
        before = tracemalloc.get_traced_memory()[0]
        resolved = resolve(CONFIG, ChatRequest(model="gpt-4o", messages=[SYSTEM, {"role": "user", "content": prompt}]))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert resolved.messages[1]["content"] is prompt
    assert held < len(prompt) // 4, held


# -- store ------------------------------------------------------------------------
async def test_hits_and_misses_persist_across_instances(tmp_path):
    path = tmp_path / "deep" / "dir" / "cache.sqlite"
    identities = [chat_identity(draw=i) for i in range(1200)]
    keys = [request_key(i) for i in identities]
    async with ResponseCache(path) as cache:
        for i, (key, identity) in enumerate(zip(keys, identities)):
            if i % 3:  # every third one is never cached
                cache.put(key, identity, ChatResult(text=f"reply {i}", input_tokens=i, finish_reason="stop"))
        await cache.flush()
    async with ResponseCache(path) as cache:
        found = await cache.get_many(keys + ["0" * 64])
        assert set(found) == {k for i, k in enumerate(keys) if i % 3}
        assert found[keys[4]] == ChatResult(text="reply 4", input_tokens=4, finish_reason="stop")
        assert await cache.get(keys[0]) is None
        assert await cache.get(keys[5]) == ChatResult(text="reply 5", input_tokens=5, finish_reason="stop")
        together = await asyncio.gather(*(cache.get(k) for k in keys[:30] + keys[:3]))  # looked up in one batch
        assert [r is not None for r in together] == [i % 3 != 0 for i in list(range(30)) + [0, 1, 2]]
        assert together[1] == together[31] and together[1] is not together[31]
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT count(*) FROM entries WHERE op = 'chat' AND model = 'gpt-4o'").fetchone()[0] == 800


def _cache_threads(before: frozenset[threading.Thread] = frozenset()) -> list[str]:
    """The cache threads running now that were not in `before` (another test's cache left open aside)."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("tulving-cache-") and t not in before)


async def test_a_cached_rerun_starts_no_thread_and_the_first_write_starts_the_writer(tmp_path):
    """Opening connects on the caller's thread; the writer starts with the
    first row, the reader thread with the first lookup sent to it: a rerun whose
    lookups all hit, read inline, never starts either (opening stays cheap)."""
    before = frozenset(threading.enumerate())
    path = tmp_path / "cache.sqlite"
    key = request_key(chat_identity())
    async with ResponseCache(path) as cache:
        assert _cache_threads(before) == []
        cache.put(key, chat_identity(), ChatResult(text="hello"))
        assert _cache_threads(before) == ["tulving-cache-write"]
    assert _cache_threads(before) == []
    async with ResponseCache(path) as cache:
        assert await cache.get_many([key]) == {key: ChatResult(text="hello")}
        await cache.flush()  # nothing put: nothing to wait for
        assert _cache_threads(before) == []
    async with ResponseCache(path, inline_read_seconds=0) as cache:  # every lookup on the reader thread
        assert await cache.get_many([key]) == {key: ChatResult(text="hello")}
        assert _cache_threads(before) == ["tulving-cache-read"]
    assert _cache_threads(before) == []


async def test_put_is_visible_before_the_commit_and_flush_commits(tmp_path):
    path = tmp_path / "cache.sqlite"
    async with ResponseCache(path, batch_seconds=60, batch_rows=10_000) as cache:
        key = request_key(chat_identity())
        cache.put(key, chat_identity(), ChatResult(text="hello"))
        assert await cache.get(key) == ChatResult(text="hello")
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT count(*) FROM entries").fetchone()[0] == 0
        await cache.flush()
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT json_extract(response, '$.text') FROM entries").fetchone()[0] == "hello"


async def test_a_stored_record_sets_only_the_fields_the_cache_keeps(tmp_path):
    """Records as another version may have written them: a key this one does
    not know is ignored, and a ChatResult field the cache never keeps
    (`batched`, which prices a reply at the batch discount) is not set from one."""
    path = tmp_path / "cache.sqlite"
    records = [{"text": "hello", "input_tokens": 3, "batched": True}, {"text": "hello", "input_tokens": 3, "from_later": 1}]
    keys = [request_key(chat_identity(draw=i)) for i in range(len(records))]
    async with ResponseCache(path) as cache:
        for i, key in enumerate(keys):
            cache.put(key, chat_identity(draw=i), ChatResult(text="hello", input_tokens=3))
        await cache.flush()
    with sqlite3.connect(path) as conn:
        for key, record in zip(keys, records):
            response = orjson.dumps(record).decode()
            conn.execute("UPDATE entries SET response = ?, checksum = ? WHERE key = ?",
                         (response, entry_checksum(key, response, None), key))
    async with ResponseCache(path) as cache:
        found = await cache.get_many(keys)
    assert [found[key] for key in keys] == [ChatResult(text="hello", input_tokens=3)] * 2
    assert not any(result.batched for result in found.values())


async def test_embedding_vectors_round_trip_exactly_and_compactly(tmp_path):
    rng = np.random.default_rng(0)
    single = rng.standard_normal((3, 384)).astype(np.float32).astype(float).tolist()  # float32 values
    double = rng.standard_normal((2, 1536)).tolist()
    ident_single = {"op": "embed", "kind": "local-embed", "base_url": None, "model": "minilm", "texts": ["a", "b", "c"]}
    ident_double = {**ident_single, "model": "text-embedding-3-small", "texts": ["a", "b"]}
    path = tmp_path / "cache.sqlite"
    async with ResponseCache(path) as cache:
        cache.put(request_key(ident_single), ident_single, EmbedResult(vectors=single, input_tokens=3))
        cache.put(request_key(ident_double), ident_double, EmbedResult(vectors=double, input_tokens=2))
    async with ResponseCache(path) as cache:
        found = await cache.get_many([request_key(ident_single), request_key(ident_double)])
    assert found[request_key(ident_single)] == EmbedResult(vectors=single, input_tokens=3)
    assert found[request_key(ident_double)] == EmbedResult(vectors=double, input_tokens=2)
    with sqlite3.connect(path) as conn:
        rows = dict(conn.execute("SELECT model, vector_dtype || ':' || length(vectors) FROM entries"))
    assert rows == {"minilm": f"<f4:{3 * 384 * 4}", "text-embedding-3-small": f"<f8:{2 * 1536 * 8}"}


def test_chunks_rebuild_the_text_and_a_shared_prefix_shares_its_chunks():
    book = make_book()
    prompts = [book + f"\n\nQuestion {i}: when did the storm reach {'paris ' * i}?" for i in range(40)]
    chunked = [split_text(p) for p in prompts]
    for prompt, chunks in zip(prompts, chunked):
        assert "".join(chunks) == prompt
    distinct = {c for chunks in chunked for c in chunks}
    assert sum(len(c) for c in distinct) <= len(book) + sum(len(p) - len(book) for p in prompts) + 20_000
    assert split_text("no breaks " * 20_000)  # a text without paragraph breaks is cut hard
    assert "".join(split_text("x" * 200_000)) == "x" * 200_000


async def test_a_book_in_686_prompts_is_stored_once(tmp_path):
    book = make_book(seed=1)
    assert len(book) > 450_000
    path = tmp_path / "cache.sqlite"
    resolved = [resolve(CONFIG, ChatRequest(model="gpt-4o", messages=[
        SYSTEM, {"role": "user", "content": f"{book}\n\nIn which locations did event {i} happen?"}]))
        for i in range(686)]
    async with ResponseCache(path) as cache:
        for r in resolved:
            cache.put(r.key, r.identity, ChatResult(text="London"))
    questions = sum(len(r.identity["messages"][1]["content"]) - len(book) for r in resolved)
    with sqlite3.connect(path) as conn:
        blob_bytes = conn.execute("SELECT sum(size) FROM blobs").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM entries").fetchone()[0] == 686
    assert len(book) <= blob_bytes <= len(book) + questions + 20_000, blob_bytes
    assert path.stat().st_size < 15 * len(book)  # not 686 copies
    conn = admin.open_existing(path)
    try:
        for r in (resolved[0], resolved[685]):
            assert admin.load_entry(conn, r.key).identity == r.identity  # rebuilt exactly
    finally:
        conn.close()


async def test_dollar_keys_in_a_request_are_stored_literally(tmp_path):
    identity = chat_identity(params={"temperature": 1.0, "response_format": {"$chunks": ["not", "a", "digest"]}},
                             messages=[{"role": "user", "content": "long " * 2000}])
    key = request_key(identity)
    async with ResponseCache(tmp_path / "c.sqlite") as cache:
        cache.put(key, identity, ChatResult(text="ok"))
    conn = admin.open_existing(tmp_path / "c.sqlite")
    try:
        assert admin.load_entry(conn, key).identity == identity
    finally:
        conn.close()


async def test_a_book_sized_identity_is_stored_as_its_serialisation_parsed_back_would_be(tmp_path):
    # The writer encodes a big identity from the identity itself (no copy of
    # its serialisation): the rows must be the ones the parsed-back path wrote
    # (the same identity text, the same chunks), so older caches stay alike.
    identity = chat_identity(params={"temperature": 1.0, "response_format": {"$chunks": ["x"], "b": 2.0, "a": [1.5]}},
                             messages=[SYSTEM, {"role": "user", "content": make_book(seed=2) + "\n\nWhen?"}])
    key = request_key(identity)
    rows = []
    for name, canonical in (("parsed.sqlite", canonical_bytes(identity)), ("direct.sqlite", None)):
        async with ResponseCache(tmp_path / name) as cache:
            cache.put(key, identity, ChatResult(text="ok"), canonical=canonical)
            cache.put(request_key({**identity, "draw": 1}), {**identity, "draw": 1}, ChatResult(text="again"))
        with sqlite3.connect(tmp_path / name) as conn:
            rows.append((conn.execute("SELECT key, identity FROM entries ORDER BY key").fetchall(),
                         conn.execute("SELECT digest, size, text FROM blobs ORDER BY digest").fetchall()))
    assert rows[0] == rows[1]
    assert len(rows[0][1]) > 10 and '"$literal"' in rows[0][0][0][1]
    conn = admin.open_existing(tmp_path / "direct.sqlite")
    try:
        assert admin.load_entry(conn, key).identity == identity
    finally:
        conn.close()


async def test_unopened_or_closed_cache_refuses_use(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    with pytest.raises(RuntimeError):
        cache.put("k", chat_identity(), ChatResult(text="x"))
    await cache.open()
    await cache.close()
    await cache.close()  # idempotent
    with pytest.raises(RuntimeError):
        await cache.get_many(["k"])


# -- bad files --------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"this is a text file, not a cache\n" * 40, b'{"a": 1}', b"\x00" * 4096])
async def test_a_file_that_is_not_a_cache_gives_a_one_line_error(tmp_path, content):
    path = tmp_path / "notes.sqlite"
    path.write_bytes(content)
    with pytest.raises(CacheError) as err:
        await ResponseCache(path).open()
    assert "not a Tulving cache" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(TulvingError) as err:
        cli(path, "cache", "stats")
    assert "\n" not in str(err.value)


async def test_another_sqlite_database_is_not_taken_over(tmp_path):
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE logs (id INTEGER)")
    with pytest.raises(CacheError, match="not a Tulving cache.*logs"):
        await ResponseCache(path).open()
    with sqlite3.connect(path) as conn:  # untouched
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["logs"]


def test_a_missing_cache_file_is_a_one_line_error(tmp_path):
    with pytest.raises(TulvingError, match="no cache file"):
        cli(tmp_path / "nope.sqlite", "cache", "stats")
    assert not (tmp_path / "nope.sqlite").exists()


# -- admin and CLI ----------------------------------------------------------------
async def fill(path, requests, response=lambda i: ChatResult(text=f"answer {i}")):
    resolved = [resolve(CONFIG, r) for r in requests]
    async with ResponseCache(path) as cache:
        for i, r in enumerate(resolved):
            cache.put(r.key, r.identity, response(i))
    return resolved


def question(i, book="", model="gpt-4o", **kw):
    return ChatRequest(model=model, messages=[SYSTEM, {"role": "user", "content": f"{book}Question {i}?"}], **kw)


async def test_stats_counts_entries_by_op_and_model(tmp_path, capsys):
    path = tmp_path / "c.sqlite"
    await fill(path, [question(i) for i in range(5)] + [question(i, model="gpt-4o-mini") for i in range(2)]
               + [EmbedRequest(model="text-embedding-3-small", texts=["a", "b"])],
               response=lambda i: ChatResult(text="x") if i < 7 else EmbedResult(vectors=[[0.5, 0.25], [1.0, 2.0]]))
    s = admin.stats(path)
    assert s["entries"] == 8 and s["oldest"] <= s["newest"]
    assert {(m["op"], m["model"]): m["entries"] for m in s["by_model"]} == {
        ("chat", "gpt-4o-2024-08-06"): 5, ("chat", "gpt-4o-mini-2024-07-18"): 2, ("embed", "text-embedding-3-small"): 1}
    assert cli(path, "cache", "stats") == 0
    out = capsys.readouterr().out
    assert "entries: 8" in out and "gpt-4o-mini-2024-07-18" in out


async def test_explain_names_the_differing_parameter_and_message(tmp_path, capsys):
    path = tmp_path / "c.sqlite"
    book = make_book(chapters=30) + "\n\n"
    await fill(path, [question(i, book) for i in range(20)])
    request = tmp_path / "request.json"

    request.write_text(json.dumps({"model": "gpt-4o", "messages": [SYSTEM, {"role": "user", "content": f"{book}Question 7?"}]}))
    cli(path, "cache", "explain", str(request))
    assert capsys.readouterr().out.startswith("hit: key ")

    request.write_text(json.dumps({"model": "gpt-4o", "temperature": 0.2,
                                   "messages": [SYSTEM, {"role": "user", "content": f"{book}Question 7?"}]}))
    cli(path, "cache", "explain", str(request))
    out = capsys.readouterr().out
    assert out.startswith("miss: key ")
    assert "params.temperature: cached 1, request 0.2" in out
    assert "messages" not in out  # the nearest entry has the same question 7

    request.write_text(json.dumps({"model": "gpt-4o", "draw": 2,
                                   "messages": [SYSTEM, {"role": "user", "content": f"{book}Question 7!"}]}))
    cli(path, "cache", "explain", str(request))
    out = capsys.readouterr().out
    assert f"messages[1].content: differs at character {len(book) + 10:,}" in out
    assert "draw: cached 0, request 2" in out
    assert "Question 7?'" in out and "Question 7!'" in out


async def test_explain_key_shows_one_entry(tmp_path, capsys):
    path = tmp_path / "c.sqlite"
    (r,) = await fill(path, [question(3)])
    cli(path, "cache", "explain", "--key", r.key)
    shown = json.loads(capsys.readouterr().out)
    assert shown["response"] == {"text": "answer 0", "finish_reason": "stop", "input_tokens": 0, "output_tokens": 0,
                                 "latency": 0.0, "request_id": None} and shown["identity"] == r.identity
    with pytest.raises(TulvingError, match="no entry with key"):
        cli(path, "cache", "explain", "--key", "f" * 64)


async def test_explain_rejects_malformed_requests(tmp_path):
    path = tmp_path / "c.sqlite"
    await fill(path, [question(1)])
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TulvingError, match="not valid JSON"):
        cli(path, "cache", "explain", str(bad))
    bad.write_text(json.dumps({"model": "gpt-4o", "messages": [SYSTEM], "temprature": 1}))
    with pytest.raises(TulvingError, match="unknown field"):
        cli(path, "cache", "explain", str(bad))
    bad.write_text(json.dumps({"model": "no-such-model", "messages": [SYSTEM]}))
    with pytest.raises(TulvingError, match="unknown model"):
        cli(path, "cache", "explain", str(bad))


async def test_export_import_round_trip_reproduces_keys_and_responses(tmp_path, capsys):
    source, target = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    book = make_book(chapters=20) + "\n\n"
    chats = await fill(source, [question(i, book) for i in range(30)])
    embeds = await fill(source, [EmbedRequest(model="local:minilm", texts=[f"text {i}", "x" * 6000])
                                 for i in range(3)],
                        response=lambda i: EmbedResult(vectors=[[0.1 * i, 0.2], [0.3, 1e-7]], input_tokens=4))
    export = tmp_path / "export.jsonl"
    cli(source, "cache", "export", str(export))
    assert "exported 33 entries" in capsys.readouterr().out
    lines = export.read_bytes().splitlines()
    assert orjson.loads(lines[0])["format"] == "tulving-cache-export"

    cli(target, "cache", "import", str(export))
    assert "imported 33 entries (0 already cached" in capsys.readouterr().out
    keys = [r.key for r in chats + embeds]
    async with ResponseCache(source) as a, ResponseCache(target) as b:
        assert await a.get_many(keys) == await b.get_many(keys)
        assert len(await b.get_many(keys)) == 33
    conn = admin.open_existing(target)
    try:
        for r in chats[:2] + embeds[:1]:
            entry = admin.load_entry(conn, r.key)
            assert entry.identity == r.identity and request_key(entry.identity) == r.key
    finally:
        conn.close()

    cli(target, "cache", "import", str(export))
    assert "imported 0 entries (33 already cached" in capsys.readouterr().out


async def test_import_rejects_a_tampered_or_foreign_file_and_imports_nothing(tmp_path):
    source, target = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    await fill(source, [question(i, make_book(chapters=10) + "\n\n") for i in range(3)])
    export = tmp_path / "export.jsonl"
    admin.export_jsonl(source, export)
    lines = export.read_bytes().splitlines()
    blob_line = next(i for i, line in enumerate(lines) if b'"blob"' in line)
    item = orjson.loads(lines[blob_line])
    item["text"] = item["text"].replace("the", "THE", 1)
    tampered = tmp_path / "tampered.jsonl"
    tampered.write_bytes(b"\n".join(lines[:blob_line] + [orjson.dumps(item)] + lines[blob_line + 1:]))
    with pytest.raises(TulvingError, match="does not match its digest"):
        admin.import_jsonl(target, tampered)
    entry = orjson.loads(lines[-1])
    entry["response"] = {"text": "forged"}
    entry["identity"]["draw"] = 5
    forged = tmp_path / "forged.jsonl"
    forged.write_bytes(b"\n".join(lines[:-1] + [orjson.dumps(entry)]))
    with pytest.raises(TulvingError, match="does not match its identity"):
        admin.import_jsonl(target, forged)
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"hello": "world"}\n')
    with pytest.raises(TulvingError, match="not a Tulving cache export"):
        cli(target, "cache", "import", str(foreign))
    with sqlite3.connect(target) as conn:
        assert conn.execute("SELECT count(*) FROM entries").fetchone()[0] == 0


async def test_prune_by_model_and_age_removes_orphaned_chunks(tmp_path, capsys):
    path = tmp_path / "c.sqlite"
    book_a, book_b = make_book(seed=2, chapters=40) + "\n\n", make_book(seed=3, chapters=40) + "\n\n"
    await fill(path, [question(i, book_a) for i in range(5)]
               + [question(i, book_b, model="gpt-4o-mini") for i in range(5)])
    before = admin.stats(path)
    cli(path, "cache", "prune", "--model", "gpt-4o-mini")  # an alias: its provider model name is stored
    out = capsys.readouterr().out
    assert "removed entries: 5 chat" in out
    after = admin.stats(path)
    assert [m["model"] for m in after["by_model"]] == ["gpt-4o-2024-08-06"]
    assert len(book_a) <= after["blob_bytes"] < before["blob_bytes"] - len(book_b) + 10_000
    assert after["file_bytes"] < before["file_bytes"]
    async with ResponseCache(path) as cache:  # the rest still reads back whole
        r = resolve(CONFIG, question(2, book_a))
        assert await cache.get(r.key) == ChatResult(text="answer 2")

    report = admin.prune(path, older_than_days=1)  # nothing is a day old
    assert report.entries == {} and report.blobs == 0
    report = admin.prune(path, older_than_days=1, now=__import__("time").time() + 2 * 86400)
    assert report.entries == {"chat": 5} and report.blob_bytes >= len(book_a)
    assert admin.stats(path)["entries"] == 0


async def test_a_response_json_cannot_hold_is_skipped_and_logged_not_fatal(tmp_path, caplog):
    good, bad = chat_identity(draw=1), chat_identity(draw=2)
    async with ResponseCache(tmp_path / "c.sqlite") as cache:
        cache.put(request_key(bad), bad, ChatResult(text={"a", "set"}))  # type: ignore[arg-type]
        cache.put(request_key(good), good, ChatResult(text="fine"))
        await cache.flush()
        assert cache.write_errors == 1
    async with ResponseCache(tmp_path / "c.sqlite") as cache:
        assert await cache.get_many([request_key(good), request_key(bad)]) == {request_key(good): ChatResult(text="fine")}
    assert "cannot store the response" in caplog.text


def test_iso_utc_matches_datetime_formatting():
    """The writer's fast timestamp equals what datetime prints, at second
    boundaries and at microsecond rounding edges."""
    import random
    from datetime import datetime

    from cache.store import iso_utc

    rng = random.Random(7)
    stamps = [1_700_000_000.0, 1_700_000_000.9999996, 1_700_000_000.0000004, 1_799_999_999.5]
    stamps += [rng.uniform(1.6e9, 1.9e9) for _ in range(2000)]
    for t in stamps:
        expected = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        assert iso_utc(t) == expected, t


async def test_writer_backlog_is_counted_and_waited_for(tmp_path):
    """The cache reports how much request text its writer still holds, and
    `wait_for_room` returns once the writer has stored enough of it."""
    book = "A paragraph of the book.\n\n" * 400  # 10,400 characters
    async with ResponseCache(tmp_path / "c.sqlite") as cache:
        for i in range(5):
            identity = {"op": "chat", "kind": "builtin", "base_url": None, "model": "reader", "params": {},
                        "messages": [{"role": "user", "content": book + f"Question {i}?"}], "draw": 0}
            cache.put(request_key(identity), identity, ChatResult(text=f"answer {i}"))
        assert cache.backlog_chars == 5 * len(book) + sum(len(f"Question {i}?") for i in range(5))
        await asyncio.wait_for(cache.wait_for_room(0), timeout=10)
        assert cache.backlog_chars == 0
        await cache.flush()
        assert cache.backlog_chars == 0


async def test_lookups_run_on_the_loop_while_fast_and_on_the_reader_thread_after_slow_ones_in_a_row(tmp_path, monkeypatch):
    """cache/store.py get_many: a batch's lookup is read on the event loop's
    thread; INLINE_SLOW_READS in a row over `inline_read_seconds` send every
    later lookup to the reader thread (slow reads between fast ones do not),
    as are lookups of many keys and those made while a read runs on the
    thread (one connection, one thread at a time)."""
    import threading

    import cache.store as store

    path = tmp_path / "cache.sqlite"
    identities = [chat_identity(draw=i) for i in range(store.INLINE_READ_KEYS + 100)]
    keys = [request_key(i) for i in identities]
    async with ResponseCache(path) as cache:
        for i, (key, identity) in enumerate(zip(keys, identities)):
            cache.put(key, identity, ChatResult(text=f"reply {i}", input_tokens=i))
    readers: list[str] = []
    real_read = store.read_results

    def read_results(*args):
        readers.append(threading.current_thread().name)
        return real_read(*args)

    monkeypatch.setattr(store, "read_results", read_results)
    loop_thread = threading.current_thread().name
    expected = {k: ChatResult(text=f"reply {i}", input_tokens=i) for i, k in enumerate(keys)}
    async with ResponseCache(path) as cache:
        assert await cache.get_many(keys[:100]) == {k: expected[k] for k in keys[:100]}
        assert readers == [loop_thread]
        # Many keys at once: the thread, however fast the storage.
        assert await cache.get_many(keys) == expected
        assert readers[1:] == ["tulving-cache-read"]
        # A small lookup made while the thread reads waits for the thread too.
        big, small = await asyncio.gather(cache.get_many(keys), cache.get_many(keys[:5]))
        assert big == expected and small == {k: expected[k] for k in keys[:5]}
        assert readers[2:] == ["tulving-cache-read", "tulving-cache-read"]
        # Slow reads (every read is, against this limit) not in a row: a
        # moment of a busy host, still inline.
        limit = cache.inline_read_seconds
        for _ in range(store.INLINE_SLOW_READS - 1):
            cache.inline_read_seconds = 1e-9
            assert await cache.get_many(keys[:3]) == {k: expected[k] for k in keys[:3]}
            cache.inline_read_seconds = limit
            assert await cache.get_many(keys[3:5]) == {k: expected[k] for k in keys[3:5]}
        assert readers[4:] == [loop_thread] * (2 * store.INLINE_SLOW_READS - 2)
        # INLINE_SLOW_READS slow reads in a row end the inline reads for good.
        del readers[:]
        cache.inline_read_seconds = 1e-9
        for _ in range(store.INLINE_SLOW_READS):
            assert await cache.get_many(keys[:3]) == {k: expected[k] for k in keys[:3]}
        assert await cache.get(keys[7]) == expected[keys[7]]
        assert readers == [loop_thread] * store.INLINE_SLOW_READS + ["tulving-cache-read"]
        assert cache.inline_read_seconds == 0
    del readers[:]
    async with ResponseCache(path, inline_read_seconds=0) as cache:  # 0: every lookup on the thread
        assert await cache.get_many(keys[:2]) == {k: expected[k] for k in keys[:2]}
        assert readers == ["tulving-cache-read"]


async def test_a_hit_is_checksummed_over_its_stored_bytes_whatever_its_characters(tmp_path):
    """read_results hashes the response's stored UTF-8 bytes, not the text
    decoded: any reply (accents, astral characters, JSON escapes) still
    matches `entry_checksum`; a changed byte, or bytes that are not UTF-8,
    are a miss, never a wrong answer or a failed lookup."""
    # The checksum of caches written since checksums began, pinned (sha256 of key NUL response [NUL vectors]).
    assert entry_checksum("0" * 64, '{"text":"Zoë 東京"}', None) == "f19f6016c17ab127d7574573f9c87c21"
    assert entry_checksum("0" * 64, '{"text":"Zoë 東京"}', b"\x01\x02") == "17f5a02d4bc0ed747ca9f38281950b4a"
    path = tmp_path / "cache.sqlite"
    texts = ["plain", "Zoë à Tōkyō — 東京 \U0001f600", "quote \" backslash \\ nul \x00 line\u2028end"]
    identities = [chat_identity(draw=i) for i in range(len(texts) + 2)]
    keys = [request_key(i) for i in identities]
    vectors = [[0.5, -1.25], [3.0, 0.125]]
    async with ResponseCache(path) as cache:
        for key, identity, text in zip(keys, identities, texts):
            cache.put(key, identity, ChatResult(text=text, input_tokens=3))
        cache.put(keys[3], identities[3], EmbedResult(vectors=vectors, input_tokens=2))
        cache.put(keys[4], identities[4], ChatResult(text="to be damaged"))
    with sqlite3.connect(path) as conn:
        for key, response, stored in conn.execute("SELECT key, response, checksum FROM entries"):
            assert stored == entry_checksum(key, response, None) or key == keys[3]
        conn.execute("UPDATE entries SET response = replace(response, 'damaged', 'dameged') WHERE key = ?", (keys[4],))
    async with ResponseCache(path) as cache:
        found = await cache.get_many(keys)
        assert [found[k].text for k in keys[:3]] == texts
        assert found[keys[3]].vectors == vectors
        assert keys[4] not in found and keys[4] in cache.corrupt_keys
    with sqlite3.connect(path) as conn:  # not UTF-8 at all: a miss too
        conn.execute("UPDATE entries SET response = CAST(X'7b2274657874223a22ff227d' AS TEXT) WHERE key = ?", (keys[0],))
    async with ResponseCache(path) as cache:
        found = await cache.get_many(keys[:2])
        assert list(found) == [keys[1]] and keys[0] in cache.corrupt_keys


def test_a_record_becomes_the_same_result_whatever_its_key_order_and_fields():
    """cache/codec.py result_from_record: the fast path for the six keys of a
    plain reply picks each field by name (a record written in another key
    order fills the right fields), and every record equals what ChatResult
    built from its keywords gives."""
    import itertools

    from cache.codec import result_from_record, result_to_record

    plain = {"text": "an answer", "finish_reason": "length", "input_tokens": 11, "output_tokens": 7,
             "latency": 0.25, "request_id": "req_1"}
    for order in itertools.permutations(plain):
        record = {k: plain[k] for k in order}
        assert result_from_record(record) == ChatResult(**plain)  # type: ignore[arg-type]
    richer = ChatResult("t", "stop", 5, 3, 0.5, None, cache_read_tokens=4, cache_write_tokens=1, reasoning="r")
    assert result_from_record(result_to_record(richer)) == richer
    assert result_from_record({"text": "old"}) == ChatResult("old")  # type: ignore[typeddict-item]
    with pytest.raises(KeyError):
        result_from_record({"finish_reason": "stop"})  # type: ignore[typeddict-item]


@pytest.mark.parametrize("by_json", [True, False], ids=["json-array", "row-by-row"])
async def test_sqlite_claims_skip_stored_keys_take_damaged_ones_and_respect_live_owners(tmp_path, by_json):
    """ResponseCache.claim (cache/store.py _claim_rows), both ways of
    inserting (a JSON array of the chunk's keys; row by row where SQLite has
    no JSON functions): a key already stored is not claimed (its reply is
    there), a stored key read back damaged is (it is paid again), a key a
    live process holds is not, and what one process stored or released ends
    its claims."""
    path = tmp_path / "cache.sqlite"
    identities = [chat_identity(draw=i) for i in range(6)]
    keys = [request_key(i) for i in identities]
    async with ResponseCache(path) as cache:
        cache.put(keys[0], identities[0], ChatResult(text="stored"))
        cache.put(keys[1], identities[1], ChatResult(text="to be damaged"))
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE entries SET response = replace(response, 'damaged', 'DAMAGED') WHERE key = ?",
                     (keys[1],))
    async with ResponseCache(path) as first, ResponseCache(path) as second:
        first._claims_by_json = second._claims_by_json = by_json  # noqa: SLF001 -- the path under test
        # second joins alone (solo); first joins beside it: both claim in the table from then on
        assert await second.claim(["unrelated"]) == {"unrelated"}
        assert await first.get_many(keys) == {keys[0]: ChatResult(text="stored")}
        assert keys[1] in first.corrupt_keys
        assert await first.claim(keys) == set(keys[1:])
        assert await second.claim(keys) == set()  # stored, or held by a live owner
        first.put(keys[2], identities[2], ChatResult(text="paid once"))
        first.release(keys[3:5])
        await first.flush()
        await asyncio.sleep(0.05)  # the release runs on the claims thread
        assert await second.claim(keys) == set(keys[3:5])
        assert await second.get_many(keys[2:3]) == {keys[2]: ChatResult(text="paid once")}
        with sqlite3.connect(path) as conn:  # first's lease on keys[5] runs out (as if it were killed)
            conn.execute("UPDATE claims SET lease_until = 0 WHERE key = ?", (keys[5],))
        assert await second.claim(keys[5:]) == {keys[5]}


def _rows(path, sql):
    with sqlite3.connect(path) as conn:
        return conn.execute(sql).fetchall()


async def test_a_cache_alone_on_its_file_writes_no_claims_until_another_joins_and_then_writes_down_its_own(tmp_path):
    """cache/sessions.py: a process alone on the file claims in memory (no
    claim row a call); a second one joining waits until the first has written
    down the keys it still holds, so no key is paid twice across the switch;
    what the first stored or released before is not held."""
    path = tmp_path / "cache.sqlite"
    identities = [chat_identity(draw=i) for i in range(5)]
    keys = [request_key(i) for i in identities]
    async with ResponseCache(path) as first:
        assert await first.claim(keys[:3]) == set(keys[:3])
        first.put(keys[0], identities[0], ChatResult(text="paid"))
        first.release(keys[1:2])  # a failed call: anyone may pay it
        await first.flush()
        assert _rows(path, "SELECT count(*) FROM claims") == [(0,)]
        assert _rows(path, "SELECT owner, shared FROM sessions") == [(first.owner, 0)]
        async with ResponseCache(path) as second:
            # keys[0] is stored, keys[2] is first's call in flight: second may pay the others
            assert await second.claim(keys) == {keys[1], keys[3], keys[4]}
            assert (keys[2], first.owner) in _rows(path, "SELECT key, owner FROM claims")
            assert sorted(_rows(path, "SELECT shared FROM sessions")) == [(1,), (1,)]
            # first now asks the file too: what second holds is not first's
            assert await first.claim([keys[3], keys[2]]) == {keys[2]}
            first.put(keys[2], identities[2], ChatResult(text="paid once"))
            await first.flush()
            assert (keys[2], first.owner) not in _rows(path, "SELECT key, owner FROM claims")
        assert _rows(path, "SELECT owner FROM sessions") == [(first.owner,)]
    assert _rows(path, "SELECT count(*) FROM sessions") == [(0,)]
    assert _rows(path, "SELECT count(*) FROM claims") == [(0,)]


async def test_two_caches_racing_over_the_same_keys_pay_each_once_across_the_solo_to_shared_switch(tmp_path):
    """cache/sessions.py under a race: one cache claims alone, a second joins
    while the first has calls in flight, both go on taking overlapping chunks
    of the same keys, paying (put after a short pause) what they claim and
    waiting for the rest, some calls failing (released, then paid by someone).
    Every key is paid exactly once."""
    rng = random.Random(7)
    path = tmp_path / "cache.sqlite"
    identities = [chat_identity(draw=i) for i in range(400)]
    keys = [request_key(i) for i in identities]
    identity_of = dict(zip(keys, identities, strict=True))
    paid: dict[str, int] = {}
    failed_once: set[str] = set()

    async def pay(cache: ResponseCache, key: str) -> None:
        await asyncio.sleep(rng.random() * 0.3)  # calls in flight when the second cache joins
        if key not in failed_once and rng.random() < 0.05:  # a failed call: released, someone pays it later
            failed_once.add(key)
            cache.release([key])
            await take(cache, [key])
            return
        paid[key] = paid.get(key, 0) + 1
        cache.put(key, identity_of[key], ChatResult(text=key))

    async def take(cache: ResponseCache, chunk: list[str]) -> None:
        found = await cache.get_many(chunk)
        misses = [k for k in chunk if k not in found]
        mine = await cache.claim(misses)
        calls = [pay(cache, k) for k in mine]
        others = [k for k in misses if k not in mine]
        if others:
            async for _hits, claimed in cache.wait_for(others):
                calls.extend(pay(cache, k) for k in claimed)
        await asyncio.gather(*calls)

    async def worker(cache: ResponseCache, start: float) -> None:
        await asyncio.sleep(start)
        order = keys[:]
        rng.shuffle(order)
        await asyncio.gather(*(take(cache, order[i:i + 25]) for i in range(0, len(order), 25)))
        await cache.flush()

    async with ResponseCache(path) as first, ResponseCache(path) as second:
        await asyncio.gather(worker(first, 0.0), worker(second, 0.01))
        assert first._solo is False and second._solo is False  # noqa: SLF001 -- the switch did happen
    assert sorted(paid) == sorted(keys)
    assert [k for k, n in paid.items() if n != 1] == []


async def test_a_key_released_and_claimed_again_while_its_claim_is_written_down_stays_this_processs(tmp_path):
    """The race behind a key paid twice under load: a solo cache writes down
    the keys it holds when a second cache joins (go_shared, on its claims
    thread); a call of a held key fails meanwhile (released) and is taken again
    (claimed: the row go_shared just wrote, this process's). That row must
    stay: deleted as "released during the switch" it left the key claimed by
    nobody, and the second cache paid it too. Ordered by events, not timing."""
    path = tmp_path / "cache.sqlite"
    key, other = request_key(chat_identity(draw=1)), request_key(chat_identity(draw=2))
    async with ResponseCache(path) as first, ResponseCache(path) as second:
        assert await first.claim([key]) == {key} and first._solo is True  # noqa: SLF001
        started, proceed = threading.Event(), threading.Event()
        write_down = first._go_shared_rows  # noqa: SLF001

        def held_at_the_switch(held: list[str]) -> None:
            started.set()
            proceed.wait(60)
            write_down(held)

        first._go_shared_rows = held_at_the_switch  # noqa: SLF001 -- hold the switch open
        joined = asyncio.ensure_future(second.claim([other]))  # the newcomer: the first's watch sees it
        assert await asyncio.to_thread(started.wait, 60)
        first.release([key])  # the call failed ...
        again = asyncio.ensure_future(first.claim([key]))  # ... and is taken again, behind the switch
        await asyncio.sleep(0)
        proceed.set()
        assert await again == {key}
        assert await joined == {other}
        await first._claims_thread.run(lambda: None)  # noqa: SLF001 -- whatever the switch queued has run
        assert await second.claim([key]) == set()  # the first holds it: the second waits, never pays it


async def test_a_dead_processes_session_does_not_hold_up_the_next_and_a_live_one_elsewhere_does(tmp_path):
    """cache/sessions.py: a solo session left by a process gone from this
    machine (SIGKILL) is dropped at once; one from another machine holds a
    newcomer until it writes down its keys or its lease lapses."""
    import subprocess
    import sys
    import time

    from cache import sessions

    path = tmp_path / "cache.sqlite"
    async with ResponseCache(path):
        pass
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    far = time.time() + 3600
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO sessions VALUES ('gone:1:x', ?, ?, ?, 0)", (sessions.this_place(), dead.pid, far))
    async with ResponseCache(path) as cache:
        assert await asyncio.wait_for(cache.claim(["k"]), 5) == {"k"}
        assert _rows(path, "SELECT owner, shared FROM sessions") == [(cache.owner, 0)]  # solo: the dead one is gone
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO sessions VALUES ('elsewhere:1:x', 'another-host|', 1, ?, 0)", (time.time() + 1.0,))
    async with ResponseCache(path) as cache:
        started = time.monotonic()
        assert await asyncio.wait_for(cache.claim(["k"]), 10) == {"k"}
        assert time.monotonic() - started >= 0.5  # waited for the other machine's lease to lapse
        assert _rows(path, "SELECT owner, shared FROM sessions") == [(cache.owner, 1)]


async def test_a_lookup_that_mostly_missed_sends_the_next_one_to_the_reader_thread(tmp_path, monkeypatch):
    """cache/store.py get_many: inline reads pay on a rerun (every key a hit);
    a lookup that found under half its keys is followed by calls, so the next
    lookup reads on the thread, beside them, until one finds half again."""
    import threading

    import cache.store as store

    path = tmp_path / "cache.sqlite"
    identities = [chat_identity(draw=i) for i in range(40)]
    keys = [request_key(i) for i in identities]
    async with ResponseCache(path) as cache:
        for i in range(20):
            cache.put(keys[i], identities[i], ChatResult(text=f"reply {i}"))
    readers: list[str] = []
    real_read = store.read_results

    def read_results(*args):
        readers.append("loop" if threading.current_thread() is threading.main_thread() else "thread")
        return real_read(*args)

    monkeypatch.setattr(store, "read_results", read_results)
    async with ResponseCache(path) as cache:
        assert len(await cache.get_many(keys[:10])) == 10       # all hits: inline
        assert len(await cache.get_many(keys[20:30])) == 0      # all misses: inline, the next on the thread
        assert len(await cache.get_many(keys[15:25])) == 5      # half: on the thread, the next inline
        assert len(await cache.get_many(keys[14:30])) == 6      # under half: inline, the next on the thread
        assert len(await cache.get_many(keys[:3])) == 3
        assert len(await cache.get_many(keys[3:6])) == 3
    assert readers == ["loop", "loop", "thread", "loop", "thread", "loop"]


async def test_cache_copy_leaves_out_a_row_that_is_not_utf8_as_damaged(tmp_path):
    """cache/copy.py: a source row whose response (or chunk) is not UTF-8 is
    left out and counted as damaged, like a checksum mismatch, as lookups and
    `cache check` treat it; the copy goes on (it used to end with
    "Could not decode to UTF-8 column")."""
    from cache.copy import copy_cache

    source, target = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    identities = [chat_identity(draw=i) for i in range(4)]
    keys = [request_key(i) for i in identities]
    async with ResponseCache(source) as cache:
        for i, (key, identity) in enumerate(zip(keys, identities)):
            cache.put(key, identity, ChatResult(text=f"reply {i}"))
    with sqlite3.connect(source) as conn:
        conn.execute("UPDATE entries SET response = CAST(X'7B2274657874223A22FF227D' AS TEXT) WHERE key = ?",
                     (keys[2],))
    report = await copy_cache(source, target)
    assert (report.copied, report.damaged) == (3, 1)
    async with ResponseCache(target) as cache:
        assert await cache.get_many(keys) == {k: ChatResult(text=f"reply {i}") for i, k in enumerate(keys) if i != 2}


async def test_cache_copy_carries_the_batch_and_spending_ledgers(tmp_path):
    """cache/copy.py: a batch submitted and not yet collected, and what each
    invocation of a run paid, go along with the entries, so a run on the copy
    collects the batch instead of paying for it again and --max-cost counts
    what was spent; a row the target holds is kept unless the source's is
    newer; copying again changes nothing."""
    import time as clock

    from cache.backend import open_ledger, open_spending_ledger
    from cache.copy import copy_cache

    source, target = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    async with ResponseCache(source) as cache:
        cache.put("k0", chat_identity(draw=0), ChatResult(text="stored"))
    async with ResponseCache(target):
        pass
    old_target = open_ledger(target)
    await old_target.record("batch_1", endpoint="oa", kind="openai", base_url=None, model="m", state="validating",
                            keys=["k1"])
    old_target.close()
    target_spending = open_spending_ledger(target)
    clock.sleep(0.01)
    ledger, spending = open_ledger(source), open_spending_ledger(source)
    try:
        await ledger.record("batch_1", endpoint="oa", kind="openai", base_url=None, model="m", state="in_progress",
                            keys=["k1", "k2"])
        await ledger.record("batch_2", endpoint="oa", kind="openai", base_url=None, model="m", state="in_progress",
                            keys=["k3"])
        await spending.record_spending("run_a", "inv_1", usd=1.25, calls=10, label="book: m")
        await spending.record_spending("run_a", "inv_2", usd=0.5, calls=4, label="book: m")
    finally:
        ledger.close()
        spending.close()
    clock.sleep(0.01)
    await target_spending.record_spending("run_a", "inv_2", usd=0.75, calls=6, label="book: m")  # newer: kept
    target_spending.close()

    report = await copy_cache(source, target)
    assert (report.copied, report.batches, report.invocations) == (1, 2, 2)
    assert "2 batches of the batch ledger and 2 invocations of the spending ledger" in report.format()
    for _ in range(2):
        copied_ledger, copied_spending = open_ledger(target), open_spending_ledger(target)
        try:
            batches = {b.id: b for b in await copied_ledger.batches()}
            assert batches["batch_1"].state == "in_progress" and batches["batch_1"].requests == 2
            assert await copied_ledger.owing("oa", ["k1", "k2", "k3", "k4"]) == {
                "k1": "batch_1", "k2": "batch_1", "k3": "batch_2"}
            total = await copied_spending.ledger_total("run_a")
            assert (total.spent_usd, total.calls, total.invocations) == (2.0, 16, 2)
        finally:
            copied_ledger.close()
            copied_spending.close()
        again = await copy_cache(source, target)  # idempotent
        assert (again.copied, again.present) == (0, 1)
