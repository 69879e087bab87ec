"""What `tulving bench` prints and writes, from its runs (one per model and load point).

- `console(runs, percentiles)`: three tables on stdout -- throughput (one row
  per model and load: requests, failures by kind, requests/s, tokens/s,
  peaks, goodput), latency (one row per metric, load and model, so models
  compare on adjacent rows: mean, median, std, min, max and each percentile,
  in ms), and the client's own cost (CPU per request, event-loop lag) with a
  warning where the client, not the server, may have set the figures: over
  half a core busy, or an event loop waking late while the process has CPU
  to spare (other processes hold the machine's cores);
- `to_json(runs, settings, per_request)`: the summary (and optionally one row
  per request) as a JSON document; infinities as "inf", NaN as null;
- `to_csv(runs)`: one row per run, every summary figure a column.
"""
from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import orjson

from engine.benchmark.latency.load import LoadPoint
from engine.benchmark.latency.metrics import Distribution, RequestRecord, Summary
from engine.benchmark.latency.runner import ClientCost
from engine.errors import printable

METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "E2E"), ("ttfb", "TTFB"), ("queued", "queued"))
OPTIONAL = ("ttfb", "queued")  # rows left out where no request has the figure
# The client is suspect above these: its loop wakes late, or it burns most of a core.
LAG_WARN_MS = 5.0
CPU_WARN_SHARE = 0.5


@dataclass(slots=True)
class BenchRun:
    model: str
    point: LoadPoint
    summary: Summary
    client: ClientCost
    records: list[RequestRecord]


def load_fields(point: LoadPoint) -> dict[str, object]:
    return {"rate": "inf" if math.isinf(point.rate) else point.rate, "arrival": str(point.arrival),
            "max_concurrency": point.max_concurrency, "requests": point.requests, "duration": point.duration,
            "seed": point.seed}


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1000:.2f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def _failed(summary: Summary) -> str:
    n = sum(summary.failed.values())
    if not n:
        return "0"
    return f"{n} (" + ", ".join(f"{k} {v}" for k, v in summary.failed.items()) + ")"


def _throughput(runs: Sequence[BenchRun]) -> list[str]:
    """The throughput table's title, rows and the note on locally counted tokens."""
    has_slo = any(r.summary.slo for r in runs)
    head = ["model", "load", "sent", "ok", "failed", "s", "req/s", "out tok/s", "total tok/s",
            "peak out tok/s", "peak in flight", "retries"]
    if has_slo:
        head += ["goodput req/s", "good %"]
    rows = [head]
    for r in runs:
        s = r.summary
        row = [printable(r.model), r.point.label, str(s.requests), str(s.completed), _failed(s), _num(s.duration, 2),
               _num(s.request_throughput), _num(s.output_throughput), _num(s.total_throughput),
               _num(s.peak_output_throughput), str(s.peak_in_flight), str(s.retries)]
        if has_slo:
            share = "-" if s.good_share is None else f"{100 * s.good_share:.1f}"
            row += [_num(s.goodput, 2), share]
        rows.append(row)
    out = ["Throughput" + (f" (goodput: {slo_text(runs[0].summary.slo)})" if has_slo else ""), _table(rows)]
    local = sum(r.summary.usage_counted_locally for r in runs)
    if local:
        out.append(f"{local} replies had no usage from the server: tokens counted locally (cl100k_base)")
    return out + [""]


def console(runs: Sequence[BenchRun], percentiles: Sequence[float]) -> str:
    out = _throughput(runs)
    names = [f"p{p:g}" for p in percentiles]
    rows = [["metric (ms)", "load", "model", "n", "mean", "median", "std", "min", "max", *names]]
    for key, title in METRICS:
        for point_label in dict.fromkeys(r.point.label for r in runs):
            for r in runs:
                if r.point.label != point_label:
                    continue
                d: Distribution | None = getattr(r.summary, key)
                if d is None:
                    if key not in OPTIONAL:
                        rows.append([title, point_label, printable(r.model), "0"] + ["-"] * (5 + len(names)))
                    continue
                rows.append([title, point_label, printable(r.model), str(d.count), _ms(d.mean), _ms(d.median),
                             _ms(d.std), _ms(d.min), _ms(d.max), *(_ms(d.percentiles.get(n)) for n in names)])
    out += ["Latency (TTFT and ITL need a streaming endpoint; ITL excludes the first token, TPOT = "
            "(E2E - TTFT) / (output tokens - 1))", _table(rows), ""]

    rows = [["model", "load", "CPU µs/request", "net of idle", "idle CPU ms/s", "CPU % of a core",
             "loop lag mean ms", "p99 ms", "max ms", ""]]
    for r in runs:
        c, s = r.client, r.summary
        core = c.cpu_seconds / s.duration if s.duration > 0 else math.nan
        note = ""
        if core > CPU_WARN_SHARE:
            note = "the client is busy: it may be the bottleneck"
        elif c.loop_lag_p99_ms > LAG_WARN_MS:
            note = "the event loop wakes late with CPU to spare: the machine is loaded"
        rows.append([printable(r.model), r.point.label, _num(c.cpu_us_per_request, 0),
                     _num(c.net_cpu_us_per_request, 0), _num(c.idle_cpu_ms_per_s, 2), _num(100 * core),
                     _num(c.loop_lag_mean_ms, 2), _num(c.loop_lag_p99_ms, 2), _num(c.loop_lag_max_ms, 2), note])
    out += ["Client (this process: CPU over the run per request, and net of its idle cost; event-loop lag: how late "
            "a 10 ms sleep wakes)",
            _table(rows)]
    return "\n".join(out)


def slo_text(slo: Mapping[str, float]) -> str:
    return ", ".join(f"{k} <= {v * 1000:g} ms" for k, v in slo.items())


def _clean(value: object) -> object:
    """JSON has no infinity or NaN."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def to_json(runs: Iterable[BenchRun], settings: Mapping[str, object], per_request: bool = False) -> bytes:
    entries = []
    for r in runs:
        entry: dict[str, object] = {"model": r.model, "load": load_fields(r.point), "summary": r.summary.as_dict(),
                                 "client": r.client.as_dict()}
        if per_request:
            entry["requests"] = [rec.row() for rec in r.records]
        entries.append(entry)
    return orjson.dumps(_clean({"settings": dict(settings), "runs": entries}), option=orjson.OPT_INDENT_2)


def _flat(prefix: str, value: object, into: dict[str, object]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flat(f"{prefix}_{k}" if prefix else str(k), v, into)
    else:
        into[prefix] = value


def csv_rows(runs: Iterable[BenchRun]) -> list[dict[str, object]]:
    """One flat row per run: model, load_*, the summary's figures (a
    distribution as ttft_mean ... ttft_p99, in seconds), client_*."""
    rows: list[dict[str, object]] = []
    for r in runs:
        row: dict[str, object] = {"model": r.model}
        _flat("load", load_fields(r.point), row)
        summary = r.summary.as_dict()
        summary["failed"] = ";".join(f"{k}={v}" for k, v in summary["failed"].items())
        summary["slo"] = ";".join(f"{k}={v}" for k, v in summary["slo"].items())
        for key, _ in METRICS:
            d = summary.pop(key)
            if d is not None:
                d.update(d.pop("percentiles"))
                _flat(key, d, summary)
        _flat("", summary, row)
        _flat("client", r.client.as_dict(), row)
        rows.append({k: _clean(v) for k, v in row.items()})  # the keys are strings already
    return rows


def to_csv(runs: Iterable[BenchRun]) -> str:
    rows = csv_rows(runs)
    columns: list[str] = []
    for row in rows:  # runs without a figure (no streaming: no TTFT) leave its columns empty
        columns += [c for c in row if c not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
