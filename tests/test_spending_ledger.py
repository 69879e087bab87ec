"""The spending ledger in the cache, through the CLI as a
subprocess against the loopback's priced aliases: `--max-cost` counts what
earlier invocations of the same run spent from any --out folder (unless
`--max-cost-scope invocation`), a killed invocation's paid calls included;
`tulving cache spending` and `--dry-run` show it; the same on PostgreSQL; and
caches written before the ledger open and gain its table."""
from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import sys
from pathlib import Path

import asyncpg
import pytest

from cache.pg_schema import DDL, SCHEMA_NAME
from cache.store import FORMAT, SCHEMA
from engine.loopback.server import LoopbackServer, constant
from tests.test_cost_cli import write_config
from tests.test_trust import SERVED, env, run_cli, spent

BOOK = ["--book", "synaptic-echoes-short"]
MODELS = ["--models", "sonnet-loop,gpt4o-loop", "--sample", "24"]
CAP = 0.25


def run_args(config: Path, cache: str, out: str, *extra: str) -> list[str]:
    return ["--config", str(config), "--cache", cache, *extra, "run", *BOOK, *MODELS, "--out", out]


def this_invocation(tmp_path: Path, out: str) -> float:
    return spent(json.loads((tmp_path / out / "run.json").read_text()), "spending_this_invocation")


def ledger_rows(path: Path) -> list[tuple[str, str, float, int]]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT run, invocation, spent_usd, calls FROM spending ORDER BY started_at").fetchall()


async def two_folders_then_scope_invocation(tmp_path: Path, config: Path, cache: str) -> list[float]:
    """(a) a second --out folder of the same configuration counts the first's
    spending; (b) --max-cost-scope invocation does not. Returns what each of
    the three invocations spent."""
    e = env(tmp_path)
    code, out, err = await run_cli(tmp_path, *run_args(config, cache, "a", "--max-cost", str(CAP)), environ=e)
    assert code == 4, err
    first = this_invocation(tmp_path, "a")
    assert 0 < first <= CAP
    # Another folder, the same run: the cap counts what folder a paid, so this one stops at once.
    code, out, err = await run_cli(tmp_path, *run_args(config, cache, "b", "--max-cost", str(CAP)), environ=e)
    assert code == 4, err
    assert "not sent: --max-cost reached" in out
    second = this_invocation(tmp_path, "b")
    assert first + second <= CAP + 1e-9
    # Scoped to the invocation, the cap is this invocation's alone: it spends anew.
    code, out, err = await run_cli(tmp_path, *run_args(config, cache, "c", "--max-cost", str(CAP)),
                                   "--max-cost-scope", "invocation", environ=e)
    assert code == 4, err
    third = this_invocation(tmp_path, "c")
    assert 0 < third <= CAP + 1e-9 and first + second + third > CAP
    return [first, second, third]


async def test_max_cost_counts_other_folders_unless_scoped_to_the_invocation_and_the_ledger_shows_it(tmp_path):
    async with LoopbackServer(models=SERVED, reply=lambda api, body: "an answer of a few words",
                              latency=constant(0.02)) as server:
        config = write_config(tmp_path, server, concurrency=4)
        paid = await two_folders_then_scope_invocation(tmp_path, config, "c.sqlite")
    rows = ledger_rows(tmp_path / "c.sqlite")
    assert len(rows) == 3 and len({r[0] for r in rows}) == 1 and len({r[1] for r in rows}) == 3
    assert [r[2] for r in rows] == pytest.approx(paid, abs=1e-5)
    e = env(tmp_path)
    code, out, err = await run_cli(tmp_path, "--cache", "c.sqlite", "cache", "spending", environ=e)
    assert code == 0, err
    [line] = [line for line in out.splitlines() if rows[0][0][:12] in line]
    assert f"${sum(paid):.4f}" in line and "synaptic-echoes-short: sonnet-loop,gpt4o-loop" in line
    assert line.split()[3] == "3"  # invocations
    # --dry-run shows what the ledger holds for this run beside the estimate...
    code, out, err = await run_cli(tmp_path, *run_args(config, "c.sqlite", "d"), "--dry-run", environ=e)
    assert code == 0, err
    assert f"this run already spent ${sum(paid):.4f} on {sum(r[3] for r in rows)} calls in 3 invocations" in out
    assert "cost estimate" in out
    # ...and another configuration is another run.
    code, out, err = await run_cli(tmp_path, "--config", str(config), "--cache", "c.sqlite", "run", *BOOK,
                                   "--models", "sonnet-loop", "--sample", "3", "--out", "e", "--dry-run", environ=e)
    assert code == 0, err
    assert "spending ledger: nothing spent on this run yet" in out


async def test_a_killed_invocation_s_paid_calls_count_on_the_rerun(tmp_path):
    async with LoopbackServer(models=SERVED, reply=lambda api, body: "an answer of a few words",
                              latency=constant(0.25)) as server:
        config = write_config(tmp_path, server, concurrency=2)
        e = env(tmp_path)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "engine.cli", *run_args(config, "c.sqlite", "run"), cwd=tmp_path, env=e,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        try:
            for _ in range(600):  # until the ledger holds a few paid calls (polled, not timed)
                await asyncio.sleep(0.1)
                if (tmp_path / "c.sqlite").exists() and _table(tmp_path / "c.sqlite") and \
                        sum(r[3] for r in ledger_rows(tmp_path / "c.sqlite")) >= 4:
                    break
            else:
                pytest.fail("the run recorded no spending")
        finally:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()
        assert proc.returncode == -signal.SIGKILL
        assert not (tmp_path / "run" / "run.json").exists()  # nothing in the folder tells what it spent
        [(run, _, killed_usd, killed_calls)] = ledger_rows(tmp_path / "c.sqlite")
        assert killed_calls >= 4 and killed_usd > 0
        sent = server.stats.requests
        # Rerun with a cap a hair above what the killed one paid: every uncached call is refused.
        cap = killed_usd + 1e-6
        code, out, err = await run_cli(tmp_path, *run_args(config, "c.sqlite", "run", "--max-cost", str(cap)),
                                       environ=e)
        assert code == 4, err
        assert server.stats.requests == sent
    assert this_invocation(tmp_path, "run") == 0
    rows = ledger_rows(tmp_path / "c.sqlite")
    assert len(rows) == 2 and rows[1][0] == run and rows[1][2] == 0.0  # (its calls: the built-in judge's, free)


def _table(path: Path) -> bool:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'spending'").fetchone() is not None


async def test_a_cache_written_before_the_ledger_opens_and_gains_its_table(tmp_path):
    old = tmp_path / "old.sqlite"
    with sqlite3.connect(old) as conn:  # the first format: no checksum column, no spending table
        conn.executescript(SCHEMA.replace(",\n    checksum TEXT\n", "\n"))
        conn.execute("INSERT INTO meta (name, value) VALUES ('format', ?), ('version', '1')", (FORMAT,))
    e = env(tmp_path)
    code, out, err = await run_cli(tmp_path, "--cache", str(old), "cache", "spending", environ=e)
    assert code == 0, err
    assert out.strip() == "no spending recorded in this cache" and not _table(old)  # reading creates nothing
    async with LoopbackServer(models=SERVED, reply=lambda api, body: "an answer", latency=constant(0.01)) as server:
        config = write_config(tmp_path, server)
        code, out, err = await run_cli(tmp_path, *run_args(config, str(old), "run", "--max-cost", "5"), environ=e)
    assert code == 0, err
    [(_, _, usd, calls)] = ledger_rows(old)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert usd > 0 and usd == pytest.approx(this_invocation(tmp_path, "run"), abs=1e-5)
    assert calls == run["engine"]["succeeded"] >= 48  # every call that replied (the built-in judge's too, at $0)


async def test_the_ledger_on_postgresql_from_a_database_made_before_it(tmp_path, pg_url):
    # A database laid out by the Tulving before the ledger: every table but `spending`.
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(DDL.split("CREATE TABLE IF NOT EXISTS spending")[0])
        await conn.execute(f"INSERT INTO {SCHEMA_NAME}.schema_version (version) VALUES (1)")
    finally:
        await conn.close()
    async with LoopbackServer(models=SERVED, reply=lambda api, body: "an answer of a few words",
                              latency=constant(0.02)) as server:
        config = write_config(tmp_path, server, concurrency=4)
        paid = await two_folders_then_scope_invocation(tmp_path, config, pg_url)
    conn = await asyncpg.connect(pg_url)
    try:
        rows = await conn.fetch(f"SELECT run, spent_usd FROM {SCHEMA_NAME}.spending ORDER BY started_at")
    finally:
        await conn.close()
    assert len({r["run"] for r in rows}) == 1 and [r["spent_usd"] for r in rows] == pytest.approx(paid, abs=1e-5)
    code, out, err = await run_cli(tmp_path, "--cache", pg_url, "cache", "spending", environ=env(tmp_path))
    assert code == 0, err
    assert f"${sum(paid):.4f}" in out and "password" not in out


async def test_generate_counts_what_earlier_invocations_of_the_same_generation_paid(tmp_path):
    """engine/cli/generate.py: `tulving generate` feeds the spending ledger
    under a key of what makes its calls (not the folder), so a second
    invocation of the same generation, into another folder, starts from what
    the first paid and --max-cost refuses every uncached call; another
    generation (another seed) is another entry; --max-cost-scope invocation
    counts this invocation alone."""
    async with LoopbackServer(models=SERVED, reply=lambda api, body: "a chapter of a few words",
                              latency=constant(0.02)) as server:
        config = write_config(tmp_path, server, concurrency=2)
        e = env(tmp_path)

        def generate(out: str, *extra: str) -> list[str]:
            return ["--config", str(config), "--cache", "c.sqlite", "--max-cost", "0.02", "generate", "--events",
                    "40", "--model", "gpt4o-loop", "--itermax", "1", "--out", out, *extra]

        await run_cli(tmp_path, *generate("a"), environ=e)
        [(run, _, first_usd, first_calls)] = ledger_rows(tmp_path / "c.sqlite")
        assert 0 < first_usd <= 0.02 + 1e-9 and first_calls > 0
        sent = server.stats.requests
        # The same generation into another folder: the cap counts what "a" paid.
        await run_cli(tmp_path, *generate("b"), environ=e)
        rows = ledger_rows(tmp_path / "c.sqlite")
        assert len(rows) == 2 and rows[1][0] == run and rows[1][2] <= 0.02 - first_usd + 1e-9
        paid_b = server.stats.requests - sent
        # Scoped to the invocation: it spends anew, up to the cap.
        await run_cli(tmp_path, *generate("c", "--max-cost-scope", "invocation"), environ=e)
        rows = ledger_rows(tmp_path / "c.sqlite")
        assert len(rows) == 3 and rows[2][0] == run and rows[2][2] > 0
        # Another seed is another generation in the ledger.
        await run_cli(tmp_path, *generate("d", "--seed", "7"), environ=e)
        rows = ledger_rows(tmp_path / "c.sqlite")
        assert len(rows) == 4 and rows[3][0] != run
    assert paid_b < first_calls  # the second invocation was held to what was left
    code, out, err = await run_cli(tmp_path, "--cache", "c.sqlite", "cache", "spending", environ=e)
    assert code == 0, err
    assert "generate c: gpt4o-loop" in out and "generate d: gpt4o-loop" in out  # each run: its latest invocation
