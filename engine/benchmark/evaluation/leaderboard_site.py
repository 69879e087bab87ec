"""`tulving leaderboard BUNDLE... --out SITE`: one static page ranking models and memory systems together.

Writes into SITE:
- index.html: per book, one table of every (model, memory system) of the
  bundles, ranked by Simple Recall: scores with their 95% intervals, questions
  scored, cost, the evidence budget and retrieval recall (memory systems),
  the judge, where the row comes from (a Tulving run, an answers file, the
  paper's published runs) and whether its bundle verifies. Each row links to
  its bundle's page. A row whose bundle does not verify says so, in red, and
  is not ranked; rows on part of the question set (samples, partial answers
  files) are listed after the ranked ones, unranked, as in `tulving run`'s
  leaderboard.
- bundles/N.html: the bundle's provenance (book and question-set SHA-256,
  judge and judge prompt version, scorer version, command, versions, source)
  and its verify result, check by check and figure by figure.
- bundles/N.json: a copy of the bundle, linked from its page.
Self-contained: inline CSS, no script, nothing fetched; everything from a
bundle is escaped.
"""
from __future__ import annotations

import html
import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.benchmark.evaluation.bundle import Json
from engine.benchmark.evaluation.verify import Verification

CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}h1{font-size:1.5em}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left}
th{background:#f2f2f2}tr.unverified td{background:#fde8e8}.bad{color:#b00;font-weight:bold}.ok{color:#070}
.muted{color:#777}pre{background:#f7f7f7;padding:1em;overflow-x:auto}td.num{text-align:right}"""
HEAD = ["#", "model", "memory", "Simple Recall [95% CI]", "Chronological Awareness [95% CI]", "scored",
        "cost (USD)", "budget", "retrieval recall", "judge", "source", "bundle"]


@dataclass(slots=True)
class Entry:
    """One bundle of the page: where it is, what it holds, what verify said."""

    path: Path
    bundle: Json
    result: Verification


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _dict(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def _score(row: Mapping[str, object], name: str) -> str:
    value, ci = row.get(name), row.get(f"{name}_ci")
    if not isinstance(value, (int, float)):
        return "-"
    if isinstance(ci, list) and len(ci) == 2:
        return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]"
    return f"{value:.3f}"


def source(bundle: Json) -> str:
    run = _dict(bundle.get("run"))
    if run.get("source") == "published release":
        return f"the paper's published runs (DOI {run.get('doi')})"
    if run.get("source"):
        return str(run["source"])
    return f"tulving run ({_dict(run.get('provenance')).get('tulving_version', '?')})"


def _rows(entries: Sequence[Entry]) -> dict[str, list[tuple[Mapping[str, object], int]]]:
    """Book -> [(scores row, entry index)], best first: ranked rows (full set, verified) by Simple Recall."""
    by_book: dict[str, list[tuple[Mapping[str, object], int]]] = {}
    for i, entry in enumerate(entries):
        book = str(_dict(entry.bundle.get("book")).get("name"))
        runs = _dict(entry.bundle.get("claimed")).get("runs")
        for row in runs if isinstance(runs, list) else []:
            by_book.setdefault(book, []).append((_dict(row), i))
    for rows in by_book.values():
        rows.sort(key=lambda t: (not _ranked(t[0], entries[t[1]]), -_num(t[0].get("simple_recall")),
                                 -_num(t[0].get("chronological_awareness")), str(t[0].get("model"))))
    return by_book


def _num(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) else -1.0


def _ranked(row: Mapping[str, object], entry: Entry) -> bool:
    return (entry.result.verified and row.get("sample") is None and not row.get("incomplete")
            and not row.get("no_valid_judgments"))


def _cells(row: Mapping[str, object], entry: Entry, index: int, rank: str) -> list[str]:
    memory = _dict(row.get("memory"))
    recall = memory.get("retrieval_recall")
    total = _dict(entry.bundle.get("claimed")).get("questions") or row.get("questions")
    scored = f"{row.get('scored')}/{total}" + (" (part of the set)" if row.get("sample") else "")
    verdict = ('<span class="ok">verified</span>' if entry.result.verified
               else '<span class="bad">NOT VERIFIED</span>')
    return [_e(rank), _e(row.get("model")), _e(row.get("mode")), _e(_score(row, "simple_recall")),
            _e(_score(row, "chronological_awareness")), _e(scored), _e(f"{_num(row.get('cost_usd')):.4f}"),
            _e(memory.get("budget") or "-"), _e("-" if not isinstance(recall, (int, float)) else f"{recall:.2f}"),
            _e(_dict(entry.bundle.get("judge")).get("model")), _e(source(entry.bundle)),
            f'<a href="bundles/{index + 1}.html">{verdict}</a>']


def index_html(title: str, entries: Sequence[Entry]) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{CSS}</style>"
             f"</head><body><h1>{_e(title)}</h1><p>{len(entries)} bundles, each re-scored offline from its judge "
             "replies (<code>tulving verify</code>) when this page was built. Ranked: verified rows on the whole "
             "question set; rows on part of it, and rows whose bundle does not verify, are listed unranked."
             " Scores of different judges or books are not comparable.</p>"]
    for book, rows in _rows(entries).items():
        parts.append(f"<h2>{_e(book)}</h2><table class='board'><thead><tr>"
                     + "".join(f"<th>{_e(h)}</th>" for h in HEAD) + "</tr></thead><tbody>")
        rank = 0
        for row, i in rows:
            ranked = _ranked(row, entries[i])
            rank += ranked
            cls = "" if entries[i].result.verified else " class='unverified'"
            parts.append(f"<tr{cls}>" + "".join(f"<td>{c}</td>" for c in _cells(row, entries[i], i,
                                                                                str(rank) if ranked else "-"))
                         + "</tr>")
        parts.append("</tbody></table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def bundle_html(entry: Entry, index: int, lines: Sequence[str]) -> str:
    """A bundle's page: its provenance and its verify result."""
    bundle = entry.bundle
    run = _dict(bundle.get("run"))
    facts = [("file", entry.path.name), ("source", source(bundle)), ("created", bundle.get("created")),
             ("book", f"{_dict(bundle.get('book')).get('name')} (SHA-256 {_dict(bundle.get('book')).get('sha256')})"),
             ("question set", f"{_dict(bundle.get('questions')).get('count')} questions (SHA-256 "
                              f"{_dict(bundle.get('questions')).get('sha256')})"),
             ("judge", f"{_dict(bundle.get('judge')).get('model')}, prompts {_dict(bundle.get('judge')).get('prompt_version')}"),
             ("scorer", json.dumps(bundle.get("scorer"))), ("judgments", bundle.get("judgments")),
             ("bundle SHA-256", bundle.get("sha256"))]
    verdict = "VERIFIED" if entry.result.verified else "NOT VERIFIED"
    table = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>bundle {index + 1}</title><style>{CSS}</style>"
            f"</head><body><p><a href='../index.html'>leaderboard</a> &middot; <a href='{index + 1}.json'>the bundle "
            f"(JSON)</a></p><h1>Bundle {index + 1}: <span class='{'ok' if entry.result.verified else 'bad'}'>"
            f"{verdict}</span></h1><table>{table}</table><h2>tulving verify</h2><pre>"
            + _e("\n".join(lines)) + "</pre><h2>Provenance</h2><pre>"
            + _e(json.dumps(run.get("provenance") or {k: run.get(k) for k in ("source", "doi", "release_folder")},
                            indent=1)) + "</pre></body></html>")


def write_site(out: Path, title: str, entries: Sequence[Entry], lines: Sequence[Sequence[str]]) -> Path:
    """index.html and one page (and copy) per bundle; `lines`: each bundle's verify report."""
    (out / "bundles").mkdir(parents=True, exist_ok=True)
    for i, entry in enumerate(entries):
        shutil.copyfile(entry.path, out / "bundles" / f"{i + 1}.json")
        (out / "bundles" / f"{i + 1}.html").write_text(bundle_html(entry, i, lines[i]), encoding="utf-8")
    (out / "index.html").write_text(index_html(title, entries), encoding="utf-8")
    return out / "index.html"
