"""A memory system as a subprocess speaking JSON lines (tests/memory_process.py),
driven through SubprocessMemory: what crosses its stdin (and nothing else),
both directions checked against the protocol's JSON Schema, its scrubbed
environment, its model calls through Tulving's endpoint, and its faults."""
from __future__ import annotations

import asyncio
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import orjson
import pytest

from engine.benchmark.memory.contract import Budget, Chapter, MemoryError, RecallFailed
from engine.benchmark.memory.meter import PhaseMeter
from engine.benchmark.memory.proxy import ModelEndpoint
from engine.benchmark.memory.subprocess_memory import (
    SCHEMA_PATH,
    ProtocolBreak,
    ReplyTimeouts,
    SubprocessMemory,
    parse_reply,
    secret_variables,
)
from engine.config import Config, ConfigError
from engine.scheduler import Engine

PROCESS = [sys.executable, str(Path(__file__).with_name("memory_process.py"))]
SCHEMA = json.loads(SCHEMA_PATH.read_text())
BUDGET = Budget(passages=3, tokens=2000)


def validator(direction: str) -> jsonschema.Draft202012Validator:
    """The schema's messages of one direction ("toProcess" | "fromProcess")."""
    return jsonschema.Draft202012Validator({"$defs": SCHEMA["$defs"], "$ref": f"#/$defs/{direction}"})


@dataclass
class LentServices:
    """What the run lends a memory system, as plain data (the wire is the subject here)."""

    workdir: Path
    chat_model: str | None = "builtin:reader"
    embed_model: str | None = "local:minilm"
    openai_base_url: str | None = "http://127.0.0.1:9/v1"
    openai_api_key: str | None = "per-run-secret"
    models: list[str] = field(default_factory=lambda: ["builtin:reader", "local:minilm"])
    config: Config | None = None

    async def chat(self, messages, **kwargs):  # not used by a subprocess
        raise AssertionError("a subprocess calls the endpoint, not the services")

    async def embed(self, texts, **kwargs):
        raise AssertionError("a subprocess calls the endpoint, not the services")


def chapters_of(book) -> list[Chapter]:
    return [Chapter(k, text) for k, text in enumerate(book.chapter_texts, 1)]


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


async def test_only_the_chapters_and_the_question_texts_cross_both_ways_valid(tmp_path, short_book, short_questions):
    chapters = chapters_of(short_book)
    questions = sorted({q.question for q in short_questions})[:8]
    services = LentServices(tmp_path / "work")
    # As the registry makes it: the command among the options, which the process never sees.
    memory = SubprocessMemory("keywords", {"command": [*PROCESS, "good"], "ingest_batch_chars": 20_000, "k": 3,
                                           "timeout_recall": 120, "timeout_exit": 5}, budget=BUDGET)
    await memory.open(services)
    await memory.ingest(chapters)
    await memory.ready()
    recalls = await asyncio.gather(*(memory.recall(q, BUDGET) for q in questions))
    await memory.close()
    assert memory.concurrency == 3 and memory.answers is False
    assert all(len(r.passages) == 3 and r.answer is None and r.passages[0].chapter in range(1, 20) for r in recalls)

    received = lines(services.workdir / "received.jsonl")
    messages = [orjson.loads(line) for line in received]
    to_process, from_process = validator("toProcess"), validator("fromProcess")
    for message in messages:
        to_process.validate(message)  # closed shapes: no property beyond the schema's
    for line in lines(services.workdir / "sent.jsonl"):
        from_process.validate(json.loads(line))
    # Exactly these messages, each a compact line: nothing else reached the process.
    assert all(line == orjson.dumps(m) + b"\n" for line, m in zip(received, messages))
    assert messages[0] == {"type": "open", "protocol": 1, "name": "keywords", "workdir": str(services.workdir),
                           "budget": {"passages": 3, "tokens": 2000, "tokenizer": "cl100k_base"},
                           "models": {"chat": "builtin:reader", "embed": "local:minilm"},
                           "openai": {"base_url": "http://127.0.0.1:9/v1", "api_key": "per-run-secret"},
                           "options": {"k": 3}}
    ingests = [m for m in messages if m["type"] == "ingest"]
    assert len(ingests) > 1  # in batches, in book order
    assert [c for m in ingests for c in m["chapters"]] == [{"id": c.id, "text": c.text} for c in chapters]
    recall_messages = [m for m in messages if m["type"] == "recall"]
    assert sorted(m["question"] for m in recall_messages) == questions
    assert all(m["budget"] == {"passages": 3, "tokens": 2000, "tokenizer": "cl100k_base"} for m in recall_messages)
    assert len({m["id"] for m in recall_messages}) == len(questions)
    assert [m["type"] for m in messages] == ["open", *["ingest"] * len(ingests), "ready",
                                             *["recall"] * len(questions), "close"]
    assert memory._process.returncode == 0


async def test_the_environment_holds_no_secret_of_the_user(tmp_path, monkeypatch):
    for name, value in {"MY_API_KEY": "sk-user", "GITHUB_TOKEN": "ghp-user", "DB_PASSWORD": "pw",
                        "AWS_SECRET_ACCESS_KEY": "aws", "GCP_CREDENTIALS": "gcp", "VLLM_ACCESS": "named-in-config",
                        "OPENAI_ORG_ID": "org-user", "OPENAI_BASE_URL": "https://api.openai.com/v1",
                        "NO_PROXY": "intranet.example", "PLAIN_SETTING": "kept"}.items():
        monkeypatch.setenv(name, value)
    config = Config.from_dicts({"vllm": {"kind": "openai", "base_url": "http://10.0.0.9:8000/v1",
                                         "key_env": "VLLM_ACCESS"}}, {})
    assert secret_variables(config) == ["VLLM_ACCESS"]
    services = LentServices(tmp_path / "work", config=config)  # the runner's services carry the run's config
    memory = SubprocessMemory("env", command=[*PROCESS, "good"])
    await memory.open(services)
    await memory.close()
    env = json.loads((services.workdir / "environment.json").read_text())
    assert not {"MY_API_KEY", "GITHUB_TOKEN", "DB_PASSWORD", "AWS_SECRET_ACCESS_KEY", "GCP_CREDENTIALS",
                "VLLM_ACCESS", "OPENAI_ORG_ID"} & set(env)
    assert not {"sk-user", "ghp-user", "pw", "aws", "gcp", "named-in-config", "org-user"} & set(env.values())
    assert env["OPENAI_BASE_URL"] == services.openai_base_url and env["OPENAI_API_KEY"] == "per-run-secret"
    assert env["TULVING_MEMORY_WORKDIR"] == str(services.workdir) and env["PLAIN_SETTING"] == "kept"
    assert env["NO_PROXY"] == "intranet.example,127.0.0.1,localhost" and env["PATH"] == os.environ["PATH"]


async def test_an_unmodified_openai_client_in_the_process_is_served_and_counted_in_its_phase(tmp_path):
    async with Engine(Config.load(), cache_path=str(tmp_path / "c.sqlite")) as engine:
        endpoint = await ModelEndpoint(engine).start()
        meter = PhaseMeter("caller")
        services = LentServices(tmp_path / "work", openai_base_url=endpoint.base_url,
                                openai_api_key=endpoint.grant(meter, ["builtin:reader"]))
        memory = SubprocessMemory("caller", command=[*PROCESS, "call-endpoint"])
        try:
            with meter.phase("open"):
                await memory.open(services)
            with meter.phase("ingest"):
                await memory.ingest([Chapter(1, "On May 07, 2024, Ana met Bo at the Harbour Museum.")])
            await memory.close()
        finally:
            await endpoint.close()
    assert (meter.phases["ingest"].calls, meter.phases["open"].calls) == (1, 0)
    assert "endpoint replied" in (services.workdir / "stderr.log").read_text()


async def run_until_fault(memory: SubprocessMemory, workdir: Path, questions=("Where did Ana go?",)) -> None:
    await memory.open(LentServices(workdir))
    await memory.ingest([Chapter(1, "Ana went to the Harbour Museum."), Chapter(2, "Bo stayed home.")])
    await memory.ready()
    await asyncio.gather(*(memory.recall(q, BUDGET) for q in questions))


@pytest.mark.parametrize("mode, phase, says", [
    ("crash-on-ingest", "ingest", ["exited with code 3", "IndexError: list index out of range"]),
    ("hang-on-ready", "ready", ["no reply within 1 s (its ready timeout)"]),
    ("not-json", "recall", ["not JSON", "{'type': 'recalled'}"]),
    ("unknown-id", "recall", ["unknown id 'r1x'"]),
    ("unknown-type", "recall", ["unknown message type 'thinking'"]),
    ("wrong-reply", "ready", ["answered ready with 'ingested' (expected 'ready')"]),
    ("error-on-open", "open", ["no index folder configured"]),
    ("stdout-noise", "open", ["not JSON", "Loading memory backend"]),
    ("no-opened", "open", ["exited with code 2", "cannot find its model file"]),
])
async def test_a_faulty_process_is_one_line_naming_it_and_its_phase_and_is_stopped(tmp_path, mode, phase, says):
    memory = SubprocessMemory("flaky", command=[*PROCESS, mode], timeouts=ReplyTimeouts(ready=1.0))
    with pytest.raises(MemoryError) as failed:
        await run_until_fault(memory, tmp_path / "work")
    await memory.close()
    message = str(failed.value)
    assert message.startswith(f"memory system 'flaky' failed at {phase}: ") and "\n" not in message
    assert failed.value.phase == phase and all(s in message for s in says), message
    assert memory._process.returncode is not None  # gone: exited or killed
    with pytest.raises(MemoryError):  # and it stays failed
        await memory.recall("again?", BUDGET)


async def test_an_error_reply_to_one_recall_fails_that_question_only(tmp_path):
    memory = SubprocessMemory("picky", command=[*PROCESS, "recall-error"])
    questions = ["Where did Ana go?", "FAIL: who stayed home?", "Who stayed home?"]
    await memory.open(LentServices(tmp_path / "work"))
    await memory.ingest([Chapter(1, "Ana went to the Harbour Museum."), Chapter(2, "Bo stayed home.")])
    await memory.ready()
    results = await asyncio.gather(*(memory.recall(q, BUDGET) for q in questions), return_exceptions=True)
    await memory.close()
    assert isinstance(results[1], RecallFailed) and "the index timed out on this one" in str(results[1])
    assert results[0].passages[0].chapter == 1 and results[2].passages[0].chapter == 2
    assert memory._process.returncode == 0


async def test_a_process_that_does_not_exit_after_closed_is_killed_after_its_grace(tmp_path):
    memory = SubprocessMemory("sticky", command=[*PROCESS, "ignore-close"], timeouts=ReplyTimeouts(exit=0.2))
    await memory.open(LentServices(tmp_path / "work"))
    await memory.close()
    assert memory._process.returncode == -9


async def test_a_command_that_cannot_start_is_one_line_at_open(tmp_path):
    memory = SubprocessMemory("ghost", command=[str(tmp_path / "no-such-program")])
    with pytest.raises(MemoryError, match=r"^memory system 'ghost' failed at open: cannot start .*no-such-program"):
        await memory.open(LentServices(tmp_path / "work"))
    await memory.close()


@pytest.mark.parametrize("options, command, says", [
    ({}, "python memory.py", "non-empty list of strings"),
    ({}, [], "non-empty list of strings"),
    ({"timeout_ingest": 0}, ["x"], "timeout_ingest must be timeout_PHASE = positive seconds"),
    ({"timeout_recal": 5}, ["x"], "timeout_recal must be timeout_PHASE = positive seconds"),
    ({"ingest_batch_chars": "big"}, ["x"], "ingest_batch_chars must be a positive integer"),
])
def test_malformed_settings_are_a_config_error(options, command, says):
    with pytest.raises(ConfigError, match=says):
        SubprocessMemory("bad", options, command=command)


GOOD_REPLIES = [
    {"type": "opened", "answers": True, "concurrency": 2, "protocol": 1},
    {"type": "ingested"}, {"type": "ready"}, {"type": "closed", "note": "extra properties are ignored"},
    {"type": "recalled", "id": "r1", "passages": [{"chapter": 3, "text": "t", "score": 0.5},
                                                  {"chapter": None, "text": "u"}], "answer": None},
    {"type": "recalled", "id": "r2", "passages": [], "answer": "Ana"},
    {"type": "error", "message": "boom"}, {"type": "error", "id": "r3", "message": "boom"},
]
BAD_REPLIES = [
    ["not", "an", "object"], {"kind": "opened"}, {"type": "thinking"},
    {"type": "opened", "answers": "no", "concurrency": 1}, {"type": "opened", "answers": False, "concurrency": 0},
    {"type": "opened", "answers": False, "concurrency": 1, "protocol": 2},
    {"type": "recalled", "passages": []}, {"type": "recalled", "id": 7, "passages": []},
    {"type": "recalled", "id": "r1", "passages": [{"chapter": 1}]},
    {"type": "recalled", "id": "r1", "passages": [{"chapter": "one", "text": "t"}]},
    {"type": "recalled", "id": "r1", "passages": [{"text": "t", "score": "high"}]},
    {"type": "recalled", "id": "r1", "passages": [], "answer": 42},
    {"type": "error"}, {"type": "error", "id": 3, "message": "m"},
]


@pytest.mark.parametrize("reply", GOOD_REPLIES)
def test_replies_the_schema_accepts_are_accepted(reply):
    validator("fromProcess").validate(reply)
    assert parse_reply(orjson.dumps(reply))["type"] == reply["type"]


@pytest.mark.parametrize("reply", BAD_REPLIES)
def test_replies_the_schema_refuses_are_refused(reply):
    assert not validator("fromProcess").is_valid(reply)
    with pytest.raises(ProtocolBreak):
        parse_reply(orjson.dumps(reply))


async def test_the_late_reply_of_a_cancelled_recall_is_dropped_not_a_fault(tmp_path):
    memory = SubprocessMemory("slow", command=[*PROCESS, "slow-recall"])
    await memory.open(LentServices(tmp_path / "work"))
    await memory.ingest([Chapter(1, "Ana went to the Harbour Museum.")])
    await memory.ready()
    asked = asyncio.ensure_future(memory.recall("Where did Ana go?", BUDGET))
    await asyncio.sleep(0)  # sent; its answer comes 0.3 s later at the earliest
    asked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asked
    assert memory._abandoned == {"r1"}
    again = await memory.recall("Where did Ana go?", BUDGET)  # the cancelled one's reply came first
    await memory.close()
    assert again.passages[0].chapter == 1 and memory._abandoned == set()


async def test_a_process_stopped_mid_phase_by_the_runner_is_killed_not_asked_to_close(tmp_path):
    memory = SubprocessMemory("stuck", command=[*PROCESS, "hang-on-ready"])
    await memory.open(LentServices(tmp_path / "work"))
    with pytest.raises(TimeoutError):  # the runner's phase limit cancels ready()
        await asyncio.wait_for(memory.ready(), 0.5)
    await memory.close()
    assert memory._process.returncode == -9
    received = [json.loads(line)["type"] for line in lines(tmp_path / "work" / "received.jsonl")]
    assert received == ["open", "ready"]


async def test_a_process_that_stops_reading_its_stdin_cannot_block_a_phase_past_its_timeout(tmp_path):
    memory = SubprocessMemory("deaf", command=[*PROCESS, "deaf-after-open"], timeouts=ReplyTimeouts(ingest=1.0))
    await memory.open(LentServices(tmp_path / "work"))
    book = [Chapter(1, "word " * 200_000)]  # 1 MB: more than a pipe holds
    with pytest.raises(MemoryError, match=r"failed at ingest: did not read its stdin within 1 s"):
        await memory.ingest(book)
    await memory.close()
    assert memory._process.returncode == -9
