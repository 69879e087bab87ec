"""A run folder's identity and history across invocations (run.json).

A run folder belongs to one configuration: what changes its results (book,
questions, models with their provider ids and params, modes, judge, embedding
model, sample, shard, repeats). `configuration(...)` makes that record;
`check_out_folder` refuses an --out that holds a run of another configuration
(unless `--overwrite`), and returns the earlier run.json of the same
configuration, so a rerun resumes it:

- `spent_before(previous)`: what earlier invocations paid (--max-cost counts it);
- `carried_spending(previous, rows)`: the spending rows of every invocation
  added up, so a cached rerun keeps the paid figure (this invocation's rows
  are kept apart, in `spending_this_invocation`).

`run_key(configuration, book_text)` names the run in the cache's spending
ledger (cache/spending_ledger.py): the same configuration is the same run
whatever its --out folder or machine (the book by its text, not its path).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from engine.benchmark.evaluation.results import RESULTS_FILE
from engine.config import Config
from engine.spending import SpendingRow, merge_rows
from providers.base import TulvingError

RUN_FILE = "run.json"
Json = dict[str, object]  # a JSON object as read or written


def file_digest(path: str | Path | None) -> str | None:
    if path is None:
        return None
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def configuration(config: Config, *, book: str, questions_file: str | None, models: Sequence[str] | None,
                  modes: Sequence[str] | None, judge: str, embed_model: str | None, settings: Mapping[str, object]
                  ) -> Json:
    """What makes a run's results what they are. `models` None: the built-in
    default run. `settings`: sample, local_sample, shard, repeats, temperature, max_tokens."""
    def resolved(name: str) -> Json:
        alias = config.alias(name)
        return {"model": alias.model, "params": dict(alias.params)}

    return {"book": book, "questions": file_digest(questions_file), "models": list(models) if models else "default",
            "resolved": {m: resolved(m) for m in [*(models or []), judge]},
            "modes": list(modes) if modes else "default", "judge": judge, "embed_model": embed_model,
            **{k: v for k, v in settings.items() if v is not None}}


def run_key(wanted: Mapping[str, object], book_text: str) -> str:
    """The run's key in the spending ledger: a digest of its configuration,
    the book named by a digest of its text (a book folder's path differs
    from machine to machine; its text does not)."""
    record = {**wanted, "book": hashlib.sha256(book_text.encode("utf-8")).hexdigest()}
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:32]


def _read(path: Path) -> Json | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _difference(old: Mapping[str, object], new: Mapping[str, object]) -> str:
    keys = [k for k in dict.fromkeys([*old, *new]) if old.get(k) != new.get(k)]
    return ", ".join(f"{k} {json.dumps(old.get(k))} here, {json.dumps(new.get(k))} now" for k in keys[:2])


def check_out_folder(out: Path, wanted: Mapping[str, object], *, overwrite: bool) -> Json | None:
    """The run.json of the run `out` holds when it is of the `wanted`
    configuration (a resume); None when `out` holds no run or --overwrite
    replaces it. Raises one line when it holds another configuration's run."""
    if overwrite or not (out / RESULTS_FILE).exists():
        return None
    previous = _read(out / RUN_FILE)
    held = (previous or {}).get("configuration")
    if held == dict(wanted):
        return previous
    why = _difference(held, wanted) if isinstance(held, dict) else "its configuration is not recorded"
    raise TulvingError(f"--out {out} holds another run ({why}): pass another --out, or --overwrite to "
                       f"replace it (replies are cached: redoing it costs nothing)")


def _paid(rows: object) -> float:
    if not isinstance(rows, list):
        return 0.0
    return sum(float(r.get("spent_usd", 0.0) or 0.0) for r in rows if isinstance(r, dict))


def spent_before(previous: Mapping[str, object] | None) -> float:
    """USD the earlier invocations of this run spent (their added-up spending rows)."""
    return _paid((previous or {}).get("spending"))


def carried_spending(previous: Mapping[str, object] | None, rows: Sequence[SpendingRow]) -> list[SpendingRow]:
    """Every invocation's spending added up per (model, role): what the run cost so far."""
    before = (previous or {}).get("spending")
    return merge_rows([before, rows] if isinstance(before, list) else [rows])
