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
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.benchmark.evaluation.figures import Figure
from engine.benchmark.evaluation.tables import Stat, Table, cell_text, visible_controls

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


def table_html(table: Table) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in table.head)
    body = []
    for row in table.rows:
        cells = []
        for cell in row:
            cls = ' class="num"' if isinstance(cell, Stat) else ""
            cells.append(f"<td{cls}>{esc(cell_text(cell))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    note = f'<p class="note">{esc(table.note)}</p>' if table.note else ""
    return (f'<h3 id="h-{esc(table.key)}">{esc(table.title)}</h3>{note}'
            f'<div class="scroll"><table class="data" id="t-{esc(table.key)}" data-key="{esc(table.key)}">'
            f'<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'
            f'<p class="files">tables/{esc(table.key)}.md, tables/{esc(table.key)}.csv</p>')


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
        cells = "".join(f"<td>{esc(c)}</td>" for c in row.cells)
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
table.data th{background:#f3f3f3;position:sticky;top:0}td.num{text-align:right;white-space:nowrap}
table.drill td{max-width:28em;white-space:pre-wrap;word-break:break-word}
tr.fail{background:#fff0f0}.scroll{overflow:auto;max-height:42em}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
.filters label{margin-right:1em;font-size:.9em}.count{font-weight:bold}pre{background:#f7f7f7;padding:.6em}
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
             f"<meta name=\"viewport\" content=\"width=device-width\"><style>{_CSS}</style></head><body>",
             f"<h1>{esc(title)}</h1><p>{esc(intro)}</p><nav>{nav}</nav>"]
    for s in sections:
        parts.append(f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>')
        if s.text:
            parts.append(f"<p>{esc(s.text)}</p>")
        if s.pre:
            parts.append(f"<pre>{esc(s.pre)}</pre>")
        parts += [table_html(t) for t in s.tables]
        parts += [figure_html(f) for f in s.figures]
        parts.append("</section>")
    parts.append('<section id="questions"><h2>Questions</h2><p>One row per configuration and question. '
                 'Model answers and judge items are shown as text.</p>' + _drill_html(drill) + "</section>")
    parts.append(f"<script>{_SCRIPT}</script></body></html>\n")
    return "".join(parts)
