"""What a job will cost, before any call (`--dry-run`).

    estimator = Estimator(config, cache)            # cache: an open ResponseCache, or None
    await estimator.add("answer", requests)         # per role: answer, judge, write, embed
    await estimator.add("judge", requests, extra_input_tokens=50)   # prompts still missing a part
    print(estimator.table())

Per (model, role): the calls the job needs, how many the cache already holds,
and for the others the prompt tokens (counted offline in cl100k_base, as
engine/tokens.py does; the Anthropic tokenizer differs by a few percent), of
which in a prefix shared with other calls, and the output tokens at
`max_tokens` (an upper bound: replies are usually much shorter; 4,096 for a
call sent without a limit). Dollars at the alias's prices four ways: direct;
batch (the alias's batch discount on the calls of endpoints whose kind has a
batch API, or as
`batchable` says); and each with provider prompt caching where a prefix is
shared (the engine warms it first: the first call of each (model, prefix)
writes it, the others read it; OpenAI reads in 128-token steps and charges no
write).

A prompt's shared prefix is counted once per (model, prefix) and its rest per
call, so 686 questions over a 100k-token book count the book once.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from cache.backend import ResponseStore
from engine.batching_mode import batch_endpoint
from engine.config import Config, ModelAlias
from engine.requests import UNLIMITED_OUTPUT_TOKENS, EmbedRequest, Request, output_tokens_allowed
from engine.resolve import Resolved, resolve
from engine.tokens import count_tokens
from engine.warmup import prefix_key, prefix_parts
from providers.base import Result
from providers.kinds import kind_of, opt_bool

PER_MESSAGE_TOKENS = 4      # chat formatting per message (as the scheduler reserves)
MIN_CACHED_TOKENS = 1024    # the providers cache no shorter prefix
_LOOKUP_CHUNK = 500


@dataclass(slots=True)
class EstimateRow:
    model: str
    role: str
    calls: int = 0
    cached: int = 0                 # already in Tulving's cache: free
    input_tokens: int = 0           # prompts of the calls to make
    prefix_tokens: int = 0          # of which in prefixes the provider caches (shared by 2+ calls)
    output_tokens: int = 0          # at max_tokens: an upper bound
    direct_usd: float = 0.0
    batch_usd: float = 0.0
    cached_direct_usd: float = 0.0  # with provider prompt caching
    cached_batch_usd: float = 0.0   # batch and prompt caching
    batchable: bool = False
    bands: set[str] = field(default_factory=set)  # the price bands the calls were priced by ("" : base)

    @property
    def to_call(self) -> int:
        return self.calls - self.cached


def default_batchable(r: Resolved) -> bool:
    """Whether `--batch` sends a call through a provider's batch API (the
    OpenAI Batch API, Anthropic Message Batches): chat calls to endpoints of
    those kinds, unless `options.batch = false` (engine/batching_mode.py)."""
    return batch_endpoint(r) is not None


def caches_prompts(r: Resolved) -> bool:
    """Whether the first endpoint's server caches prompt prefixes: its kind can
    and the endpoint does not set `options.prompt_cache = false`."""
    first = r.endpoints[0]
    return kind_of(first).capabilities.prompt_cache and opt_bool(first, "prompt_cache")


class Estimator:
    def __init__(self, config: Config, cache: ResponseStore | None = None, *,
                 batchable: Callable[[Resolved], bool] = default_batchable,
                 count: Callable[[str], int] = count_tokens, bands: bool = True):
        self.config = config
        self.use_bands = bands  # False: every call at the alias's base prices (for comparison)
        self.cache = cache
        self.batchable = batchable
        self.count = count
        self._rows: dict[tuple[str, str], EstimateRow] = {}
        self._prefixes: dict[bytes, int] = {}    # prefix key -> tokens
        self._warm: set[bytes] = set()           # prefixes a call to make will have written

    def row(self, model: str, role: str) -> EstimateRow:
        found = self._rows.get((model, role))
        if found is None:
            found = self._rows[(model, role)] = EstimateRow(model=model, role=role)
        return found

    async def add(self, role: str, requests: Iterable[Request], *, extra_input_tokens: int = 0
                  ) -> list[Result | None]:
        """Count `requests` under `role`; `extra_input_tokens` are added to
        each prompt (a part not known yet, e.g. the answer a judge will read).
        Returns each request's cached response (None where it is not cached)."""
        found: list[Result | None] = []
        chunk: list[Resolved] = []
        for request in requests:
            chunk.append(resolve(self.config, request))
            if len(chunk) >= _LOOKUP_CHUNK:
                found += await self._add_chunk(role, chunk, extra_input_tokens)
                chunk = []
        if chunk:
            found += await self._add_chunk(role, chunk, extra_input_tokens)
        return found

    async def _add_chunk(self, role: str, chunk: Sequence[Resolved], extra: int) -> list[Result | None]:
        hits = await self.cache.get_many([r.key for r in chunk]) if self.cache is not None else {}
        for r in chunk:
            row = self.row(r.alias.name, role)
            row.calls += 1
            row.batchable = row.batchable or self.batchable(r)
            if r.key in hits:
                row.cached += 1
                continue
            self._price(row, r, extra)
        return [hits.get(r.key) for r in chunk]

    def _price(self, row: EstimateRow, r: Resolved, extra: int) -> None:
        alias = r.alias if self.use_bands or not r.alias.prices else replace(r.alias, prices=())
        prefix = 0
        first_of_prefix = False
        if r.messages is None:  # embeddings
            assert isinstance(r.request, EmbedRequest)
            tokens, out = sum(map(self.count, r.request.texts)), 0
        else:
            tokens = extra + PER_MESSAGE_TOKENS * len(r.messages)
            out = output_tokens_allowed(r.params)  # no limit sent: the paper's max_tokens
            if r.prefix_end is not None:
                key = prefix_key(alias.model, r.messages, r.prefix_end)
                shared = self._prefixes.get(key)
                if shared is None:
                    shared = self._prefixes[key] = self.count("".join(t for _, t in prefix_parts(r.messages,
                                                                                             r.prefix_end)))
                index, chars = r.prefix_end
                rest = [r.messages[index]["content"][chars:]] + [m["content"] for m in r.messages[index + 1:]]
                tokens += shared + sum(self.count(t) for t in rest if t)
                if caches_prompts(r) and shared >= MIN_CACHED_TOKENS:
                    prefix = shared
                    first_of_prefix = key not in self._warm
                    self._warm.add(key)
            else:
                tokens += sum(self.count(m["content"]) for m in r.messages)
        row.input_tokens += tokens
        row.output_tokens += out
        band = alias.band(tokens)
        row.bands.add(band.short if band is not None else "")
        direct = alias.cost(tokens, out)
        with_cache = _with_prompt_cache(alias, r, tokens, out, prefix, first_of_prefix) if prefix else direct
        row.prefix_tokens += prefix
        discount = alias.batch_discount if self.batchable(r) else 1.0
        row.direct_usd += direct
        row.batch_usd += direct * discount
        row.cached_direct_usd += with_cache
        row.cached_batch_usd += with_cache * discount

    def add_unknown(self, role: str, alias: ModelAlias, calls: int, input_tokens: int, output_tokens: int, *,
                    batchable: bool) -> None:
        """Calls whose prompts cannot be built yet (RAG answers before
        retrieval): `input_tokens` each, estimated by the caller."""
        row = self.row(alias.name, role)
        row.calls += calls
        row.batchable = row.batchable or batchable
        row.input_tokens += calls * input_tokens
        row.output_tokens += calls * output_tokens
        direct = calls * alias.cost(input_tokens, output_tokens)
        discount = alias.batch_discount if batchable else 1.0
        row.direct_usd += direct
        row.cached_direct_usd += direct
        row.batch_usd += direct * discount
        row.cached_batch_usd += direct * discount

    def rows(self) -> list[EstimateRow]:
        order = {"answer": 0, "judge": 1, "write": 2, "embed": 3}
        return sorted(self._rows.values(), key=lambda r: (order.get(r.role, 9), r.model))

    def totals(self) -> EstimateRow:
        total = EstimateRow(model="total", role="")
        for r in self._rows.values():
            for name in ("calls", "cached", "input_tokens", "prefix_tokens", "output_tokens"):
                setattr(total, name, getattr(total, name) + getattr(r, name))
            for name in ("direct_usd", "batch_usd", "cached_direct_usd", "cached_batch_usd"):
                setattr(total, name, getattr(total, name) + getattr(r, name))
        return total

    def table(self) -> str:
        head = ["model", "role", "calls", "cached", "to call", "tokens in", "shared prefix", "tokens out (max)",
                "price band", "direct $", "batch $", "+prompt cache $", "batch+prompt cache $"]
        rows = self.rows()
        body = [_cells(r) for r in rows] + ([_cells(self.totals())] if len(rows) > 1 else [])
        widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
        lines = ["  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
                 .rstrip() for cells in [head, *body]]
        return "\n".join(lines)


def _cells(r: EstimateRow) -> list[str]:
    batch = f"{r.batch_usd:.4f}" if r.batchable or r.model == "total" else "-"
    both = f"{r.cached_batch_usd:.4f}" if r.batchable or r.model == "total" else "-"
    return [r.model, r.role, str(r.calls), str(r.cached), str(r.to_call), f"{r.input_tokens:,}",
            f"{r.prefix_tokens:,}", f"{r.output_tokens:,}", band_cell(r.bands), f"{r.direct_usd:.4f}", batch,
            f"{r.cached_direct_usd:.4f}", both]


def _with_prompt_cache(alias: ModelAlias, r: Resolved, tokens: int, out: int, prefix: int, first: bool) -> float:
    """A call's cost with provider prompt caching of its `prefix` tokens: the
    first call of a prefix writes it (Anthropic charges the write, and so do
    current OpenAI models: GPT-6's price_cache_write, 1.25x input; older
    OpenAI models and Gemini do not), the others read it (OpenAI in steps of
    128 tokens)."""
    caching = kind_of(r.endpoints[0]).capabilities
    if first:
        writes = caching.charges_cache_writes or alias.price_cache_write is not None
        return alias.cost(tokens, out, cache_write=prefix if writes else 0)
    read = prefix // caching.cache_read_step * caching.cache_read_step
    return alias.cost(tokens, out, cache_read=read)


def band_cell(bands: set[str]) -> str:
    """The price bands a row's calls were priced by, one word: "list" (the base prices), a band's
    (">272K": prompts over 272,000 tokens; "<=2026-12-31": a price in force until then), or several,
    "+"-joined."""
    labels = sorted(label or "list" for label in bands)
    return "+".join(labels) if labels else "-"

ESTIMATE_NOTE = ("tokens counted offline (cl100k_base); output at max_tokens, an upper bound (replies are "
                 f"usually shorter), or {UNLIMITED_OUTPUT_TOKENS:,} for calls sent without a limit (reasoning "
                 "tokens can exceed it); batch: the batch discount on calls to endpoints whose kind has a batch "
                 "API; prompt cache: the first call of each shared prefix writes it, the others read it")
