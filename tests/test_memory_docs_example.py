"""The example adapter of docs/memory-systems.md, copied from the page as it
stands and run on the short published book: through SubprocessMemory (open,
ingest every chapter, ready, recall, close), and through `tulving run
--memory` as the page tells a user to run it."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from engine.benchmark.memory.contract import Budget, Chapter
from engine.benchmark.memory.subprocess_memory import SubprocessMemory
from tests.test_memory_subprocess import LentServices

PAGE = Path(__file__).resolve().parents[1] / "docs" / "memory-systems.md"
EXAMPLE = re.compile(r"<!-- example: (?P<name>[\w.]+) -->\n```python\n(?P<code>.*?)\n```", re.S)


def examples() -> dict[str, str]:
    return {m["name"]: m["code"] + "\n" for m in EXAMPLE.finditer(PAGE.read_text(encoding="utf-8"))}


def test_the_page_holds_a_short_complete_example():
    code = examples()["keyword_memory.py"]
    assert 25 <= len(code.splitlines()) <= 45
    compile(code, "keyword_memory.py", "exec")


async def test_the_documented_example_reads_the_book_and_finds_the_chapters(tmp_path, short_book, short_questions):
    script = tmp_path / "keyword_memory.py"
    script.write_text(examples()["keyword_memory.py"])
    memory = SubprocessMemory("keywords", command=[sys.executable, str(script)])
    await memory.open(LentServices(tmp_path / "work"))
    await memory.ingest([Chapter(k, text) for k, text in enumerate(short_book.chapter_texts, 1)])
    await memory.ready()
    # Questions about a single event: their one ground-truth chapter should rank first.
    single = sorted({q.question: q for q in short_questions if q.n_chapters == 1}.items())[:40]
    budget = Budget(passages=5, tokens=None)
    recalls = [await memory.recall(text, budget) for text, _ in single]
    await memory.close()
    assert memory._process.returncode == 0 and memory.concurrency == 1 and memory.answers is False
    assert all(0 < len(r.passages) <= 5 and r.answer is None for r in recalls)
    texts = dict(enumerate(short_book.chapter_texts, 1))
    assert all(p.text == texts[p.chapter] for r in recalls for p in r.passages)
    found = sum(r.passages[0].chapter in q.chapters for r, (_, q) in zip(recalls, single))
    assert found >= len(single) // 2, f"top chapter right for {found} of {len(single)} questions"


def test_the_documented_example_on_the_leaderboard_through_the_cli(tmp_path):
    """As the page says to use it: a [memories.NAME] table with its command,
    `tulving run --memory NAME`, scored beside the models."""
    script = tmp_path / "keyword_memory.py"
    script.write_text(examples()["keyword_memory.py"])
    config = tmp_path / "tulving.toml"
    config.write_text(f'[memories.keywords]\ncommand = ["{sys.executable}", "{script}"]\ntimeout_recall = 120\n')
    env = {k: v for k, v in os.environ.items() if k not in ("TULVING_CONFIG", "TULVING_CACHE")}
    env["PYTHONPATH"] = str(PAGE.parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-m", "engine.cli", "--quiet", "--config", str(config), "--cache",
                           str(tmp_path / "cache.sqlite"), "run", "--memory", "keywords", "--out", "run"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line for line in done.stdout.splitlines() if " keywords " in line)
    assert "builtin:reader" in row and "456/456" in row
    memory = json.loads((tmp_path / "run" / "run.json").read_text())["memory"]["keywords"]
    assert memory["origin"].startswith("command ") and set(memory["phases"]) == {"open", "ingest", "ready", "recall",
                                                                                  "close"}
    assert memory["recall_latency"]["count"] == 456 and memory["evidence"]["failed"] == 0
