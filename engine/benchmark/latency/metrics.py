"""Per-request and per-run figures of a latency benchmark, the metric set of
vLLM's `bench serve` (its metric definitions; GuideLLM and AIPerf report subsets).

Per request (`RequestRecord`, from an engine `Outcome` by `record`): when it
was due, handed to the engine and sent, how long it waited in the engine's
queue, TTFT (and the time to the reply's first byte, TTFB: a server that
sends its headers at once shows its queueing there, its generation after), the
inter-token latencies (gaps between streamed chunks, the
first chunk excluded: its wait is TTFT's), end-to-end latency of the attempt
that answered, input/output tokens from the reply's usage (never re-counted;
a server that sends no usage, as llama.cpp's, has them counted by the
provider in cl100k_base, and the record and the summary say so), status or
error kind, retries.

Per run (`summarize`): completed, failed by kind, duration (start to the last
reply), requests/s, output tokens/s, total tokens/s; TTFT, TPOT = (E2E - TTFT)
/ (output tokens - 1) (the first token excluded; defined for 2+ tokens), ITL
(all requests' gaps pooled) and E2E, each with mean, median, std, min, max and
the chosen percentiles; goodput under SLOs (completed requests meeting every
SLO, per second, and their share of the requests sent; a request whose TPOT is
undefined meets a TPOT SLO, one without a TTFT -- not streamed -- does not meet
a TTFT SLO); peak output tokens/s (the busiest one-second bin, each chunk
carrying its share of the usage's output tokens) and peak requests in flight
(sent to reply).

Known pitfalls avoided: TTFT is never inside ITL; TPOT leaves the first token
out; tokens come from usage; a cached outcome is never timed (status
"cached", left out of every latency figure and counted apart).
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from providers.base import ChatResult, TulvingError

if TYPE_CHECKING:
    from engine.requests import Outcome

DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0)
SLO_METRICS = ("ttft", "tpot", "e2e")


@dataclass(slots=True)
class RequestRecord:
    """One request's figures; times in seconds, offsets from the run's start."""

    index: int
    scheduled: float                 # when the load wanted it sent
    started: float                   # handed to the engine (after any client-side concurrency wait)
    done: float                      # its outcome came back
    sent: float | None = None        # the answering attempt went out
    queued: float | None = None      # in the engine before its first attempt (limits, endpoint slots)
    ttft: float | None = None        # streamed: first output chunk after the send
    ttfb: float | None = None        # streamed: the reply's first byte (status line) after the send
    itl: list[float] = field(default_factory=list)  # gaps between output chunks, the first excluded
    e2e: float | None = None         # the answering attempt, send to last byte
    input_tokens: int = 0
    output_tokens: int = 0
    status: str = "ok"               # "ok" | an error kind | "cached"
    error: str | None = None
    retries: int = 0
    chunk_times: list[float] = field(default_factory=list)  # arrival offsets of the output chunks (not in rows)
    usage_counted_locally: bool = False  # the server sent no usage: the tokens are the provider's count

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def row(self) -> dict[str, object]:
        """The per-request row of the JSON output."""
        d = asdict(self)
        del d["chunk_times"]
        d["tpot"] = self.tpot
        return d


def record(outcome: Outcome, *, index: int, scheduled: float, started: float, done: float,
           origin: float) -> RequestRecord:
    """A request's record from its outcome. `origin` is the run's start on
    time.monotonic() (the clock of `Outcome.sent_at`); the other offsets are
    already relative to it."""
    rec = RequestRecord(index=index, scheduled=scheduled, started=started, done=done,
                        retries=max(0, outcome.attempts - 1), queued=outcome.queued)
    if outcome.cached:  # never timed: a cache hit says nothing about the server
        rec.status = "cached"
        return rec
    if outcome.error is not None or outcome.result is None:
        rec.status = str(outcome.error.kind) if outcome.error is not None else "bad_reply"
        rec.error = str(outcome.error) if outcome.error is not None else None
        rec.sent = None if outcome.sent_at is None else outcome.sent_at - origin
        return rec
    result = outcome.result
    rec.input_tokens = result.input_tokens
    rec.e2e = result.latency
    rec.sent = outcome.sent_at - origin if outcome.sent_at is not None else done - result.latency
    if isinstance(result, ChatResult):
        rec.output_tokens = result.output_tokens
        rec.usage_counted_locally = result.usage_counted_locally
        timings = result.timings
        if timings is not None:
            rec.ttft = timings.ttft
            rec.ttfb = timings.first_byte
            times = list(timings.chunk_times)
            rec.itl = [b - a for a, b in zip(times, times[1:])]
            rec.chunk_times = [rec.sent + t for t in times]
    return rec


@dataclass(slots=True)
class Distribution:
    mean: float
    median: float
    std: float
    min: float
    max: float
    percentiles: dict[str, float]  # "p50" -> value
    count: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def distribution(values: Sequence[float], percentiles: Sequence[float] = DEFAULT_PERCENTILES
                 ) -> Distribution | None:
    if not values:
        return None
    import numpy as np  # here: parsing --percentiles must not load numpy (tests/test_startup.py)

    a = np.asarray(values, dtype=float)
    return Distribution(mean=float(a.mean()), median=float(np.median(a)), std=float(a.std()),
                        min=float(a.min()), max=float(a.max()), count=int(a.size),
                        percentiles={f"p{p:g}": float(np.percentile(a, p)) for p in percentiles})


def parse_percentiles(text: str) -> list[float]:
    out: list[float] = []
    for item in text.split(","):
        try:
            p = float(item)
        except ValueError:
            raise TulvingError(f"--percentiles: not a number: {item.strip()!r}") from None
        if not 0 <= p <= 100:
            raise TulvingError(f"--percentiles must be between 0 and 100, got {item.strip()!r}")
        out.append(p)
    return out


_UNITS = {"ms": 1e-3, "s": 1.0, "us": 1e-6, "µs": 1e-6}


def parse_slo(text: str) -> dict[str, float]:
    """"ttft=500ms,tpot=50ms,e2e=10s" -> {"ttft": 0.5, "tpot": 0.05, "e2e": 10.0}
    (seconds; a bare number is milliseconds, as in vLLM's --goodput)."""
    slo: dict[str, float] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        name, value = name.strip().lower(), value.strip()
        if not sep or name not in SLO_METRICS:
            raise TulvingError(f"--slo takes ttft=, tpot= and e2e= with a time, e.g. ttft=500ms,e2e=10s; "
                               f"got {item.strip()!r}")
        unit = next((u for u in ("ms", "us", "µs", "s") if value.endswith(u)), "")
        try:
            number = float(value[: len(value) - len(unit)] if unit else value)
        except ValueError:
            raise TulvingError(f"--slo {name}: not a time: {value!r} (e.g. 500ms, 2s)") from None
        if not (math.isfinite(number) and number > 0):
            raise TulvingError(f"--slo {name} must be a positive time, got {value!r}")
        slo[name] = number * _UNITS.get(unit or "ms", 1e-3)
    return slo


def meets(rec: RequestRecord, slo: Mapping[str, float]) -> bool:
    if not rec.ok:
        return False
    for name, limit in slo.items():
        if name == "ttft" and (rec.ttft is None or rec.ttft > limit):
            return False
        if name == "tpot" and rec.tpot is not None and rec.tpot > limit:
            return False
        if name == "e2e" and (rec.e2e is None or rec.e2e > limit):
            return False
    return True


def peak_output_rate(records: Sequence[RequestRecord], bin_seconds: float = 1.0) -> float:
    """Output tokens in the busiest `bin_seconds` bin, per second. Each streamed
    chunk carries output_tokens / chunks; an unstreamed reply all at its end."""
    bins: defaultdict[int, float] = defaultdict(float)
    for rec in records:
        if not rec.ok or rec.output_tokens <= 0:
            continue
        if rec.chunk_times:
            share = rec.output_tokens / len(rec.chunk_times)
            for t in rec.chunk_times:
                bins[math.floor(t / bin_seconds)] += share
        else:
            bins[math.floor(rec.done / bin_seconds)] += rec.output_tokens
    return max(bins.values()) / bin_seconds if bins else 0.0


def peak_in_flight(records: Sequence[RequestRecord]) -> int:
    """Most requests between their send and their reply's last byte at one moment."""
    events: list[tuple[float, int]] = []
    for rec in records:
        if rec.status == "cached":
            continue
        start = rec.sent if rec.sent is not None else rec.started
        # A reply ends at its last byte (the engine frees the slot then), not when our task saw it.
        end = start + rec.e2e if rec.sent is not None and rec.e2e is not None else rec.done
        events += [(start, 1), (max(end, start), -1)]
    events.sort(key=lambda e: (e[0], e[1]))  # a reply before a send at the same instant
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


@dataclass(slots=True)
class Summary:
    requests: int                    # measured (warm-up excluded)
    completed: int
    failed: dict[str, int]           # error kind -> count
    cached: int                      # answered from the cache: not timed (should be 0)
    duration: float                  # start to the last reply, seconds
    input_tokens: int
    output_tokens: int
    request_throughput: float        # completed per second
    output_throughput: float         # output tokens per second
    total_throughput: float          # input + output tokens per second
    ttft: Distribution | None
    tpot: Distribution | None
    itl: Distribution | None
    e2e: Distribution | None
    queued: Distribution | None      # time in the engine's queue before the first send
    ttfb: Distribution | None        # time to the reply's first byte (streamed, when the client reports it)
    retries: int
    peak_output_throughput: float
    peak_in_flight: int
    slo: dict[str, float] = field(default_factory=dict)
    good: int | None = None          # completed requests meeting every SLO
    goodput: float | None = None     # good requests per second
    good_share: float | None = None  # good / requests
    usage_counted_locally: int = 0   # completed requests whose server sent no usage (tokens counted locally)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(records: Sequence[RequestRecord], *, duration: float | None = None,
              percentiles: Sequence[float] = DEFAULT_PERCENTILES,
              slo: Mapping[str, float] | None = None) -> Summary:
    """The run's figures. `duration` defaults to the last reply's offset."""
    ok = [r for r in records if r.ok]
    failed = Counter(r.status for r in records if not r.ok and r.status != "cached")
    if duration is None:
        duration = max((r.done for r in records), default=0.0)
    span = duration if duration > 0 else math.nan
    tokens_in = sum(r.input_tokens for r in ok)
    tokens_out = sum(r.output_tokens for r in ok)

    d = _distributions(records, ok, percentiles)
    summary = Summary(
        requests=len(records), completed=len(ok), failed=dict(sorted(failed.items())),
        cached=sum(r.status == "cached" for r in records), duration=duration,
        input_tokens=tokens_in, output_tokens=tokens_out,
        request_throughput=len(ok) / span, output_throughput=tokens_out / span,
        total_throughput=(tokens_in + tokens_out) / span,
        ttft=d["ttft"], tpot=d["tpot"], itl=d["itl"], e2e=d["e2e"], queued=d["queued"], ttfb=d["ttfb"],
        retries=sum(r.retries for r in records),
        peak_output_throughput=peak_output_rate(records), peak_in_flight=peak_in_flight(records),
        usage_counted_locally=sum(r.usage_counted_locally for r in ok))
    if slo:
        good = sum(meets(r, slo) for r in records)
        measured = len(records) - summary.cached
        summary.slo = dict(slo)
        summary.good = good
        summary.goodput = good / span
        summary.good_share = good / measured if measured else None
    return summary


def _distributions(records: Sequence[RequestRecord], ok: list[RequestRecord], percentiles: Sequence[float]
                   ) -> dict[str, Distribution | None]:
    """The latency distributions of a run: ttft, tpot, itl, e2e and ttfb of the replies, queued of the calls."""
    def dist(values: list[float]) -> Distribution | None:
        return distribution(values, percentiles)

    return {"ttft": dist([r.ttft for r in ok if r.ttft is not None]),
            "tpot": dist([t for r in ok if (t := r.tpot) is not None]),
            "itl": dist([gap for r in ok for gap in r.itl]),
            "e2e": dist([r.e2e for r in ok if r.e2e is not None]),
            "queued": dist([r.queued for r in records if r.queued is not None and r.status != "cached"]),
            "ttfb": dist([r.ttfb for r in ok if r.ttfb is not None])}
