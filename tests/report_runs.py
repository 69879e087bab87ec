"""Run folders for the report tests: a real offline run made by the CLI, and
a hostile run derived from it (what a misbehaving model could leave in
results.jsonl: markup, pipes, ANSI escapes, a NUL byte; judge failures; an
answer error) and a run on a sample.

The offline run is made once per session (conftest.py's `offline_short_run`);
a test that writes into its run folder or its cache takes a copy
(`copied_run`), one that only reads it takes it as it is."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from engine.benchmark.evaluation.results import load_results, write_results
from tests.cli import Done
from tests.cli import tulving as run_in_process
from tests.test_run_cli import env

EVIL_MODEL = "evil|<b>$\\frac$model</b>"  # markup, a pipe, and TeX that matplotlib must not parse
EVIL_ANSWER = "<script>window.PWNED=1</script></table></td>| a pipe \x1b[31mred\x1b[0m nul\x00end"
SAMPLED_MODEL = "builtin:reader-sampled"
SAMPLE = 40
EVIL_JUDGE_FAILURES = 3


def tulving(cwd: Path, *args: str) -> Done:
    """The command run in this process (tests/cli.py), in the tests' environment."""
    return run_in_process(cwd, *args, env=env())


def offline_run(cwd: Path, out: str = "run", *extra: str, cache: str = "c.sqlite") -> Path:
    """builtin:reader in-context on the short book, judged by builtin:judge."""
    result = tulving(cwd, "--quiet", "--cache", cache, "run", "--book", "synaptic-echoes-short", "--models",
                     "builtin:reader", "--modes", "in-context", "--judge", "builtin:judge", "--out", out, *extra)
    assert result.returncode == 0, result.stderr
    return cwd / out


def copied_run(source: Path, cwd: Path, out: str = "run") -> Path:
    """What `offline_run(cwd, out)` leaves, without running it again: a copy
    of `source` (an offline_run's folder) as cwd/out, and of its cache
    (source's c.sqlite) as cwd/c.sqlite."""
    shutil.copytree(source, cwd / out)
    for cache in source.parent.glob("c.sqlite*"):
        if not (cwd / cache.name).exists():
            shutil.copy2(cache, cwd / cache.name)
    return cwd / out


def report_of_three_runs(source: Path, root: Path, *extra: str) -> Path:
    """`tulving report` (with `extra` options) over three runs in `root`: a copy
    of `source` (good), its hostile twin (evil) and a run on a sample of it (sampled)."""
    good = copied_run(source, root, "good")
    hostile_run(good, root / "evil")
    renamed_run(good, root / "sampled", SAMPLED_MODEL, SAMPLE)
    result = tulving(root, "report", "good", "evil", "sampled", "--out", "rep", *extra)
    assert result.returncode == 0, result.stderr
    assert "index.html" in result.stdout
    return root / "rep"


def renamed_run(source: Path, out: Path, model: str, sample: int | None = None) -> Path:
    """A copy of `source` as if answered by `model` (on `sample` questions spread over the set)."""
    out.mkdir(parents=True, exist_ok=True)
    records = load_results(source)
    if sample:
        step = len(records) // sample
        records = [records[i * step] for i in range(sample)]
    for r in records:
        r.model = model
    write_results(out / "results.jsonl", records)
    run = json.loads((source / "run.json").read_text())
    for job in run["jobs"]:
        job["model"], job["sample"], job["questions"] = model, sample, len(records)
    (out / "run.json").write_text(json.dumps(run))
    return out


def hostile_run(source: Path, out: Path) -> Path:
    """A copy of `source` as if answered by EVIL_MODEL: answer 0 is
    EVIL_ANSWER, EVIL_JUDGE_FAILURES judge failures, 1 answer error."""
    renamed_run(source, out, EVIL_MODEL)
    records = load_results(out)
    records[0].answer = EVIL_ANSWER
    records[0].identified_items = ["</table><img src=x onerror=alert(1)>"]
    for r in records[1:1 + EVIL_JUDGE_FAILURES]:
        r.judge_failed, r.judge_error, r.f1 = True, "unparsable judge reply after 4 draws: <no json>", None
    err = records[1 + EVIL_JUDGE_FAILURES]
    err.answer, err.answer_error, err.f1, err.judge_failed = "", "http 500: <html>boom</html>", None, True
    write_results(out / "results.jsonl", records)
    return out
