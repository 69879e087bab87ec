"""What `tulving run --dry-run` prints after its table of calls and dollars
by model and role (engine/estimate.py, the worst case: every reply at its
max_tokens): the cost as a likely and a worst figure, how long the run would
take under the endpoints' configured limits (and by batch), and the
assumptions behind both, each a short table.

The likely figure prices each reply at the length of what it has to hold,
from the run's own questions: an answer lists the ground-truth items (plus a
short sentence), a judgment names the items it found and scores each
ground-truth item (plus a short explanation). A reasoning model's thinking
is output too, and unknown: its likely figure stays the worst.

The duration is per endpoint the slowest of its limits: requests a minute,
input and output tokens a minute, and its max_concurrency calls at once of an
assumed call time; the endpoints run side by side (likely: the slowest of
them) or, at worst, one after another (their sum).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from engine.benchmark.evaluation.pipeline import Job
from engine.config import Config, ModelAlias
from engine.estimate import EstimateRow, Estimator
from engine.progress import duration
from engine.requests import UNLIMITED_OUTPUT_TOKENS
from engine.tokens import count_tokens
from providers.base import EndpointSpec
from providers.kinds import batch_capable, kind_of

ANSWER_FRAME = 30       # tokens around the items of an answer ("The events took place at ...")
JUDGE_FRAME = 70        # a judgment's JSON keys, brackets and brief explanation
CHRONO_FRAME = 40       # a chronological judgment's index lists' frame and explanation
SCORE_TOKENS = 5        # one `{"item": 1}` score beside its item
# Seconds a call takes, (likely, worst): an API call (a long prompt's first token
# takes seconds), and a local model one call at a time on this machine (SmolLM2:
# 10 s idle to 40 s loaded a call on 2 shared cores, measured 2026-11-28).
API_CALL_SECONDS = (5.0, 30.0)
LOCAL_CALL_SECONDS = (10.0, 40.0)
# A batch round's turnaround, (likely, worst) hours: Anthropic says most Message
# Batches finish within an hour; every provider's window is 24 h (OpenAI's
# completion_window "24h", Anthropic's and Gemini's expiry). Checked 2026-11-28.
BATCH_ROUND_HOURS = (1.0, 24.0)


@dataclass(frozen=True, slots=True)
class Lengths:
    """Likely reply lengths (tokens) per call, from the run's questions."""

    answer: float
    judge: float


def likely_lengths(jobs: Sequence[Job]) -> Lengths:
    """An answer: the ground-truth items and a sentence; a judgment: those
    items found and scored, and an explanation (chronological ones: two index
    lists); the mean over every call the jobs plan."""
    answers, judgments = [], []
    for job in jobs:
        for q in job.questions:
            items = [str(x) for x in q.correct_answer or []]
            tokens = count_tokens("; ".join(items)) if items else 0
            answers.append(tokens + ANSWER_FRAME)
            judgments.append(2 * tokens + SCORE_TOKENS * len(items) + JUDGE_FRAME)
            if q.get == "chronological" and items:
                judgments.append(4 * len(items) + CHRONO_FRAME)
    return Lengths(answer=sum(answers) / max(1, len(answers)), judge=sum(judgments) / max(1, len(judgments)))


@dataclass(slots=True)
class Figures:
    """A row's calls to make and its output, likely and worst."""

    alias: ModelAlias
    row: EstimateRow
    likely_out: float   # output tokens of the calls to make, likely

    def likely_usd(self, worst: float, batch: bool) -> float:
        """`worst` (a row's dollars, one way) with the output priced at its likely length."""
        if not self.row.to_call:
            return worst
        calls = self.row.to_call
        each_in = self.row.input_tokens / calls
        saved = calls * (self.alias.cost(int(each_in), int(self.row.output_tokens / calls))
                         - self.alias.cost(int(each_in), int(self.likely_out / calls)))
        return max(0.0, worst - saved * (self.alias.batch_discount if batch else 1.0))


def row_figures(config: Config, estimator: Estimator, lengths: Lengths) -> list[Figures]:
    out = []
    for row in estimator.rows():
        alias = config.alias(row.model)
        per_call = {"answer": lengths.answer, "judge": lengths.judge}.get(row.role)
        worst_each = row.output_tokens / row.to_call if row.to_call else 0.0
        likely_each = worst_each if per_call is None or alias.reasoning else min(worst_each, per_call)
        out.append(Figures(alias, row, likely_each * row.to_call))
    return out


def _money(x: float) -> str:
    return f"${x:,.2f}" if x >= 1 else f"${x:.4f}"


def cost_lines(figures: Sequence[Figures], batch_ok: bool) -> list[str]:
    """Likely and worst dollars, each way the run can go."""
    ways = [("direct", "direct_usd", False), ("direct, with prompt caching", "cached_direct_usd", False)]
    if batch_ok:
        ways += [("by batch (--batch)", "batch_usd", True),
                 ("by batch, with prompt caching", "cached_batch_usd", True)]
    rows = [["cost (USD)", "likely", "worst"]]
    for name, attr, batch in ways:  # a row without a batch API has its direct figures in the batch columns
        worst = sum(getattr(f.row, attr) for f in figures)
        likely = sum(f.likely_usd(getattr(f.row, attr), batch and f.row.batchable) for f in figures)
        rows.append([name, _money(likely), _money(worst)])
    return _table(rows)


def _span(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{seconds / 86400:.1f} days"
    return duration(seconds) if seconds >= 1 else "<1s"


@dataclass(slots=True)
class Load:
    """What the calls to make put on one endpoint."""

    spec: EndpointSpec
    calls: int = 0
    input_tokens: int = 0       # every prompt token
    unread_input: int = 0       # less the prompt-cache reads, where the provider does not count them
    likely_out: float = 0.0
    worst_out: int = 0


def _provider_flags(spec: EndpointSpec) -> tuple[bool, bool]:
    """(one call at a time on this machine, prompt-cache reads count toward the input limit)."""
    try:
        cls = kind_of(spec).provider_class()
    except ImportError:  # its extra is not installed: the defaults
        return False, True
    return bool(cls.prefers_prefix_order), bool(cls.cache_reads_count_toward_limits)


def endpoint_loads(config: Config, figures: Iterable[Figures]) -> list[Load]:
    loads: dict[str, Load] = {}
    for f in figures:
        if not f.row.to_call:
            continue
        spec = config.endpoints_of(f.alias)[0]  # where the calls go first (replicas share them: faster)
        load = loads.setdefault(spec.name, Load(spec))
        _, reads_count = _provider_flags(spec)
        load.calls += f.row.to_call
        load.input_tokens += f.row.input_tokens
        load.unread_input += f.row.input_tokens - (0 if reads_count else f.row.prefix_tokens)
        load.likely_out += f.likely_out
        load.worst_out += f.row.output_tokens
    return list(loads.values())


def _minutes(load: Load, likely: bool) -> tuple[float, str]:
    """Minutes the endpoint needs, and the limit that binds."""
    spec = load.spec
    local, _ = _provider_flags(spec)
    seconds = (LOCAL_CALL_SECONDS if local else API_CALL_SECONDS)[0 if likely else 1]
    if spec.base_url is None and not local:  # computed in this process (built-in, MiniLM): no limit binds
        return 0.0, "none (in this process)"
    out = load.likely_out if likely else load.worst_out
    tokens_in = load.unread_input if likely else load.input_tokens
    bounds = [(load.calls * seconds / (1 if local else max(1, spec.max_concurrency)) / 60,
               "one call at a time" if local else f"{spec.max_concurrency} calls at once")]
    for limit, used, what in ((spec.rpm, load.calls, "requests"), (spec.input_tpm, tokens_in, "input tokens"),
                              (spec.output_tpm, out, "output tokens"), (spec.tpm, tokens_in + out, "tokens")):
        if limit:
            bounds.append((used / limit, f"{what} a minute ({limit:,.0f})"))
    return max(bounds)


def duration_lines(config: Config, figures: Sequence[Figures], batch: bool) -> list[str]:
    loads = endpoint_loads(config, figures)
    rows = [["endpoint", "calls", "the limit that binds (likely)", "likely", "worst"]]
    likely_all, worst_all = 0.0, 0.0
    for load in loads:
        likely, binds = _minutes(load, True)
        worst, _ = _minutes(load, False)
        likely_all, worst_all = max(likely_all, likely), worst_all + worst
        rows.append([load.spec.name, f"{load.calls:,}", binds, _span(60 * likely), _span(60 * worst)])
    if len(loads) > 1:
        rows.append(["the run", "", "endpoints side by side / one after another", _span(60 * likely_all),
                     _span(60 * worst_all)])
    lines = _table(rows) if loads else ["  (no call to make: everything is in the cache)"]
    batched = [load for load in loads if batch_capable(load.spec)]
    if batch and batched:
        rounds = 3  # answers; judgments; chronological judgments (re-draws: another round each)
        low, high = (rounds * h for h in BATCH_ROUND_HOURS)
        lines.append(f"  by batch ({', '.join(load.spec.name for load in batched)}): {rounds} rounds (answers, "
                     f"judgments, chronological judgments),")
        lines.append(f"    likely {low:.0f} h, worst {high:.0f} h ({BATCH_ROUND_HOURS[0]:.0f} h and "
                     f"{BATCH_ROUND_HOURS[1]:.0f} h a round)")
    return lines


def assumption_lines(lengths: Lengths) -> list[str]:
    api, local = API_CALL_SECONDS, LOCAL_CALL_SECONDS
    rows = [
        ["assumed", "how"],
        ["tokens", "counted offline in cl100k_base (Anthropic's tokenizer differs by a few percent)"],
        ["output, worst", f"every reply at its max_tokens ({UNLIMITED_OUTPUT_TOKENS:,} where no limit is sent)"],
        ["output, likely", f"answers {lengths.answer:.0f} tokens: the ground-truth items and a sentence"],
        ["", f"judgments {lengths.judge:.0f} tokens: the items found and scored, an explanation"],
        ["", "reasoning models: as worst (their thinking is output)"],
        ["prompt caching", "the first call of each shared prefix writes it, the others read it"],
        ["batch", "the alias's batch discount, on endpoints whose kind has a batch API"],
        ["limits", "each endpoint's rpm, tokens a minute, max_concurrency (`tulving config check`)"],
        ["", "likely: prompt-cache reads do not count where the provider says so (Anthropic)"],
        ["call time", f"an API call {api[0]:.0f} s likely, {api[1]:.0f} s worst, max_concurrency at once"],
        ["", f"a local model {local[0]:.0f}-{local[1]:.0f} s, one at a time (SmolLM2 on 2 cores)"],
        ["run time", "likely: the endpoints side by side; worst: one after another"],
        ["batch rounds", f"{BATCH_ROUND_HOURS[0]:.0f} h likely (Anthropic: most within the hour), "
                         f"{BATCH_ROUND_HOURS[1]:.0f} h at most"],
        ["", "(every provider's window: OpenAI's, Anthropic's, Gemini's; checked 2026-11-28)"],
    ]
    return _table(rows, numbers=False)


def _table(rows: Sequence[Sequence[str]], numbers: bool = True) -> list[str]:
    """Rows as aligned text, indented; figures right-aligned (when `numbers`)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def cell(text: str, i: int) -> str:
        numeric = numbers and i > 0 and text[:1] in "$<0123456789"
        return text.rjust(widths[i]) if numeric else text.ljust(widths[i])
    return ["  " + "  ".join(cell(c, i) for i, c in enumerate(r)).rstrip() for r in rows]


def print_view(config: Config, estimator: Estimator, jobs: Sequence[Job], *, batch: bool,
               lengths: Lengths | None = None) -> None:
    """The likely and worst cost, the duration and the assumptions, after the estimator's table."""
    lengths = lengths or likely_lengths(jobs)
    figures = row_figures(config, estimator, lengths)
    batch_ok = any(f.row.batchable for f in figures)
    print("\nlikely and worst cost of the calls to make:")
    for line in cost_lines(figures, batch_ok):
        print(line)
    print("\nhow long, under the configured limits:")
    for line in duration_lines(config, figures, batch):
        print(line)
    print("\nassumptions:")
    for line in assumption_lines(lengths):
        print(line)
