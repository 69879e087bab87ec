"""The self-contained `index.html` of a report: tables, figures, drill-down.

`render_html(title, sections, drill)` returns the page as a string: inline
CSS and script, images as data URIs, nothing fetched from the network.

Everything that comes from a run (model names, answers, judge items, cues) is
text: `esc` escapes it for HTML (`<script>`, `</table>`, quotes, `&`), and
control characters (NUL, the ESC of ANSI sequences, ...) are shown as their
`\\xNN` text, so a model's answer can neither inject markup nor break a row.

The drill-down is one row per (configuration, question), rendered here
(with whether the answer came from the cache, from run.json); its
filters (model, mode, book, judge, question kind, bin, cue, retrieval type,
"only failures") hide rows in the browser. The filter state lives in the URL
fragment (`#model=gpt-4o&bin=2&failures=1`): a link or a headless browser's
`--dump-dom` opens the page filtered.
"""
from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.benchmark.evaluation.figures import Figure
from engine.benchmark.evaluation.tables import NUMERIC, Cell, Table, cell_text, visible_controls

FILTERS = (("model", "model"), ("mode", "mode"), ("book", "book"), ("judge", "judge"), ("get", "question kind"),
           ("bin", "bin"), ("cue", "cue"), ("trace", "retrieval type"))


def esc(value: object) -> str:
    """Text for HTML content or a quoted attribute value."""
    return html.escape(visible_controls(str(value)), quote=True)


@dataclass(slots=True)
class Section:
    """A part of the page: a heading, a paragraph, then tables and figures."""

    id: str
    title: str
    text: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    pre: str = ""                                      # preformatted text (e.g. the ranking)


@dataclass(slots=True)
class DrillRow:
    """One (configuration, question) of the drill-down; `data` are the filter keys."""

    data: dict[str, str]
    status: str            # "ok" | "judge failure" | "answer error"
    cells: list[object]    # shown with esc()


DRILL_HEAD = ["model", "mode", "book", "judge", "q", "kind", "bin", "cue", "retrieval type", "question",
              "ground truth", "evidence (memory)", "answer", "judge's items (scores)", "F1", "tau", "tokens in/out", "latency (s)",
              "cost (USD)", "answer from cache", "status"]
# How each drill-down column is laid out: names and figures on one line (never
# cut mid-word), the texts wrapped at word boundaries in a column wide enough to read.
DRILL_CLASSES = ["label"] * 9 + ["text"] * 5 + ["num"] * 5 + [""] * 2  # "yes", "ok": short words as they are
CUE_NOTE = ("A question's cue is what it gives of an event: its time (t), space (s), entity (ent) or content (c); "
            "a * is a part left open. (t, *, *, *) asks for the events at a date, (t, s, ent, c) gives all four; "
            "the retrieval type is what the question asks back (the places, the dates, the people, ...).")


def table_html(table: Table, heading: bool = True) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in table.head)
    body = []
    for row in table.rows:
        cells = []
        for i, cell in enumerate(row):  # names and figures on one line; other text wraps between words
            cells.append(f'<td class="{_cell_class(cell, i < table.label_columns)}">{esc(cell_text(cell))}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    note = f'<p class="note">{esc(table.note)}</p>' if table.note else ""
    title = f'<h3 id="h-{esc(table.key)}">{esc(table.title)}</h3>' if heading else ""
    return (f'{title}{note}'
            f'<div class="scroll"><table class="data" id="t-{esc(table.key)}" data-key="{esc(table.key)}">'
            f'<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
            f'<p class="files">tables/{esc(table.key)}.md, tables/{esc(table.key)}.csv</p>')


_FIGURE = re.compile(r"^[-+\d.,/%±\[\] ]*$")  # "456/456", "0.718", "-", "1,234": a figure, not words


def _cell_class(cell: Cell, label: bool) -> str:
    """num: a figure (right-aligned, one line); label: a configuration's
    name (one line); text: words, wrapped between them in a column wide
    enough to read (not one word a line)."""
    if isinstance(cell, NUMERIC) or _FIGURE.match(str(cell)):
        return "num"
    return "label" if label else "text"


def figure_html(figure: Figure) -> str:
    data = base64.b64encode(figure.png).decode("ascii")
    caption = esc(figure.title) + (f" &mdash; {esc(figure.caption)}" if figure.caption else "")
    return (f'<figure id="f-{esc(figure.name)}"><img alt="{esc(figure.title)}" src="data:image/png;base64,{data}">'
            f'<figcaption>{caption} (figures/{esc(figure.name)}.png, .svg)</figcaption></figure>')


def _drill_html(rows: Sequence[DrillRow]) -> str:
    options: dict[str, list[str]] = {key: [] for key, _ in FILTERS}
    for row in rows:
        for key, _ in FILTERS:
            value = row.data.get(key, "")
            if value not in options[key]:
                options[key].append(value)
    selects = []
    for key, label in FILTERS:
        values = options[key]
        if len(values) < 2 and key in ("book", "judge"):
            continue
        opts = '<option value="">all</option>' + "".join(
            f'<option value="{esc(v)}">{esc(v)}</option>' for v in values)
        selects.append(f'<label>{esc(label)} <select id="f-{key}" data-filter="{key}">{opts}</select></label>')
    selects.append('<label><input type="checkbox" id="f-failures"> only failures '
                   '(judge failures, answer errors)</label>')
    body = []
    for row in rows:
        attrs = "".join(f' data-{k}="{esc(v)}"' for k, v in row.data.items())
        cls = "" if row.status == "ok" else ' class="fail"'
        cells = "".join(f'<td class="{cls}">{esc(c)}</td>' if cls else f"<td>{esc(c)}</td>"
                        for c, cls in zip(row.cells, DRILL_CLASSES, strict=True))
        body.append(f'<tr{cls}{attrs} data-status="{esc(row.status)}">{cells}</tr>')
    head = "".join(f"<th>{esc(h)}</th>" for h in DRILL_HEAD)
    return (f'<div class="filters">{"".join(selects)} <span class="count"><span id="shown">{len(rows)}</span> of '
            f'{len(rows)} shown</span></div><div class="scroll"><table class="data drill" id="drill">'
            f'<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:110em}
h1{font-size:1.5em}h2{border-bottom:1px solid #ccc;margin-top:2em}h3{margin-bottom:.2em}
nav a{margin-right:1em}.note,.files{color:#555;font-size:.85em;margin:.2em 0}
table.data{border-collapse:collapse;font-size:.82em;margin:.4em 0}
table.data th,table.data td{border:1px solid #ddd;padding:.2em .45em;text-align:left;vertical-align:top}
table.data th{background:#f3f3f3;position:sticky;top:0}
table.data td.num{text-align:right;white-space:nowrap}table.data td.label{white-space:nowrap}
table.data td.text{min-width:12em}
table.drill td{max-width:28em;white-space:pre-wrap;overflow-wrap:break-word}table.drill td.text{min-width:14em}
tr.fail{background:#fff0f0}.scroll{overflow:auto;max-height:42em}
@media (max-width:40em){body{margin:.5em}table.data{font-size:.75em}nav a{display:inline-block;margin:.1em .8em .1em 0}}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
.filters label{margin-right:1em;font-size:.9em}.count{font-weight:bold}pre{background:#f7f7f7;padding:.6em;overflow:auto}
"""

_SCRIPT = """
(function(){
const keys=[...document.querySelectorAll('select[data-filter]')].map(e=>e.dataset.filter);
const rows=[...document.querySelectorAll('#drill tbody tr')];
const failures=document.getElementById('f-failures');
function apply(){
  const want={};
  for(const k of keys){const v=document.getElementById('f-'+k).value;if(v!=='')want[k]=v;}
  let shown=0;
  for(const tr of rows){
    let ok=true;
    for(const k in want){if(tr.dataset[k]!==want[k]){ok=false;break;}}
    if(ok&&failures.checked&&tr.dataset.status==='ok')ok=false;
    tr.hidden=!ok;if(ok)shown++;
  }
  document.getElementById('shown').textContent=String(shown);
  const h=new URLSearchParams(want);if(failures.checked)h.set('failures','1');
  history.replaceState(null,'',h.toString()?'#'+h.toString():location.pathname+location.search);
}
function load(){
  const h=new URLSearchParams(location.hash.slice(1));
  for(const k of keys){if(h.has(k))document.getElementById('f-'+k).value=h.get(k);}
  failures.checked=h.get('failures')==='1';
  apply();
}
for(const k of keys)document.getElementById('f-'+k).addEventListener('change',apply);
failures.addEventListener('change',apply);
window.addEventListener('hashchange',load);
load();
})();
"""


def render_html(title: str, intro: str, sections: Sequence[Section], drill: Sequence[DrillRow]) -> str:
    nav = "".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s in sections) + \
        '<a href="#questions">Questions</a>'
    parts = [f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
             f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><style>{_CSS}</style></head><body>",
             f"<h1>{esc(title)}</h1><p>{esc(intro)}</p><nav>{nav}</nav>"]
    for s in sections:
        parts.append(f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>')
        if s.text:
            parts.append(f"<p>{esc(s.text)}</p>")
        if s.pre:
            parts.append(f"<pre>{esc(s.pre)}</pre>")
        parts += [table_html(t, heading=t.title != s.title) for t in s.tables]  # no "Leaderboard" twice
        parts += [figure_html(f) for f in s.figures]
        parts.append("</section>")
    parts.append('<section id="questions"><h2>Questions</h2><p>One row per configuration and question (a '
                 'result). Model answers and judge items are shown as text. ' + esc(CUE_NOTE) + '</p>'
                 + _drill_html(drill) + "</section>")
    parts.append(f"<script>{_SCRIPT}</script></body></html>\n")
    return "".join(parts)
