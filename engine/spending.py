"""What a run spent, by model and role (answer, judge, write, embed): calls,
tokens, dollars, and what provider prompt caching saved.

    spending = Spending()
    spending.add("answer", alias, outcome)     # every outcome of the run
    spending.rows()                            # for run.json / scores.json
    spending.lines()                           # the run summary on stderr

Per (model, role): `calls` (outcomes of calls asked, apart from `not_sent`:
those --max-cost refused before sending), `cached` (answered from Tulving's
cache, or by an identical call made for another request: free), and for the calls made: prompt tokens (`input_tokens`, of which
`cache_read_tokens` / `cache_write_tokens` went through the provider's prompt
cache), `output_tokens`, `spent_usd` (what the replies cost: prompt-cache
prices, the batch discount where a call went by batch), `list_usd` (the same
calls at list price without prompt caching or batch) and `caching_saved_usd`
(what prompt caching saved at the price each call paid; negative when cache
writes were never read back), and `usage_counted_locally` (replies that came
without usage from the server, an OpenAI-compatible server ignoring
`include_usage`: their tokens were counted in cl100k_base, an estimate).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import SupportsFloat, SupportsInt, TypedDict, cast

from engine.config import ModelAlias
from engine.prices import disagrees
from engine.requests import Outcome
from providers.base import BUDGET, ChatResult

ROLES = ("answer", "judge", "write", "embed")


class SpendingRow(TypedDict):
    """One (model, role) line of a run's spending, as results.json keeps it."""

    model: str
    role: str
    calls: int
    cached: int
    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    output_tokens: int
    spent_usd: float
    list_usd: float
    caching_saved_usd: float
    usage_counted_locally: int
    not_sent: int
    paid_no_answer: int
    reported_usd: float
    table_usd: float


@dataclass(slots=True)
class RoleUsage:
    model: str
    role: str
    calls: int = 0
    cached: int = 0
    input_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    spent_usd: float = 0.0
    list_usd: float = 0.0
    caching_saved_usd: float = 0.0
    usage_counted_locally: int = 0  # replies without the server's usage: tokens counted here
    not_sent: int = 0  # refused by --max-cost before sending: neither a call nor a cost
    paid_no_answer: int = 0  # billed by the provider, no usable answer (a batch line it did not key)
    reported_usd: float = 0.0  # what the provider reported for the calls that report a cost (OpenRouter)
    table_usd: float = 0.0     # the same calls at the table's prices: the cross-check

    def add(self, other: Mapping[str, object]) -> None:
        """Add a row read back from a results file (missing or empty figures count 0)."""
        for name in ("calls", "cached", "input_tokens", "cache_read_tokens", "cache_write_tokens",
                     "output_tokens", "usage_counted_locally", "not_sent", "paid_no_answer"):
            setattr(self, name, getattr(self, name) + int(cast(SupportsInt, other.get(name, 0) or 0)))
        for name in ("spent_usd", "list_usd", "caching_saved_usd", "reported_usd", "table_usd"):
            setattr(self, name, getattr(self, name) + float(cast(SupportsFloat, other.get(name, 0.0) or 0.0)))


def table_cost(alias: ModelAlias, result: ChatResult) -> float:
    """What the alias's price table says a reply cost (its cache reads and
    writes at their prices, the batch discount where it came by batch)."""
    return alias.cost(result.input_tokens, result.output_tokens, cache_read=result.cache_read_tokens,
                      cache_write=result.cache_write_tokens, cache_write_1h=result.cache_write_1h_tokens,
                      batch=result.batched)


def caching_saving(alias: ModelAlias, result: ChatResult, spent: float) -> float:
    """What prompt caching saved on a call that cost `spent`: its cost at list
    price without caching minus with it, scaled to the price the call paid
    (a batch call's discount applies to both)."""
    with_cache = alias.cost(result.input_tokens, result.output_tokens, cache_read=result.cache_read_tokens,
                            cache_write=result.cache_write_tokens, cache_write_1h=result.cache_write_1h_tokens)
    without = alias.cost(result.input_tokens, result.output_tokens)
    paid_share = spent / with_cache if with_cache > 0 else 1.0
    return (without - with_cache) * paid_share


class Spending:
    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], RoleUsage] = {}

    def row(self, model: str, role: str) -> RoleUsage:
        found = self._rows.get((model, role))
        if found is None:
            found = self._rows[(model, role)] = RoleUsage(model=model, role=role)
        return found

    def add(self, role: str, alias: ModelAlias, outcome: Outcome) -> None:
        row = self.row(alias.name, role)
        if outcome.error is not None and outcome.error.kind == BUDGET:
            row.not_sent += 1
            return
        row.calls += 1
        if outcome.cached or outcome.joined:  # no call of its own: free
            row.cached += 1
            return
        result = outcome.result
        if result is None:
            billed = outcome.error.billed if outcome.error is not None else None
            if billed is None:
                return
            row.paid_no_answer += 1  # the provider billed it, no answer came of it: spent all the same
            result = billed
        row.input_tokens += result.input_tokens
        row.spent_usd += outcome.cost
        if isinstance(result, ChatResult) and result.reported_cost is not None:
            row.reported_usd += result.reported_cost
            row.table_usd += table_cost(alias, result)
        if isinstance(result, ChatResult):
            row.cache_read_tokens += result.cache_read_tokens
            row.cache_write_tokens += result.cache_write_tokens
            row.output_tokens += result.output_tokens
            row.usage_counted_locally += result.usage_counted_locally
            row.list_usd += alias.cost(result.input_tokens, result.output_tokens)
            row.caching_saved_usd += caching_saving(alias, result, outcome.cost)
        else:
            row.list_usd += alias.cost(result.input_tokens, 0)

    def rows(self) -> list[SpendingRow]:
        order = {role: i for i, role in enumerate(ROLES)}
        out = []
        for row in sorted(self._rows.values(), key=lambda r: (r.model, order.get(r.role, 9), r.role)):
            d = cast(SpendingRow, asdict(row))
            d["spent_usd"] = round(d["spent_usd"], 6)
            d["list_usd"] = round(d["list_usd"], 6)
            d["caching_saved_usd"] = round(d["caching_saved_usd"], 6)
            d["reported_usd"] = round(d["reported_usd"], 6)
            d["table_usd"] = round(d["table_usd"], 6)
            out.append(d)
        return out

    def lines(self) -> list[str]:
        return spending_lines(self.rows())


def merge_rows(groups: Iterable[Iterable[Mapping[str, object]]]) -> list[SpendingRow]:
    """Rows of several runs (shards) added up per (model, role)."""
    merged = Spending()
    for rows in groups:
        for row in rows:
            merged.row(str(row.get("model", "")), str(row.get("role", ""))).add(row)
    return merged.rows()


def spending_lines(rows: Iterable[SpendingRow]) -> list[str]:
    """The run summary's cost lines: one per (model, role), then the total."""
    rows = list(rows)
    lines = []
    for r in rows:
        cache = ""
        if r["cache_read_tokens"] or r["cache_write_tokens"]:
            cache = f" (prompt cache: {r['cache_read_tokens']:,} read, {r['cache_write_tokens']:,} written)"
        unsent = f", {r['not_sent']} not sent (--max-cost)" if r.get("not_sent") else ""
        if r.get("paid_no_answer"):
            unsent += f", {r['paid_no_answer']} paid without an answer"
        calls = f"{r['calls']:,} call" + ("" if r["calls"] == 1 else "s")
        lines.append(f"  {r['model']} {r['role']}: {calls} ({r['cached']:,} cached{unsent}), "
                     f"{r['input_tokens']:,} tokens in{cache}, {r['output_tokens']:,} out, "
                     f"${r['spent_usd']:.4f}")
    spent = sum(r["spent_usd"] for r in rows)
    listed = sum(r["list_usd"] for r in rows)
    saved = sum(r["caching_saved_usd"] for r in rows)
    total = f"cost: ${spent:.4f} spent (${listed:.4f} at list price without prompt caching or batch"
    if saved:
        total += f"; prompt caching saved ${saved:.4f}"
    local = sum(r.get("usage_counted_locally", 0) for r in rows)
    said = [f"{local} replies had no usage from the server: tokens counted locally (cl100k_base)"] if local else []
    said += cross_check_lines(rows)
    return [total + ")"] + lines + said


def cross_check_lines(rows: Iterable[SpendingRow]) -> list[str]:
    """Where a provider reported what its calls cost (counted as spent), the
    table's price for the same calls, and a warning when they disagree
    beyond the tolerance (engine/prices.py `disagrees`)."""
    out = []
    for r in rows:
        reported, table = r.get("reported_usd", 0.0) or 0.0, r.get("table_usd", 0.0) or 0.0
        if not reported and not table:
            continue
        line = (f"  {r['model']} {r['role']}: the provider reported ${reported:.4f} (counted); the price table says "
                f"${table:.4f}")
        if disagrees(reported, table):
            line += " -- they disagree: the table's prices for this model may be out of date"
        out.append(line)
    return out
