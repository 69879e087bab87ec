"""`tulving export`: a run as Inspect logs, read back with inspect_ai's own
`read_eval_log` and opened by `inspect view` in headless chromium; and as
Every Eval Ever records, validated by that package's own validator (and
against the JSON Schemas it ships), run in the Python >= 3.12 environment
.ci/run builds for it ($TULVING_EEE_PYTHON).

Without inspect_ai (the `export` extra) or that environment these tests
skip, except in CI (CI=true), where they fail: a skip must never hide a
failure there."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from engine.benchmark.evaluation.question_ids import question_ids
from engine.benchmark.evaluation.results import load_results
from tests.report_runs import copied_run, tulving
from tests.test_browser_report import ARTIFACTS, Browser, Page, find_browser


def needed(what: str, why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is needed in CI: {why}")
    pytest.skip(f"{what}: {why}")


@pytest.fixture(scope="module")
def run(tmp_path_factory, offline_short_run):
    return copied_run(offline_short_run, tmp_path_factory.mktemp("export"))


@pytest.fixture(scope="module")
def inspect_logs(run):
    try:
        import inspect_ai  # noqa: F401
    except ImportError:
        needed("inspect_ai", "pip install -e '.[export]' (.ci/run does)")
    result = tulving(run.parent, "export", str(run), "--format", "inspect", "--out", "inspect")
    assert result.returncode == 0, result.stderr
    return run.parent / "inspect"


def test_the_inspect_log_reads_back_through_inspect_ais_api(run, inspect_logs, short_book, short_questions):
    from inspect_ai.log import read_eval_log

    [path] = sorted(inspect_logs.glob("*.eval"))
    log = read_eval_log(str(path))
    records = load_results(run)
    scores = json.loads((run / "scores.json").read_text())["runs"][0]
    assert log.status == "success" and log.eval.model == "builtin:reader"
    assert log.eval.task_args == {"book": "synaptic-echoes-short", "memory": "in-context"}
    assert len(log.samples) == 456
    ids = list(question_ids(short_questions, short_book))
    assert [s.id for s in log.samples] == ids
    for sample, record in zip(log.samples, records):
        assert sample.input == record.question and sample.output.completion == record.answer
        assert (sample.scores["f1"].value if "f1" in sample.scores else None) == record.f1
    metrics = log.results.scores[0].metrics
    assert metrics["simple_recall"].value == scores["simple_recall"]
    assert [metrics["simple_recall_ci_low"].value, metrics["simple_recall_ci_high"].value] == scores["simple_recall_ci"]
    assert log.stats.model_usage["builtin:reader"].input_tokens == sum(r.input_tokens for r in records)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _text_when(page: Page, needles: list[str], seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    text = ""
    while time.monotonic() < deadline:
        text = await page.eval("document.body ? document.body.innerText : ''") or ""
        if all(n in text for n in needles):
            return text
        await asyncio.sleep(0.5)
    raise AssertionError(f"the page never showed {needles}: {text[:500]!r}")


async def test_inspect_view_opens_the_log_in_a_real_browser(inspect_logs, short_questions):
    executable = find_browser()
    if executable is None:
        needed("a headless browser", "apt-get install chromium (.ci/run does)")
    port = _free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "inspect"), "view", "--log-dir", str(inspect_logs),
                               "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    browser = Browser(executable)
    try:
        for _ in range(120):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                await asyncio.sleep(0.5)
        browser.start(f"http://127.0.0.1:{port}/")
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{browser.port}/json/list") as resp:
                target = next(t for t in await resp.json() if t["type"] == "page")
            async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                listing = await _text_when(page, ["episodic_memory_benchmark", "builtin:reader", "0.718"])
                assert "456" in listing
                await page.eval("""document.evaluate("//*[text()='episodic_memory_benchmark']", document, null,
                    XPathResult.FIRST_ORDERED_NODE_TYPE, null).singleNodeValue.click()""")
                # The log's page: its scores, and its samples by question id with question and answer.
                await _text_when(page, ["SIMPLE_RECALL", "0.718", "456 samples", "q0000-0ce7b0ce43",
                                        short_questions[0].question[:40]])
                shot = await page.send("Page.captureScreenshot", format="png")
    finally:
        browser.stop()
        server.terminate()
        server.wait(10)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "inspect_view_screenshot.png").write_bytes(base64.b64decode(shot["data"]))


def eee_python() -> str:
    python = os.environ.get("TULVING_EEE_PYTHON")
    if not python or not Path(python).is_file():
        needed("$TULVING_EEE_PYTHON (a Python >= 3.12 with every-eval-ever)",
               "python3.12 -m venv .venv-eee && .venv-eee/bin/pip install every-eval-ever==0.3.0 (.ci/run does)")
    return str(python)


VALIDATE = """import json, sys
from importlib import resources
import jsonschema
from every_eval_ever.validate import main
schemas = resources.files("every_eval_ever") / "schemas"
errors = []
for path in sys.argv[1:]:
    name = "instance_level_eval" if path.endswith(".jsonl") else "eval"
    validator = jsonschema.Draft7Validator(json.loads((schemas / f"{name}.schema.json").read_text()))
    lines = open(path).read().splitlines() if path.endswith(".jsonl") else [open(path).read()]
    errors += [f"{path}: {e.message}" for line in lines for e in validator.iter_errors(json.loads(line))]
print(json.dumps(errors))
sys.exit(main(["--format", "json", *sys.argv[1:]]))
"""


def _validate(python: str, files: list[Path]) -> tuple[int, list[str], list[dict]]:
    """(exit code of the package's validator, jsonschema errors, its per-file report)."""
    result = subprocess.run([python, "-c", VALIDATE, *map(str, files)], capture_output=True, text=True, timeout=300)
    first, _, rest = result.stdout.partition("\n")
    return result.returncode, json.loads(first), json.loads(rest) if rest.strip() else []


def test_every_eval_ever_records_pass_the_packages_own_validator(run, tmp_path):
    python = eee_python()
    result = tulving(run.parent, "export", str(run), "--format", "every-eval-ever", "--out", str(tmp_path / "eee"))
    assert result.returncode == 0, result.stderr
    files = sorted((tmp_path / "eee").rglob("*.json*"))
    assert [f.suffix for f in files] == [".json", ".jsonl"]
    code, schema_errors, report = _validate(python, files)
    assert code == 0 and schema_errors == [] and all(r["valid"] for r in report), report
    aggregate = json.loads(files[0].read_text())
    scores = json.loads((run / "scores.json").read_text())["runs"][0]
    [sr, ca] = aggregate["evaluation_results"]
    assert sr["score_details"]["score"] == scores["simple_recall"]
    assert [sr["score_details"]["uncertainty"]["confidence_interval"][k] for k in ("lower", "upper")] == \
        scores["simple_recall_ci"]
    assert ca["score_details"]["score"] == scores["chronological_awareness"]
    instances = [json.loads(x) for x in files[1].read_text().splitlines()]
    assert len(instances) == 456 and instances[0]["sample_id"] == "q0000-0ce7b0ce43"
    # A check that can fail: a record without its input is refused by both.
    del instances[3]["input"]
    files[1].write_text("".join(json.dumps(x) + "\n" for x in instances))
    code, schema_errors, report = _validate(python, files)
    assert code != 0 and schema_errors and not all(r["valid"] for r in report)
