"""A memory system in any language: a subprocess speaking JSON lines.

Tulving starts the command (an argv list, no shell) in the system's workdir
and writes one JSON object per line to its stdin; the process answers one JSON
object per line on its stdout (its logs go to stderr, kept in
WORKDIR/stderr.log). The messages, in order (protocol.schema.json beside this
file is their JSON Schema; docs/memory-systems.md tells the whole contract):

    -> {"type": "open", "protocol": 1, "name", "workdir", "budget": {"passages", "tokens", "tokenizer"},
        "models": {"chat", "embed"}, "openai": {"base_url", "api_key"}, "options": {...}}
    <- {"type": "opened", "answers": false, "concurrency": 4}
    -> {"type": "ingest", "chapters": [{"id": 1, "text": "..."}, ...]}   (book order, in batches)
    <- {"type": "ingested"}                                              (one per batch)
    -> {"type": "ready"}                  <- {"type": "ready"}
    -> {"type": "recall", "id": "r1", "question": "...", "budget": {...}}  (up to `concurrency` in flight)
    <- {"type": "recalled", "id": "r1", "passages": [{"chapter": 3, "text": "...", "score": 0.8}], "answer": null}
    -> {"type": "close"}                  <- {"type": "closed"}   then the process exits
    <- {"type": "error", "id"?: "r1", "message": "..."}   (instead of any reply)

Only the chapters and the question texts cross (with the budget, the model
aliases and the endpoint): nothing else of the benchmark is ever written.
The process's environment is scrubbed of the user's secrets (variables whose
names hold KEY, TOKEN, SECRET, PASSWORD or CREDENTIAL, every `key_env` of the
config, other OPENAI_* settings) and gets OPENAI_BASE_URL / OPENAI_API_KEY
(Tulving's endpoint and this system's secret: an unmodified OpenAI client
works), NO_PROXY for loopback, and TULVING_MEMORY_WORKDIR.

Faults: a process that exits, hangs past its phase's timeout, writes a line
that is not JSON or breaks the protocol (an unknown message, an unknown id,
a reply nobody asked for) raises MemoryError(system, phase, one line) and is
killed (its process group); an error reply to one recall fails that question
only (RecallFailed).
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TypeGuard, cast

import orjson

from engine.benchmark.memory.contract import (
    Budget,
    Chapter,
    MemoryError,
    MemoryServices,
    MemorySystem,
    Passage,
    Recall,
    RecallFailed,
)
from engine.config import Config, ConfigError

PROTOCOL = 1
SCHEMA_PATH = Path(__file__).with_name("protocol.schema.json")
SECRET_WORDS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")
LOG_NAME = "stderr.log"
MAX_LINE = 256 * 1024 * 1024  # a reply may quote whole chapters
# Options of the config's [memories.NAME] table that are Tulving's, not the process's
# (and every `timeout_*`).
TULVING_OPTIONS = frozenset({"command", "use", "ingest_batch_chars"})
Message = dict[str, object]


@dataclass(frozen=True, slots=True)
class ReplyTimeouts:
    """Seconds one reply of each phase may take (ingest: per batch; recall:
    per question), and the grace given to exit after `closed` ("exit").
    Read from the options' `timeout_PHASE` keys, the names the runner's
    phase limits use (engine/benchmark/memory/runner.py), and the same
    defaults: a process past either is stopped."""

    open: float = 300.0
    ingest: float = 4 * 3600.0
    ready: float = 3600.0
    recall: float = 300.0
    close: float = 60.0
    exit: float = 10.0

    @classmethod
    def from_options(cls, system: str, options: Mapping[str, object]) -> ReplyTimeouts:
        """From `timeout_ingest = 7200` and the like (ConfigError when malformed)."""
        names = {f.name for f in fields(cls)}
        values: dict[str, float] = {}
        for key, value in options.items():
            if not key.startswith("timeout_"):
                continue
            if key[len("timeout_"):] not in names or not _positive(value):
                raise ConfigError(f"memory system {system!r}: {key} must be timeout_PHASE = positive seconds "
                                  f"(PHASE one of {', '.join(sorted(names))})")
            values[key[len("timeout_"):]] = float(value)
        return cls(**values)


def _positive(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def scrubbed_environment(base: Mapping[str, str], hidden: Iterable[str] = ()) -> dict[str, str]:
    """`base` without the user's secrets: names holding SECRET_WORDS, the
    `hidden` names (the config's key_env variables), and OPENAI_* settings
    (which would point an OpenAI client elsewhere than Tulving's endpoint)."""
    hidden = set(hidden)
    return {name: value for name, value in base.items()
            if name not in hidden and not name.upper().startswith("OPENAI_")
            and not any(word in name.upper() for word in SECRET_WORDS)}


def secret_variables(config: Config) -> list[str]:
    """The variables the config names as holding secrets (endpoints' key_env,
    the cache's password_env): `hidden_env` for SubprocessMemory."""
    names = {spec.key_env for spec in config.endpoints.values() if spec.key_env}
    if config.cache.password_env:
        names.add(config.cache.password_env)
    return sorted(names)


def process_environment(services: MemoryServices, hidden: Iterable[str] = ()) -> dict[str, str]:
    """The subprocess's environment (see the module docstring)."""
    env = scrubbed_environment(os.environ, hidden)
    env["TULVING_MEMORY_WORKDIR"] = str(services.workdir)
    if services.openai_base_url is not None and services.openai_api_key is not None:
        env["OPENAI_BASE_URL"] = services.openai_base_url
        env["OPENAI_API_KEY"] = services.openai_api_key
        for name in ("NO_PROXY", "no_proxy"):  # never through an HTTP proxy: the secret stays on this machine
            env[name] = ",".join(p for p in (env.get(name, ""), "127.0.0.1,localhost") if p)
    return env


def open_message(name: str, services: MemoryServices, budget: Budget | None,
                 options: Mapping[str, object]) -> Message:
    return {"type": "open", "protocol": PROTOCOL, "name": name, "workdir": str(services.workdir),
            "budget": (budget or Budget()).to_json(),
            "models": {"chat": services.chat_model, "embed": services.embed_model},
            "openai": {"base_url": services.openai_base_url, "api_key": services.openai_api_key},
            "options": {k: v for k, v in options.items() if k not in TULVING_OPTIONS and not k.startswith("timeout_")}}


def chapter_batches(chapters: Sequence[Chapter], max_chars: int) -> Iterator[list[Chapter]]:
    """The chapters in book order, in batches of about `max_chars` characters (at least one chapter each)."""
    batch: list[Chapter] = []
    size = 0
    for chapter in chapters:
        if batch and size + len(chapter.text) > max_chars:
            yield batch
            batch, size = [], 0
        batch.append(chapter)
        size += len(chapter.text)
    if batch:
        yield batch


# -- checking what the process writes (the schema's rules, without its dependency) ---------
class ProtocolBreak(Exception):
    """A line of the process that breaks the protocol (the message says how)."""


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise ProtocolBreak(what)


def parse_reply(line: bytes) -> Message:
    """One line of the process's stdout as a reply, checked against the protocol."""
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError:
        text = line.decode("utf-8", "replace").strip()
        raise ProtocolBreak(f"wrote a line that is not JSON ({text[:120]!r}): logs go to stderr") from None
    _check(isinstance(message, dict) and isinstance(message.get("type"), str),
           f"wrote {_short(message)}, not a message object with a \"type\"")
    kind = message["type"]
    if kind == "opened":
        _check(isinstance(message.get("answers"), bool), "opened without a boolean \"answers\"")
        concurrency = _integer(message.get("concurrency"))
        _check(concurrency is not None and concurrency >= 1, "opened without an integer \"concurrency\" >= 1")
        message["concurrency"] = concurrency
        _check(message.get("protocol", PROTOCOL) == PROTOCOL, f"speaks protocol {message.get('protocol')!r}, "
               f"Tulving speaks {PROTOCOL}")
    elif kind == "recalled":
        _check(isinstance(message.get("id"), str), "recalled without a string \"id\"")
        _check_passages(message.get("passages"))
        _check(message.get("answer") is None or isinstance(message.get("answer"), str),
               "recalled with an \"answer\" that is neither a string nor null")
    elif kind == "error":
        _check(isinstance(message.get("message"), str), "error without a string \"message\"")
        _check(message.get("id") is None or isinstance(message.get("id"), str), "error with a non-string \"id\"")
    else:
        _check(kind in ("ingested", "ready", "closed"), f"sent an unknown message type {kind!r}")
    return cast(Message, message)


def _check_passages(passages: object) -> None:
    if not isinstance(passages, list):
        raise ProtocolBreak("recalled without a \"passages\" list")
    for index, passage in enumerate(passages):
        where = f"passages[{index}]"
        _check(isinstance(passage, dict) and isinstance(passage.get("text"), str), f"{where} has no string \"text\"")
        chapter, score = passage.get("chapter"), passage.get("score")
        _check(chapter is None or _integer(chapter) is not None, f"{where}.chapter is neither an integer nor null")
        _check(score is None or (isinstance(score, (int, float)) and not isinstance(score, bool)),
               f"{where}.score is not a number")


def _integer(value: object) -> int | None:
    """An integer as JSON Schema counts them (3 or 3.0), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if isinstance(value, int) or value.is_integer() else None


def _short(value: object) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= 80 else text[:77] + "..."


def recall_of(message: Message) -> Recall:
    """The Recall of a "recalled" message (parse_reply checked its passages and answer)."""
    given, answer = message["passages"], message.get("answer")
    assert isinstance(given, list) and (answer is None or isinstance(answer, str))  # checked by parse_reply
    passages = tuple(Passage(text=p["text"], chapter=_integer(p.get("chapter")), score=p.get("score"))
                     for p in given)
    return Recall(passages=passages, answer=answer)


# -- the process ------------------------------------------------------------------------------
class SubprocessMemory(MemorySystem):
    """A memory system run as `command`, speaking the JSON-lines protocol.

    `hidden_env`: names of environment variables never passed on (the
    config's: `secret_variables(config)`, also taken from `services.config`
    when the services carry the run's config); `timeouts`: per reply (else
    the options' `timeout_PHASE` keys); `budget`: the run's evidence budget, told in
    the open message (each recall carries its own too)."""

    description = "a subprocess speaking Tulving's JSON-lines memory protocol"

    def __init__(self, name: str = "", options: Mapping[str, object] | None = None, *,
                 command: Sequence[str] | None = None, hidden_env: Iterable[str] = (),
                 timeouts: ReplyTimeouts | None = None, budget: Budget | None = None):
        super().__init__(name, options)
        command = command if command is not None else self.options.get("command")  # type: ignore[assignment]
        if isinstance(command, str) or not command or not all(isinstance(part, str) and part for part in command):
            raise ConfigError(f"memory system {self.name!r}: its command must be a non-empty list of strings "
                              f"(the program and its arguments; no shell)")
        self.command = list(command)
        self.hidden_env = tuple(hidden_env)
        self.timeouts = timeouts or ReplyTimeouts.from_options(self.name, self.options)
        self.budget = budget
        batch_chars = self.options.get("ingest_batch_chars", 1_000_000)
        if not _positive(batch_chars) or not isinstance(batch_chars, int):
            raise ConfigError(f"memory system {self.name!r}: ingest_batch_chars must be a positive integer")
        self.ingest_batch_chars = batch_chars
        self.phase = "open"
        self.log_path: Path | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._control: asyncio.Future[Message] | None = None
        self._pending: dict[str, asyncio.Future[Message]] = {}
        self._abandoned: set[str] = set()  # ids of recalls cancelled while in flight
        self._ids = itertools.count(1)
        self._fault: MemoryError | None = None
        self._closing = False
        self._interrupted = False  # an exchange was cancelled while the process worked on it
        self._write_lock = asyncio.Lock()
        self._slots: asyncio.Semaphore | None = None

    # -- the contract ------------------------------------------------------------------------
    async def open(self, services: MemoryServices) -> None:
        await super().open(services)
        workdir = Path(services.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / LOG_NAME
        with open(self.log_path, "ab") as log:
            try:
                self._process = await asyncio.create_subprocess_exec(
                    *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
                    cwd=workdir, env=process_environment(services, self._hidden(services)), limit=MAX_LINE,
                    start_new_session=True)  # its own process group: killed whole
            except OSError as exc:
                raise MemoryError(self.name, "open", f"cannot start {self.command[0]!r}: {exc.strerror or exc}") from None
        self._reader = asyncio.get_running_loop().create_task(self._read(), name=f"memory {self.name} stdout")
        budget = self.budget if self.budget is not None else getattr(services, "budget", None)
        opened = await self._exchange("open", open_message(self.name, services, budget, self.options), "opened")
        self.answers = bool(opened["answers"])
        concurrency = opened["concurrency"]
        assert isinstance(concurrency, int)  # parse_reply made it one
        self.concurrency = concurrency
        self._slots = asyncio.Semaphore(self.concurrency)

    def _hidden(self, services: MemoryServices) -> list[str]:
        """The variables never passed on: `hidden_env`, and the secrets the run's config names."""
        config = getattr(services, "config", None)  # the runner's EngineServices carries it
        return [*self.hidden_env, *(secret_variables(config) if isinstance(config, Config) else ())]

    async def ingest(self, chapters: Sequence[Chapter]) -> None:
        for batch in chapter_batches(chapters, self.ingest_batch_chars):
            await self._exchange("ingest", {"type": "ingest", "chapters": [{"id": c.id, "text": c.text}
                                                                          for c in batch]}, "ingested")

    async def ready(self) -> None:
        await self._exchange("ready", {"type": "ready"}, "ready")

    async def recall(self, question: str, budget: Budget) -> Recall:
        if self._fault is not None:
            raise self._fault
        if self._slots is None:
            raise MemoryError(self.name, "recall", "asked to recall before it was opened")
        self.phase = "recall"
        async with self._slots:
            ident = f"r{next(self._ids)}"
            future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
            self._pending[ident] = future
            try:
                message = await self._ask({"type": "recall", "id": ident, "question": question,
                                           "budget": budget.to_json()}, future, self.timeouts.recall)
            finally:
                if not self._pending.pop(ident, future).done():
                    self._abandoned.add(ident)  # cancelled: its late reply is dropped, not an unknown id
        if message["type"] == "error":
            raise RecallFailed(self.name, str(message["message"]))
        return recall_of(message)

    async def close(self) -> None:
        """Ask the process to close, give it its grace to exit, then kill it."""
        process = self._process
        if process is None:
            return
        try:
            if self._fault is None and process.returncode is None and not self._interrupted:
                self._closing = True
                await self._exchange("close", {"type": "close"}, "closed")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.timeouts.exit):
                        await process.wait()
        finally:
            self._kill()
            await self._stop_reader()

    # -- the wire -----------------------------------------------------------------------------
    async def _exchange(self, phase: str, message: Message, expected: str) -> Message:
        """Send one message and wait for its one reply (within the phase's timeout)."""
        self.phase = phase
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._control = future
        try:
            reply = await self._ask(message, future, getattr(self.timeouts, phase))
        except asyncio.CancelledError:
            self._interrupted = True  # stopped mid-phase (the runner's limit): it is not asked to close
            raise
        finally:
            self._control = None
        if reply["type"] == "error":
            raise self._failed(f"answered {message['type']} with an error: {reply['message']}")
        if reply["type"] != expected:
            raise self._failed(f"answered {message['type']} with {reply['type']!r} (expected {expected!r})")
        return reply

    async def _ask(self, message: Message, future: asyncio.Future[Message], timeout: float) -> Message:
        """Send `message` and wait for the reply `future` gets, both within `timeout`
        (a process that stops reading its stdin blocks the send once the pipe is full).
        asyncio.timeout, not wait_for: Python 3.11's wait_for may swallow a
        cancellation that arrives as its inner step ends."""
        sent = False
        try:
            async with asyncio.timeout(timeout):
                await self._send(message)
                sent = True
                return await asyncio.shield(future)  # a timeout leaves the future to _failed
        except TimeoutError:
            what = "no reply" if sent else "did not read its stdin"
            raise self._failed(f"{what} within {timeout:g} s (its {self.phase} timeout); the process was "
                               f"stopped") from None

    async def _send(self, message: Message) -> None:
        if self._fault is not None:
            raise self._fault
        process = self._process
        assert process is not None and process.stdin is not None
        try:
            async with self._write_lock:
                process.stdin.write(orjson.dumps(message) + b"\n")
                await process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            await self._exited()
            raise self._fault or self._failed("closed its stdin") from None

    async def _read(self) -> None:
        """Dispatch the process's replies until its stdout ends."""
        process = self._process
        assert process is not None and process.stdout is not None
        try:
            while True:
                line = await process.stdout.readline()
                if not line:
                    break
                if line.strip():
                    self._dispatch(parse_reply(line))
        except ProtocolBreak as broken:
            self._failed(str(broken))
            return
        except (ValueError, asyncio.LimitOverrunError):
            self._failed(f"wrote a line longer than {MAX_LINE:,} bytes")
            return
        await self._exited()

    def _dispatch(self, message: Message) -> None:
        ident = message.get("id")
        if message["type"] == "recalled" or (message["type"] == "error" and ident is not None):
            future = self._pending.get(str(ident))
            if future is None and ident in self._abandoned:
                self._abandoned.discard(str(ident))
                return
            if future is None:
                raise ProtocolBreak(f"answered an unknown id {ident!r}")
            if not future.done():
                future.set_result(message)
            return
        control = self._control
        if control is None or control.done():
            if message["type"] == "error":
                raise ProtocolBreak(f"reported an error: {message['message']}")
            raise ProtocolBreak(f"sent {message['type']!r} when nothing was asked")
        control.set_result(message)

    async def _exited(self) -> None:
        """Stdout ended: unless closing, the process crashed."""
        process = self._process
        assert process is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                await process.wait()
        if self._closing and process.returncode == 0:
            return
        code = process.returncode
        how = f"exited with code {code}" if code is not None and code >= 0 else (
            f"was killed by signal {-code}" if code is not None else "closed its stdout")
        self._failed(f"the process {how}{self._log_tail()}")

    def _failed(self, message: str) -> MemoryError:
        """Record the first fault (every later call raises it), fail what waits, stop the process."""
        if self._fault is None:
            self._fault = MemoryError(self.name, self.phase, message)
            for future in [self._control, *self._pending.values()]:
                if future is not None and not future.done():
                    future.set_exception(self._fault)
                    future.exception()  # retrieved here: a waiter may be gone
            self._kill()
        return self._fault

    def _log_tail(self, lines: int = 3) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as log:
            log.seek(max(0, self.log_path.stat().st_size - 4096))
            tail = [line.strip() for line in log.read().decode("utf-8", "replace").splitlines() if line.strip()]
        if not tail:
            return f" (nothing in {self.log_path})"
        text = " / ".join(tail[-lines:])
        return f"; the end of {self.log_path}: {text[-300:]}"

    def _kill(self) -> None:
        """SIGKILL the process's group (its own session: what it started dies with it)."""
        process = self._process
        if process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)

    async def _stop_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None and reader is not asyncio.current_task():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10.0):
                    await reader
        process = self._process
        if process is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10.0):
                    await process.wait()
