"""`tulving run --memory mem0,mem0-extract,lancedb,graphiti` end to end, offline:
the built-in reader answers and judges, MiniLM embeds, mem0's LLM and embedder
call Tulving's endpoint on loopback, and the results carry each question's
evidence with its chapters, scored against the ground truth.

The command runs in the test's process (tests/cli.py: the command line's entry
point, as the console script calls it): a process of its own paid seconds of
CPU, twice, importing the four libraries that tests/test_memory_adapters.py has
imported already. The process is not the subject here."""
from __future__ import annotations

import json
import re

from tests.test_memory_adapters import ADAPTERS, needs
from tests.test_run_cli import in_process
from tests.wheel_install import _clean_env, _run

SAMPLE = 24
SYSTEMS = ("mem0", "mem0-extract", "lancedb", "graphiti")
_LABEL = re.compile(r"^Chapter (\d+), Paragraph \d+\n")


def run(tmp_path, out: str, systems: tuple[str, ...] = SYSTEMS) -> tuple[dict[str, list[dict]], dict]:
    done = in_process(tmp_path, "--quiet", "--cache", "cache.sqlite", "run", "--book", "synaptic-echoes-short",
                      "--models", "builtin:reader", "--judge", "builtin:judge", "--embed-model", "local:minilm",
                      "--modes", "rag-paragraph", "--memory", ",".join(systems), "--sample", str(SAMPLE),
                      "--out", out)
    assert done.returncode == 0, done.stderr[-3000:]
    rows: dict[str, list[dict]] = {}
    for line in (tmp_path / out / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.setdefault(row["mode"], []).append(row)
    return rows, json.loads((tmp_path / out / "run.json").read_text())["memory"]


def libraries() -> None:
    needs("mem0", "mem0")
    needs("lancedb", "lancedb")
    needs("graphiti_core", "graphiti")


def test_mem0_and_lancedb_run_as_contestants_and_a_rerun_ingests_from_the_cache(tmp_path):
    libraries()
    rows, memory = run(tmp_path, "first")
    assert sorted(rows) == sorted(("rag-paragraph", *SYSTEMS))
    for name in SYSTEMS:
        assert len(rows[name]) == SAMPLE and memory[name]["failure"] is None
        assert all(r["answer_error"] is None for r in rows[name]), name
        assert all(r["evidence"] for r in rows[name]) or name == "graphiti", name  # a graph may know no fact
        assert any(r.get("retrieval_recall") for r in rows[name]), name  # ground-truth chapters were found
    # mem0 stored the paper's chunks: each passage's label names the chapter mem0 kept in its metadata.
    for row in rows["mem0"]:
        for passage in row["evidence"]:
            assert int(_LABEL.match(passage["text"]).group(1)) == passage["chapter"]
    # LanceDB searches the same chunks with the same embeddings exactly: the paper's rag-paragraph retrieval.
    paper = {r["question"]: r["evidence_chapters"] for r in rows["rag-paragraph"]}
    assert all(r["evidence_chapters"] == paper[r["question"]] for r in rows["lancedb"])
    # mem0's extraction went through the endpoint: one chat call per chapter, in its ingest phase.
    ingest = memory["mem0-extract"]["phases"]["ingest"]
    assert ingest["calls"] > 19 and memory["mem0"]["phases"]["ingest"]["calls"] >= 121
    assert memory["mem0-extract"]["phases"]["recall"]["calls"] == SAMPLE  # one query embedding per question
    assert memory["graphiti"]["phases"]["ingest"]["calls"] > 2 * 19  # entities and facts per chapter, and more

    # Another run folder, the same cache: ingest is replayed. (mem0-extract's prompt holds today's date:
    # cached within the day only; graphiti's replay is not what this checks: both are left out of the rerun.)
    again, memory_again = run(tmp_path, "second", ("mem0", "lancedb"))
    assert sorted(memory_again) == ["lancedb", "mem0", "rag-paragraph"]
    for name in ("mem0", "lancedb"):
        phases = memory_again[name]["phases"]
        assert phases["ingest"]["calls"] == phases["ingest"]["cached"] > 0, name
        before = {r["question"]: r["evidence"] for r in rows[name]}
        assert {r["question"]: r["evidence"] for r in again[name]} == before, name


def test_the_built_wheel_declares_the_adapters_and_their_extras(installed):
    """The wheel (built and installed once per session: tests/wheel_install.py) carries the
    adapters' modules, their entry points and the extras that install their libraries."""
    libraries()
    tulving, work = installed
    venv = tulving.parents[1]
    (dist,) = venv.glob("lib/python*/site-packages/tulving_bench-*.dist-info")
    entry_points = (dist / "entry_points.txt").read_text()
    metadata = (dist / "METADATA").read_text()
    for name, target in ADAPTERS.items():
        assert f"{name} = {target}" in entry_points, name
        module = target.split(":")[0].replace(".", "/") + ".py"
        assert (dist.parent / module).is_file(), module
    for extra, requirement in (("mem0", "mem0ai"), ("lancedb", "lancedb"), ("graphiti", "graphiti-core")):
        assert f"Provides-Extra: {extra}" in metadata
        assert any(line.startswith(f"Requires-Dist: {requirement}") and f'extra == "{extra}"' in line
                   for line in metadata.splitlines()), extra
    listed = _run([str(tulving), "memories"], cwd=work, env=_clean_env())
    assert listed.returncode == 0, listed.stderr
    for name in ADAPTERS:  # the libraries come from the test environment (its .pth): runnable
        row = next(line for line in listed.stdout.splitlines() if line.startswith(name + " "))
        assert " yes " in row, row
