"""`tulving bench`: the figures on constructed outcomes (engine/benchmark/latency/metrics.py),
the arrival schedules (load.py), the client's lag probe (runner.py), and the
real command (in this process, tests/cli.py; as a subprocess for SIGTERM)
against the loopback server made as `python -m engine.loopback --ttft-ms ...
--token-delay-ms ... --latency ...` makes it, served from a thread
(tests/loopback_thread.py), with known latency distributions."""
from __future__ import annotations

import asyncio
import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from engine.benchmark.latency.load import Arrival, LoadPoint, parse_arrival, parse_rate, parse_sweep, points, schedule
from engine.benchmark.latency.metrics import (
    RequestRecord,
    distribution,
    meets,
    parse_percentiles,
    parse_slo,
    peak_in_flight,
    peak_output_rate,
    record,
    summarize,
)
from engine.benchmark.latency.runner import LagProbe
from engine.loopback.server import lognormal, uniform
from engine.requests import ChatRequest, Outcome
from providers.base import TIMEOUT, ChatResult, ProviderError, StreamTimings, TulvingError
from tests import cli
from tests.loopback_thread import ThreadedLoopback

ROOT = Path(__file__).resolve().parent.parent


# -- per-request figures from constructed outcomes ---------------------------------------------

def _outcome(*, ttft=0.1, chunks=(0.1, 0.12, 0.15, 0.19), latency=0.2, out=4, inp=50, sent_at=100.5,
             queued=0.01, attempts=1, cached=False, error=None):
    request = ChatRequest(model="m", messages=[{"role": "user", "content": "hi"}], stream=True, cache_read=False)
    if error is not None:
        return Outcome(request=request, error=error, attempts=attempts, queued=queued, sent_at=sent_at)
    timings = StreamTimings(ttft=ttft, chunk_times=tuple(chunks)) if chunks is not None else None
    result = ChatResult(text="a b c d", input_tokens=inp, output_tokens=out, latency=latency, timings=timings)
    return Outcome(request=request, result=result, attempts=attempts, cached=cached, queued=queued, sent_at=sent_at)


def test_a_record_reads_ttft_itl_e2e_and_tokens_from_the_outcome():
    rec = record(_outcome(attempts=3), index=7, scheduled=0.4, started=0.45, done=0.7, origin=100.0)
    assert rec.status == "ok" and rec.index == 7 and rec.retries == 2
    assert rec.ttft == pytest.approx(0.1) and rec.e2e == pytest.approx(0.2) and rec.sent == pytest.approx(0.5)
    # ITL: the gaps after the first chunk only (TTFT is not an inter-token latency).
    assert rec.itl == pytest.approx([0.02, 0.03, 0.04])
    # TPOT leaves the first token out: (E2E - TTFT) / (output tokens - 1).
    assert rec.tpot == pytest.approx((0.2 - 0.1) / 3)
    assert (rec.input_tokens, rec.output_tokens) == (50, 4)  # the reply's usage, not a re-count
    assert rec.chunk_times == pytest.approx([0.6, 0.62, 0.65, 0.69])
    row = rec.row()
    assert "chunk_times" not in row and row["tpot"] == pytest.approx(rec.tpot)
    json.dumps(row)


def test_a_cached_outcome_is_never_timed():
    cached = record(_outcome(cached=True, ttft=0.0001, latency=0.0001), index=0, scheduled=0, started=0, done=0.001,
                    origin=100.0)
    assert cached.status == "cached" and cached.ttft is None and cached.e2e is None and not cached.itl
    timed = record(_outcome(), index=1, scheduled=0, started=0, done=0.7, origin=100.0)
    summary = summarize([cached, timed])
    assert summary.cached == 1 and summary.completed == 1 and summary.failed == {}
    assert summary.ttft.count == 1 and summary.ttft.min == pytest.approx(0.1)
    assert summary.e2e.count == 1 and summary.output_tokens == 4


def test_a_failed_outcome_counts_by_kind_and_has_no_latency():
    rec = record(_outcome(error=ProviderError(TIMEOUT, "slow"), attempts=6), index=0, scheduled=0, started=0,
                 done=3.0, origin=100.0)
    assert rec.status == "timeout" and rec.retries == 5 and rec.e2e is None and "slow" in rec.error
    summary = summarize([rec, record(_outcome(), index=1, scheduled=0, started=0, done=1.0, origin=100.0)])
    assert summary.failed == {"timeout": 1} and summary.completed == 1 and summary.retries == 5


def test_an_unstreamed_reply_has_e2e_but_no_ttft_itl_or_tpot():
    rec = record(_outcome(chunks=None, ttft=None), index=0, scheduled=0, started=0, done=0.7, origin=100.0)
    assert rec.e2e == pytest.approx(0.2) and rec.ttft is None and rec.itl == [] and rec.tpot is None
    s = summarize([rec])
    assert s.ttft is None and s.itl is None and s.tpot is None and s.e2e.count == 1


def test_distribution_has_every_statistic_and_the_chosen_percentiles():
    d = distribution([float(x) for x in range(1, 101)], parse_percentiles("50,90,99.9"))
    assert (d.mean, d.median, d.min, d.max, d.count) == (50.5, 50.5, 1.0, 100.0, 100)
    assert d.std == pytest.approx(np.std(range(1, 101)))
    assert d.percentiles == {"p50": 50.5, "p90": pytest.approx(90.1), "p99.9": pytest.approx(99.901)}
    assert distribution([]) is None


def _rec(i, *, ttft, e2e, out, status="ok", sent=0.0, done=None):
    return RequestRecord(index=i, scheduled=sent, started=sent, sent=sent, done=done if done is not None else sent + e2e,
                         ttft=ttft, e2e=e2e, output_tokens=out, status=status)


def test_goodput_on_a_constructed_case():
    slo = parse_slo("ttft=500ms,tpot=50ms,e2e=10s")
    assert slo == {"ttft": 0.5, "tpot": 0.05, "e2e": 10.0}
    records = [
        _rec(0, ttft=0.2, e2e=1.2, out=21),    # TPOT 50 ms exactly: meets (<=)
        _rec(1, ttft=0.6, e2e=1.0, out=10),    # TTFT too slow
        _rec(2, ttft=0.1, e2e=2.1, out=21),    # TPOT 100 ms: too slow
        _rec(3, ttft=0.3, e2e=11.0, out=101),  # TPOT 107 ms and E2E 11 s
        _rec(4, ttft=0.3, e2e=0.3, out=1),     # one token: TPOT undefined, meets
        _rec(5, ttft=None, e2e=None, out=0, status="timeout", done=3.0),
        _rec(6, ttft=None, e2e=0.5, out=5),    # not streamed: no TTFT, so no TTFT SLO met
        _rec(7, ttft=0.05, e2e=0.5, out=10),   # meets all
    ]
    assert [meets(r, slo) for r in records] == [True, False, False, False, True, False, False, True]
    s = summarize(records, duration=4.0, slo=slo)
    assert s.good == 3 and s.goodput == pytest.approx(3 / 4.0) and s.good_share == pytest.approx(3 / 8)
    assert s.completed == 7 and s.request_throughput == pytest.approx(7 / 4.0)
    # TPOT is defined for requests of 2+ output tokens only.
    assert s.tpot.count == 5
    # E2E alone: 0 (1.2 s), 1, 4, 6 (unstreamed: no TTFT needed) and 7.
    assert summarize(records, duration=4.0, slo=parse_slo("e2e=1.5s")).good == 5


def test_peak_in_flight_and_peak_output_rate():
    records = [_rec(0, ttft=0.1, e2e=1.0, out=10, sent=0.0), _rec(1, ttft=0.1, e2e=1.0, out=10, sent=0.5),
               _rec(2, ttft=0.1, e2e=0.2, out=10, sent=0.6), _rec(3, ttft=0.1, e2e=0.5, out=10, sent=1.0)]
    # [0, 1], [0.5, 1.5], [0.6, 0.8], [1.0, 1.5]: three at once at 0.6-0.8 (a reply at 1.0 before the send at 1.0)
    assert peak_in_flight(records) == 3
    records[0].chunk_times = [0.1 * k for k in range(1, 11)]     # 10 chunks in second 0 and 1
    records[1].chunk_times = [1.1, 1.2]                          # 2 chunks carrying 5 tokens each, second 1
    records[2].chunk_times = []                                  # unstreamed: all 10 at its end (0.8)
    records[3].chunk_times = [1.5]
    # second 0: 9 chunks of request 0 (0.1 .. 0.9) + 10 of request 2 = 19; second 1: 1 + 10 + 10 = 21
    assert peak_output_rate(records) == pytest.approx(21.0)


def test_option_values_are_parsed_or_refused_in_one_line():
    assert parse_rate("inf") == math.inf and parse_rate("2.5") == 2.5
    assert parse_arrival("gamma:0.5") == Arrival("gamma", 0.5) and parse_arrival("constant") == Arrival("constant")
    assert parse_sweep("rate=1,2,4") == ("rate", [1.0, 2.0, 4.0])
    assert parse_sweep("concurrency=1,16") == ("concurrency", [1.0, 16.0])
    assert parse_slo("ttft=0.5s,e2e=2000") == {"ttft": 0.5, "e2e": 2.0}  # a bare number is ms
    assert parse_slo("tpot=800us") == {"tpot": pytest.approx(0.0008)}
    for bad, call in [("-1", parse_rate), ("0", parse_rate), ("nan", parse_rate), ("x", parse_rate),
                      ("gamma:0", parse_arrival), ("gamma", parse_arrival), ("uniform", parse_arrival),
                      ("rate=1,-2", parse_sweep), ("concurrency=0", parse_sweep), ("speed=1", parse_sweep),
                      ("ttft=abc", parse_slo), ("ttfb=5ms", parse_slo), ("ttft=-5ms", parse_slo),
                      ("101", parse_percentiles)]:
        with pytest.raises(TulvingError) as err:
            call(bad)
        assert "\n" not in str(err.value)


# -- arrivals ---------------------------------------------------------------------------------------

def _gaps(arrival: Arrival, rate: float = 100.0, n: int = 4000, seed: int = 0) -> np.ndarray:
    return np.diff(list(schedule(LoadPoint(rate=rate, arrival=arrival, requests=n, seed=seed))))


def test_poisson_arrivals_have_the_right_mean_rate_and_exponential_gaps():
    gaps = _gaps(Arrival("poisson"), rate=100.0)
    # The mean gap of n exponential gaps has standard error (1/rate)/sqrt(n): within 3 of them.
    assert abs(gaps.mean() - 0.01) < 3 * 0.01 / math.sqrt(gaps.size)
    assert stats.kstest(gaps, "expon", args=(0, 0.01)).pvalue > 0.01
    assert np.array_equal(gaps, _gaps(Arrival("poisson"), rate=100.0))  # seeded
    assert not np.array_equal(gaps, _gaps(Arrival("poisson"), rate=100.0, seed=1))


def test_gamma_burstiness_changes_the_dispersion_not_the_rate():
    cv = {}
    for b in (0.25, 1.0, 4.0):
        gaps = _gaps(Arrival("gamma", b))
        assert abs(gaps.mean() - 0.01) < 4 * 0.01 / math.sqrt(b * gaps.size)
        cv[b] = gaps.std() / gaps.mean()
        assert cv[b] ** 2 == pytest.approx(1 / b, rel=0.15)  # the squared coefficient of variation is 1/B
    assert cv[0.25] > cv[1.0] > cv[4.0]
    assert np.allclose(_gaps(Arrival("constant"), n=50), 0.01)
    assert list(schedule(LoadPoint(requests=3))) == [0.0, 0.0, 0.0]  # --rate inf: all at once


def test_a_duration_bounds_the_schedule_and_a_sweep_makes_one_point_per_value():
    times = list(schedule(LoadPoint(rate=50, requests=None, duration=2.0)))
    assert times[-1] < 2.0 and 70 < len(times) < 130
    swept = points(LoadPoint(rate=5, max_concurrency=2), ("concurrency", [1, 8]))
    assert [(p.rate, p.max_concurrency) for p in swept] == [(5, 1), (5, 8)]


async def test_the_lag_probe_sees_a_blocked_event_loop():
    probe = LagProbe(interval=0.002)
    probe.start()
    await asyncio.sleep(0.05)
    time.sleep(0.08)  # the loop is blocked: the probe wakes ~80 ms late
    await asyncio.sleep(0.02)
    await probe.stop()
    mean, p99, worst = probe.figures()
    assert worst >= 70 and len(probe.lags) >= 5


# -- the command, against a loopback server in its own process ------------------------------------------

def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TULVING")}


class Server(ThreadedLoopback):
    def __init__(self, *args: str):
        # the loopback serves the ids config_for() names, as a vLLM server serves the model it started with
        super().__init__("--models", "m-model,other-model", *args)


@pytest.fixture
def serve():
    servers: list[Server] = []

    def start(*args: str) -> Server:
        servers.append(Server(*args))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def config_for(tmp_path: Path, url: str, models=("m",), concurrency: int = 256) -> Path:
    text = f'[endpoints.loop]\nkind = "openai"\nbase_url = "{url}"\nfree = true\nmax_concurrency = {concurrency}\n'
    for m in models:
        text += f'\n[models.{m}]\nendpoint = "loop"\nmodel = "{m}-model"\n'
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def bench(config: Path, *args: str, cache: Path | None = None) -> cli.Done:
    """`tulving bench` in this process (tests/cli.py); the SIGTERM test runs it as a process."""
    cache_args = ["--cache", str(cache)] if cache else []
    return cli.tulving(ROOT, "--config", str(config), "--quiet", *cache_args, "bench", *args, env=_env())


def one_error_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("tulving: error: ")
    return lines[0]


@pytest.mark.parametrize("args,needle", [
    (["--models", "m", "--rate", "-1"], "--rate"),
    (["--models", "m", "--slo", "ttft=abc"], "--slo ttft"),
    (["--models", "m,no-such-model"], "unknown model 'no-such-model'"),
    (["--models", "m", "--arrival", "gamma:-1"], "gamma"),
    (["--models", "m", "--sweep", "speed=1,2"], "--sweep"),
    (["--models", "m", "-n", "0"], "-n"),
    (["--models", "m", "--duration", "5"], "--max-concurrency"),
    (["--models", "m", "--percentiles", "50,x"], "--percentiles"),
    (["--rate", "2"], "--models"),
])
def test_a_bad_option_is_one_line_and_exit_2_before_any_call(tmp_path, args, needle):
    config = config_for(tmp_path, "http://127.0.0.1:9/v1")  # nothing listens: nothing may be sent
    result = bench(config, *args)
    assert needle in one_error_line(result)
    assert result.stdout == ""


def _run(tmp_path: Path, server: Server, *args: str, models=("m",)) -> dict:
    out = tmp_path / "bench.json"
    result = bench(config_for(tmp_path, server.url, models), "--models", ",".join(models), *args, "--json", str(out),
                   "--per-request")
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())


def test_the_measured_times_hold_the_server_s_constant_waits(tmp_path, serve):
    """Behaviour, not accuracy (a loaded host only adds to a measured time;
    benchmarks/bench_accuracy.py prints how close they come): every request's
    TTFT holds the server's 40 ms wait before its first token, its E2E that
    wait plus 8 ms before each later token, and the ITL figures count one gap
    per token after the first."""
    server = serve("--ttft-ms", "40", "--token-delay-ms", "8")
    doc = _run(tmp_path, server, "-n", "12", "--max-concurrency", "4", "--warmup", "2", "--output-tokens", "6")
    s, rows = doc["runs"][0]["summary"], doc["runs"][0]["requests"]
    assert s["completed"] == 12 and s["failed"] == {}
    assert len(rows) == 12 and all(r["status"] == "ok" and r["output_tokens"] > 1 for r in rows)
    for r in rows:
        assert r["ttft"] >= 0.040 and r["e2e"] >= 0.040 + 0.008 * (r["output_tokens"] - 1), r
        assert r["tpot"] == pytest.approx((r["e2e"] - r["ttft"]) / (r["output_tokens"] - 1))
    assert s["itl"]["count"] == sum(r["output_tokens"] - 1 for r in rows)
    assert all(r["input_tokens"] > 200 for r in rows)  # the server's usage of ~256-token prompts
    assert server.stats()["requests"] == 14  # warm-up included, nothing from a cache


@pytest.mark.parametrize("kind", ["lognormal", "uniform"])
def test_each_measured_time_holds_the_server_s_drawn_waits(tmp_path, serve, kind):
    """The server draws each stream's TTFT and token gaps from seeded
    generators (engine/loopback/cli.py: seed 0 for TTFT, 1 for the gaps), so
    the test draws the very same values; one request at a time, the i-th
    request meets the i-th draws. A measured time can only exceed what the
    server waited (the client sends before the server starts waiting): each
    request's TTFT is at least its drawn TTFT, its E2E at least that plus its
    drawn gaps. How far above, under load or not, is benchmarks/bench_accuracy.py's."""
    server = serve("--ttft-ms", "20", "--token-delay-ms", "5", "--latency", kind)
    n = 16
    doc = _run(tmp_path, server, "-n", str(n), "--max-concurrency", "1", "--output-tokens", "6",
               "--warmup", "0")  # no warm-up: the server's first n draws are ours
    rows = sorted(doc["runs"][0]["requests"], key=lambda r: r["index"])
    make = {"lognormal": lambda median, seed: lognormal(median, 0.5, seed),
            "uniform": lambda median, seed: uniform(0.0, 2 * median, seed)}[kind]
    ttft_draws, gap_draws = make(0.020, 0), make(0.005, 1)
    assert len(rows) == n
    for r in rows:
        drawn_ttft = ttft_draws()
        drawn_gaps = sum(gap_draws() for _ in range(r["output_tokens"] - 1))
        assert r["ttft"] >= drawn_ttft - 0.0002, (r, drawn_ttft)  # 0.2 ms: the clocks' rounding
        assert r["e2e"] >= drawn_ttft + drawn_gaps - 0.0002, (r, drawn_ttft, drawn_gaps)
    assert doc["runs"][0]["summary"]["itl"]["count"] == sum(r["output_tokens"] - 1 for r in rows)


def test_arrivals_are_sent_on_the_seeded_schedule_never_before(tmp_path, serve):
    server = serve()
    doc = _run(tmp_path, server, "-n", "60", "--rate", "150", "--seed", "3", "--output-tokens", "4", "--warmup", "0")
    rows = sorted(doc["runs"][0]["requests"], key=lambda r: r["index"])
    expected = list(schedule(LoadPoint(rate=150, requests=60, seed=3)))
    assert [r["scheduled"] for r in rows] == pytest.approx(expected)
    assert all(r["started"] >= r["scheduled"] for r in rows)  # late under load, never early
    assert server.stats()["requests"] == 60


def test_a_sweep_gives_one_row_per_point_in_the_table_json_and_csv(tmp_path, serve):
    server = serve("--ttft-ms", "5", "--token-delay-ms", "1")
    config = config_for(tmp_path, server.url, models=("m", "other"))
    out_json, out_csv, plots = tmp_path / "b.json", tmp_path / "b.csv", tmp_path / "plots"
    result = bench(config, "--models", "m,other", "-n", "20", "--sweep", "rate=50,100,200", "--output-tokens", "8",
                   "--slo", "ttft=1s", "--json", str(out_json), "--csv", str(out_csv), "--plots", str(plots))
    assert result.returncode == 0, result.stderr
    doc = json.loads(out_json.read_text())
    assert [(r["model"], r["load"]["rate"]) for r in doc["runs"]] == [
        ("m", 50.0), ("m", 100.0), ("m", 200.0), ("other", 50.0), ("other", 100.0), ("other", 200.0)]
    assert all("requests" not in r for r in doc["runs"])  # per-request rows only when asked
    assert all(r["summary"]["good_share"] == 1.0 for r in doc["runs"])
    rows = list(csv.DictReader(out_csv.open()))
    assert [(r["model"], float(r["load_rate"])) for r in rows] == [
        (r["model"], r["load"]["rate"]) for r in doc["runs"]]
    assert all(int(r["completed"]) == 20 and float(r["ttft_p99"]) > 0 for r in rows)
    table = result.stdout.split("\n\n")[0].splitlines()
    assert sum(1 for line in table if line.startswith(("m ", "other "))) == 6
    for name in ("latency_vs_load", "throughput_vs_load", "ttft_cdf"):
        assert (plots / f"{name}.png").read_bytes()[:4] == b"\x89PNG" and (plots / f"{name}.svg").exists()
    assert "CPU µs/request" in result.stdout and "loop lag" in result.stdout


def test_cached_replies_are_never_timed_even_when_the_cache_holds_them(tmp_path, serve):
    """Book questions are the same prompts run after run; with --store the
    first run writes them to the cache, and the second still sends them all."""
    server = serve("--ttft-ms", "20", "--token-delay-ms", "1")
    config = config_for(tmp_path, server.url)
    cache = tmp_path / "cache.sqlite"
    args = ("--models", "m", "-n", "6", "--book", "synaptic-echoes-short", "--mode", "finetuned",
            "--output-tokens", "4", "--store", "--per-request", "--warmup", "0")
    for run in (1, 2):
        out = tmp_path / f"run{run}.json"
        result = bench(config, *args, "--json", str(out), cache=cache)
        assert result.returncode == 0, result.stderr
        doc = json.loads(out.read_text())
        summary = doc["runs"][0]["summary"]
        assert summary["cached"] == 0 and summary["completed"] == 6
        assert summary["ttft"]["min"] >= 0.020
    assert server.stats()["requests"] == 12
    stats_out = cli.tulving(ROOT, "--cache", str(cache), "cache", "stats", env=_env())
    assert stats_out.returncode == 0 and "entries: 6 " in stats_out.stdout  # stored (--store), never read


def test_bench_latency_is_an_alias_with_its_old_defaults(tmp_path, serve):
    server = serve()
    result = cli.tulving(ROOT, "--config", str(config_for(tmp_path, server.url)), "--quiet", "bench-latency",
                         "--model", "m", "-n", "5", env=_env())
    assert result.returncode == 0, result.stderr
    assert "max_tokens 16" in result.stdout and "inf c1" in result.stdout
    stats_now = server.stats()
    assert stats_now["requests"] == 5 and stats_now["max_in_flight"] == 1


def test_a_closed_loop_holds_its_concurrency_and_the_engine_queue_is_measured(tmp_path, serve):
    """--rate inf with --max-concurrency 6 for a duration: six in flight from
    the client, but the endpoint allows 2, so the rest wait in the engine's
    queue (its limits apply to bench requests) and `queued` shows it."""
    server = serve("--ttft-ms", "20", "--token-delay-ms", "2")
    config = config_for(tmp_path, server.url, concurrency=2)
    out = tmp_path / "b.json"
    result = cli.tulving(ROOT, "--config", str(config), "bench", "--models", "m", "--max-concurrency", "6",
                         "--duration", "1", "--output-tokens", "4", "--warmup", "0", "--json", str(out),
                         "--per-request", env=_env())
    assert result.returncode == 0, result.stderr
    assert "allow 2 calls in flight" in result.stderr  # said before measuring
    run = json.loads(out.read_text())["runs"][0]
    s, rows = run["summary"], run["requests"]
    assert s["requests"] >= 6 and s["completed"] == s["requests"]  # the closed loop's six, at least
    assert server.stats()["max_in_flight"] == 2 and s["peak_in_flight"] == 2  # sent to reply: the endpoint's 2
    assert s["queued"]["median"] > 0.015  # about two replies' time waiting for a slot
    assert max(r["started"] for r in rows) < 1.0  # nothing started after the duration
    waiting = [r["queued"] for r in rows]
    assert all(q is not None and q >= 0 for q in waiting)


def test_embeddings_are_timed_end_to_end_only(tmp_path, serve):
    server = serve("--latency-ms", "15")
    doc = _run(tmp_path, server, "--embed", "-n", "4", "--warmup", "0")
    s = doc["runs"][0]["summary"]
    assert s["completed"] == 4 and s["ttft"] is None and s["itl"] is None and s["tpot"] is None
    assert s["e2e"]["count"] == 4 and s["e2e"]["min"] >= 0.015
    assert doc["settings"]["prompts"] == "embeddings" and doc["settings"]["max_tokens"] is None
    assert server.stats()["by_path"] == {"/v1/embeddings": 4}


def test_sigterm_stops_a_bench_run_in_order(tmp_path, serve):
    import signal

    server = serve("--ttft-ms", "20", "--token-delay-ms", "2")
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "--config", str(config_for(tmp_path, server.url)),
                             "bench", "--models", "m", "--rate", "20", "--duration", "60"],
                            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Signal once the bench is sending (not after a fixed sleep: on a loaded
    # machine the command's start-up alone can take longer than any guess).
    deadline = time.monotonic() + 120
    while server.stats()["requests"] < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()[1]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "tulving: terminated"
