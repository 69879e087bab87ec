"""Cost a user can trust, through the CLI as a subprocess against the loopback
server: the run summary and the report split cost and tokens by model and
role and show what prompt caching saved; --max-cost is a hard cap under
concurrent calls, stops with exit 4 keeping what finished, and a rerun with a
higher cap continues without paying twice; --dry-run prints the estimate."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.loopback.server import LoopbackServer, constant
from tests.test_run_cli import atulving

# the made-up model ids these tests send: the loopback, like a real API (or a vLLM server
# started with one model), serves only the ids it is told besides the registry's
SERVED = ["claude-loop", "gpt-loop"]

SONNET = 'price_in = 3.0\nprice_cached_in = 0.3\nprice_cache_write = 3.75\nprice_out = 15.0\nbatch_discount = 0.5\n'
GPT4O = 'price_in = 2.5\nprice_cached_in = 1.25\nprice_out = 10.0\nbatch_discount = 0.5\n'


def write_config(tmp_path: Path, server: LoopbackServer, concurrency: int = 8, endpoint: str = "") -> Path:
    """Two endpoints of the loopback (both given the TOML lines `endpoint`) and a model on each."""
    path = tmp_path / "tulving.toml"
    path.write_text(
        f'[endpoints.ant]\nkind = "anthropic"\nbase_url = "{server.anthropic_base_url}"\nfree = true\n'
        f'max_concurrency = {concurrency}\nmax_attempts = 2\n{endpoint}\n'
        f'[endpoints.oai]\nkind = "openai"\nbase_url = "{server.openai_base_url}"\nfree = true\nmax_concurrency = {concurrency}\n'
        f'max_attempts = 2\n{endpoint}\n'
        f'[models.sonnet-loop]\nendpoint = "ant"\nmodel = "claude-loop"\nparams = {{ max_tokens = 50 }}\n{SONNET}\n'
        f'[models.gpt4o-loop]\nendpoint = "oai"\nmodel = "gpt-loop"\nparams = {{ max_tokens = 50 }}\n{GPT4O}\n')
    return path


async def test_the_run_summary_and_report_split_cost_by_model_and_role(tmp_path):
    async with LoopbackServer(in_process=True, models=SERVED, latency=constant(0.02)) as server:
        config = write_config(tmp_path, server)
        code, out, err = await atulving(tmp_path, "--config", str(config), "--cache", "c.sqlite", "run",
                                        "--book", "synaptic-echoes-short", "--models", "sonnet-loop,gpt4o-loop",
                                        "--sample", "6", "--out", "run")
        writes, reads = server.stats.cache_write_tokens, server.stats.cache_read_tokens
    assert code == 0, err
    assert "cost: $" in err and "prompt caching saved $" in err
    assert "sonnet-loop answer: 6 calls (0 cached)" in err and "builtin:judge judge:" in err
    scores = json.loads((tmp_path / "run" / "scores.json").read_text())
    rows = {(r["model"], r["role"]): r for r in scores["spending"]}
    assert set(rows) == {("sonnet-loop", "answer"), ("gpt4o-loop", "answer"), ("builtin:judge", "judge")}
    sonnet, gpt = rows[("sonnet-loop", "answer")], rows[("gpt4o-loop", "answer")]
    assert sonnet["cache_write_tokens"] == writes  # one write of the book (warmed first)...
    assert sonnet["cache_read_tokens"] == 5 * writes  # ...read by the five other questions
    assert gpt["cache_read_tokens"] == reads - 5 * writes > 0  # OpenAI's automatic cache
    for row in (sonnet, gpt):
        assert 0 < row["spent_usd"] < row["list_usd"]
        assert row["caching_saved_usd"] == pytest.approx(row["list_usd"] - row["spent_usd"], abs=2e-6)
    assert rows[("builtin:judge", "judge")]["spent_usd"] == 0
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Cost by model and role" in report and "| sonnet-loop | answer | 6 | 0 |" in report
    # The records price each answer with its prompt-cache usage.
    lines = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert sum(r["cache_write_tokens"] for r in lines if r["model"] == "sonnet-loop") == writes
    # The report over the run folder has the cost table.
    code, out, err = await atulving(tmp_path, "report", "run", "--out", "rep", "--no-figures")
    assert code == 0, err
    table = (tmp_path / "rep" / "tables" / "cost.md").read_text()
    assert "| gpt4o-loop | answer | 6 | 0 |" in table and "| total |" in table
    assert 'id="t-cost"' in (tmp_path / "rep" / "index.html").read_text()
    assert "Cost by model and role" in (tmp_path / "rep" / "report.md").read_text()


def estimate_rows(stdout: str) -> dict[tuple[str, str], list[str]]:
    lines = stdout[stdout.index("cost estimate"):].splitlines()[2:]
    rows = {}
    for line in lines:
        cells = line.split()
        if cells and cells[0] == "total":
            rows[("total", "")] = cells[1:7] + cells[8:]  # without the price band ("-")
        elif len(cells) == 13:
            rows[(cells[0], cells[1])] = cells[2:8] + cells[9:]
    return rows


async def test_dry_run_prints_calls_tokens_and_dollars_by_model_and_role(tmp_path, short_book, short_questions):
    from engine.benchmark.evaluation import answers as A
    from engine.benchmark.evaluation.pipeline import sample_questions
    from engine.tokens import count_tokens

    async with LoopbackServer(in_process=True, models=SERVED, latency=constant(0.02)) as server:
        config = write_config(tmp_path, server)
        args = ["--config", str(config), "--cache", "c.sqlite", "run", "--book", "synaptic-echoes-short",
                "--models", "sonnet-loop,gpt4o-loop", "--sample", "4", "--out", "run"]
        code, out, err = await atulving(tmp_path, *args, "--dry-run")
        assert code == 0, err
        assert server.stats.requests == 0  # nothing called
        rows = estimate_rows(out)
        # By hand: each prompt is the system prompt and the book (the shared prefix), then the question.
        questions = sample_questions(short_questions, 4)
        prefix = count_tokens(A.SYSTEM_PROMPT + A.in_context_prompt(short_book.text, "")[
            :A.in_context_prefix_chars(short_book.text)])
        rests = [count_tokens(A.in_context_prompt(short_book.text, q.question)[A.in_context_prefix_chars(
            short_book.text):]) for q in questions]
        tokens_in = sum(8 + prefix + rest for rest in rests)
        calls, cached, to_call, t_in, shared, t_out, direct, batch, with_cache, both = rows[("sonnet-loop", "answer")]
        assert (calls, cached, to_call) == ("4", "0", "4")
        assert int(t_in.replace(",", "")) == tokens_in and int(shared.replace(",", "")) == 4 * prefix
        assert int(t_out.replace(",", "")) == 4 * 50  # max_tokens
        assert float(direct) == pytest.approx((tokens_in * 3.0 + 200 * 15.0) / 1e6, abs=1e-4)
        assert float(batch) == pytest.approx(float(direct) / 2, abs=1e-4)
        # One write of the book, three reads: Anthropic's prices.
        by_hand = ((tokens_in - 4 * prefix) * 3.0 + prefix * 3.75 + 3 * prefix * 0.3 + 200 * 15.0) / 1e6
        assert float(with_cache) == pytest.approx(by_hand, abs=1e-4)
        assert float(both) == pytest.approx(by_hand / 2, abs=1e-4)
        saving = float(out.split("prompts share a prefix: $")[1].split()[0])
        total = rows[("total", "")]
        assert saving == pytest.approx(float(total[6]) - float(total[8]), abs=2e-4) and saving > 0
        gpt = rows[("gpt4o-loop", "answer")]
        step = prefix // 128 * 128  # OpenAI reads in 128-token steps, charges no write
        assert float(gpt[8]) == pytest.approx((tokens_in * 2.5 - 3 * step * 1.25 + 200 * 10.0) / 1e6, abs=1e-4)
        judge = rows[("builtin:judge", "judge")]
        assert int(judge[0]) >= 8 and float(judge[6]) == 0.0 and judge[7] == "-"  # free, and no batch API
        assert rows[("total", "")][0] == str(8 + int(judge[0]))
        # After the run, the dry run finds every answer and judgment in the cache.
        code, out, err = await atulving(tmp_path, *args)
        assert code == 0, err
        code, out, err = await atulving(tmp_path, *args, "--dry-run")
        assert code == 0, err
        after = estimate_rows(out)
        assert after[("sonnet-loop", "answer")][:3] == ["4", "4", "0"]
        assert after[("builtin:judge", "judge")][1] == after[("builtin:judge", "judge")][0]  # judgments cached too
        assert float(after[("total", "")][7]) == 0.0


async def test_max_cost_is_a_hard_cap_under_concurrent_calls_and_a_rerun_continues(tmp_path):
    asked: list[tuple[str, str]] = []  # (model, prompt) of every call the server answered

    def reply(api: str, body: dict) -> str:
        content = body["messages"][-1]["content"]
        text = content if isinstance(content, str) else "".join(b["text"] for b in content)
        asked.append((body["model"], text))
        return "an answer of a few words"

    async with LoopbackServer(in_process=True, models=SERVED, reply=reply, latency=constant(0.1)) as server:
        config = write_config(tmp_path, server, concurrency=8)
        args = ["--config", str(config), "--cache", "c.sqlite", "run", "--book", "synaptic-echoes-short",
                "--models", "sonnet-loop,gpt4o-loop", "--sample", "24", "--out", "run"]
        cap = 0.25
        code, out, err = await atulving(tmp_path, "--max-cost", str(cap), *args)
        assert code == 4, err
        assert f"stopped by --max-cost {cap:g}" in err and "rerun with a higher --max-cost" in err
        first_calls = len(asked)
        assert 2 < server.stats.max_in_flight and 0 < first_calls < 48
        # The anthropic and openai endpoints share the cap; the spending (priced from the
        # replies' usage, checked against hand-computed dollars in test_costs.py) stays under it.
        run = json.loads((tmp_path / "run" / "run.json").read_text())
        spent = sum(r["spent_usd"] for r in run["spending"])
        assert 0 < spent <= cap
        records = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
        answered = [r for r in records if not r["answer_error"]]
        assert len(answered) == first_calls  # everything finished is kept
        assert all("budget" in r["answer_error"] for r in records if r["answer_error"])
        # A rerun with a higher cap makes only the missing calls.
        code, out, err = await atulving(tmp_path, "--max-cost", "10", *args)
        assert code == 0, err
        assert len(asked) == 48 and len(set(asked)) == 48  # no paid call repeated
        run2 = json.loads((tmp_path / "run" / "run.json").read_text())
        assert sum(r["cached"] for r in run2["spending"] if r["role"] == "answer") == first_calls


async def test_generate_reports_what_writing_cost(tmp_path):
    code, out, err = await atulving(tmp_path, "--cache", "c.sqlite", "generate", "--events", "3", "--model",
                                    "builtin:writer", "--out", "book")
    assert code == 0, err
    line = next(line for line in err.splitlines() if "builtin:writer write:" in line)
    assert "0 cached" in line and "tokens in" in line
    assert "cost: $0.0000 spent" in err


def test_a_dry_run_estimates_without_api_keys_and_the_run_still_needs_them(tmp_path):
    # What a run would cost is wanted before any key is set; the run itself
    # still refuses to start without its keys, naming the variable.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("TULVING") and not k.endswith("_API_KEY")}
    args = [sys.executable, "-m", "engine.cli", "--cache", str(tmp_path / "c.sqlite"), "run", "--models", "gpt-4o",
            "--modes", "in-context", "--judge", "claude-sonnet-5-5", "--sample", "3", "--out", str(tmp_path / "run")]
    dry = subprocess.run([*args, "--dry-run"], env=env, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "OPENAI_API_KEY is not set" in dry.stderr and "ANTHROPIC_API_KEY is not set" in dry.stderr
    rows = {line.split()[0]: line for line in dry.stdout.splitlines() if line.startswith(("gpt-4o ", "claude-sonnet-5-5"))}
    assert set(rows) == {"gpt-4o", "claude-sonnet-5-5"} and "$" not in rows["gpt-4o"]
    assert float(rows["gpt-4o"].split()[-4]) > 0  # priced: the direct dollars of the answers
    real = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert real.returncode == 2 and "needs an API key" in real.stderr and "_API_KEY" in real.stderr
    assert real.stderr.count("\n") == 1 and not (tmp_path / "run" / "results.jsonl").exists()
