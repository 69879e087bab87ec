"""The commands of `tulving`: name, one-line help and the module that
registers the command's parser and runs it.

`tulving --help` (and --version, and an unknown command) is built from this
table alone; a command's module is imported only when that command is named
(engine/cli/main.py). Each module reads its commands' help from here with
`command_help(name)`, so the table is the one place a command's summary is
written; tests/test_startup.py checks that every module registers exactly
its commands of the table, in its order.
"""
from __future__ import annotations

from typing import NamedTuple


class Command(NamedTuple):
    name: str
    module: str  # registers the command: `register(subparsers)`
    help: str


COMMANDS: tuple[Command, ...] = (
    Command("models", "engine.cli.tools", "list model aliases, their endpoints and whether keys are set"),
    Command("config", "engine.cli.tools", "configuration tools"),
    Command("serve-loopback", "engine.cli.tools",
            "serve the OpenAI/Anthropic APIs on loopback, to try the engine without keys "
            "(options: see `tulving serve-loopback --help`)"),
    Command("bench", "engine.cli.bench", "latency and throughput under load: TTFT, TPOT, ITL, E2E, goodput, sweeps"),
    Command("bench-latency", "engine.cli.bench",
            "alias of `tulving bench` (defaults: -n 50, one call at a time, 16 output tokens)"),
    Command("cache", "engine.cli.cache", "inspect and maintain the response cache"),
    Command("generate", "engine.cli.generate", "generate a benchmark book (events, chapters, ground truth)"),
    Command("book", "engine.cli.generate", "inspect or derive books"),
    Command("run", "engine.cli.evaluate", "evaluate models on a book: answers, judgments, scores, report"),
    Command("questions", "engine.cli.evaluate", "write the question set of a book (JSON Lines)"),
    Command("finetune", "engine.cli.evaluate",
            "write a book's fine-tuning data and fine-tune a model on it (OpenAI API)"),
    Command("report", "engine.cli.evaluate",
            "re-render a run folder's scores and report, or write the HTML report of runs (--out)"),
    Command("compare", "engine.cli.evaluate",
            "test whether run A scores higher than run B (paired or unpaired, picked from the runs)"),
    Command("agreement", "engine.cli.evaluate",
            "agreement of two judges on the same answers (runs differing only by --judge)"),
    Command("memories", "engine.cli.memories",
            "list the memory systems a run can evaluate (--modes, --memory) and whether each can run here"),
    Command("batches", "engine.cli.batches", "provider batches submitted by --batch runs: list, cancel"),
    Command("data", "engine.cli.data", "fetch and import the published release (all 11 books and the paper's runs)"),
    Command("books", "engine.cli.data", "list the books installed and the ones `tulving data fetch` adds"),
)

_BY_NAME = {command.name: command for command in COMMANDS}


def command_help(name: str) -> str:
    """The one-line help of command `name` (a KeyError for a name not in the table)."""
    return _BY_NAME[name].help


def module_of(name: str | None) -> str | None:
    """The module that registers command `name`, or None for a name not in the table."""
    command = _BY_NAME.get(name) if name is not None else None
    return command.module if command is not None else None
