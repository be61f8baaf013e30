"""index.html: one self-contained page (inline SVG chart, inline CSS/JS), opens offline."""

from __future__ import annotations

import html
import json
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from accuracy.compare.report import Report

COLOURS = {"pass": "#2e9d4f", "warning": "#e0a100", "error": "#d0342c", "unmatched": "#888888",
           "skipped": "#bbbbbb"}
_DRAW_ORDER = {"pass": 0, "skipped": 0, "unmatched": 1, "warning": 2, "error": 3}
PHASE_BG = {"forward": "#eef4fb", "backward": "#fbf1ea", "optimizer": "#f1f1f1"}
TABLE_COLS = ("index", "kind", "op", "phase", "module", "io", "tensor_index", "dtype_my",
              "dtype_golden", "shape_my", "cosine", "rel_euc_dist", "max_abs_err",
              "max_rel_err", "one_thousandth_err_ratio", "local_error_ratio", "amplification",
              "verdict", "message", "source")
Y_MIN, Y_MAX = -12.0, 1.0  # log10(rel_euc_dist) range drawn
W, H, PAD_L, PAD_B, PAD_T = 1100, 300, 50, 30, 20

_CSS = """
body{font:14px system-ui,sans-serif;margin:20px;color:#222}
h1{font-size:20px} .counts span{margin-right:14px;font-weight:600}
table{border-collapse:collapse;font-size:12px} th,td{border:1px solid #ddd;padding:2px 5px}
td{white-space:nowrap;max-width:32em;overflow:hidden;text-overflow:ellipsis}
th{background:#f4f4f4;cursor:pointer;position:sticky;top:0} tr.error{background:#fbe3e1}
tr.warning{background:#fdf4d8} tr.unmatched{background:#eee} .box{border:1px solid #ccc;
padding:8px 12px;margin:10px 0;background:#fafafa} code{font-size:12px}
"""

_JS = """
function sortBy(th){const t=th.closest('table'),i=[...th.parentNode.children].indexOf(th),
b=t.tBodies[0],asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';
const key=r=>{const v=r.children[i].dataset.v??r.children[i].textContent;const n=parseFloat(v);
return isNaN(n)?v:n};const rows=[...b.rows];rows.sort((x,y)=>{const a=key(x),c=key(y);
if(typeof a===typeof c)return (a<c?-1:a>c?1:0)*(asc?1:-1);return typeof a==='number'?-1:1});
rows.forEach(r=>b.appendChild(r))}
function filt(v){for(const r of document.querySelectorAll('#rows tbody tr'))
r.style.display=(!v||r.className===v)?'':'none'}
"""


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}" if math.isfinite(v) else str(v)
    if isinstance(v, list):
        return json.dumps(v)
    return str(v)


def _y(row: dict[str, Any]) -> float:
    red = row.get("rel_euc_dist")
    if red is None or (isinstance(red, float) and math.isnan(red)):
        return Y_MIN
    if red <= 0:
        return Y_MIN
    return max(Y_MIN, min(Y_MAX, math.log10(red)))


def chart(rows: list[dict[str, Any]], culprit: dict[str, Any] | None) -> str:
    """SVG: log10 relative Euclidean distance of each op output along execution order."""
    pts = [r for r in rows if r["kind"] == "op" and r["io"] == "output"
           and r["verdict"] not in ("skipped",)]
    n = max(len(pts), 1)
    pw, ph = W - PAD_L - 10, H - PAD_T - PAD_B

    def x(i: int) -> float:
        return PAD_L + (i + 0.5) * pw / n

    def y(v: float) -> float:
        return PAD_T + (Y_MAX - v) / (Y_MAX - Y_MIN) * ph

    out = [f'<svg id="chart" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'role="img" aria-label="divergence chart">']
    start = 0
    for i in range(1, len(pts) + 1):  # phase bands
        if i == len(pts) or pts[i]["phase"] != pts[start]["phase"]:
            ph_name = pts[start]["phase"] or ""
            out.append(f'<rect x="{x(start) - pw / n / 2:.1f}" y="{PAD_T}" '
                       f'width="{(i - start) * pw / n:.1f}" height="{ph}" '
                       f'fill="{PHASE_BG.get(ph_name, "#fff")}"><title>{html.escape(ph_name)}'
                       f'</title></rect>')
            out.append(f'<text x="{x(start) - pw / n / 2 + 3:.1f}" y="{PAD_T + 12}" '
                       f'font-size="11" fill="#666">{html.escape(ph_name)}</text>')
            start = i
    for v in range(int(Y_MIN), int(Y_MAX) + 1, 2):
        out.append(f'<line x1="{PAD_L}" x2="{W - 10}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                   f'stroke="#ddd"/><text x="{PAD_L - 4}" y="{y(v) + 4:.1f}" font-size="10" '
                   f'text-anchor="end">1e{v}</text>')
    out.append(f'<text x="12" y="{PAD_T + ph / 2}" font-size="11" transform="rotate(-90 12 '
               f'{PAD_T + ph / 2})" text-anchor="middle">rel. Euclidean distance</text>')
    out.append(f'<text x="{PAD_L + pw / 2}" y="{H - 6}" font-size="11" text-anchor="middle">'
               f'op outputs in execution order</text>')
    if culprit is not None:
        ci = next((i for i, r in enumerate(pts) if r["index"] == culprit["index"]), None)
        if ci is not None:
            out.append(f'<line x1="{x(ci):.1f}" x2="{x(ci):.1f}" y1="{PAD_T}" '
                       f'y2="{PAD_T + ph}" stroke="#d0342c" stroke-dasharray="4 3"/>'
                       f'<text x="{x(ci) + 4:.1f}" y="{PAD_T + 24}" font-size="11" '
                       f'fill="#d0342c">culprit</text>')
    # Passing points first, errors last, so the few that matter are drawn on top.
    order = sorted(range(len(pts)), key=lambda i: _DRAW_ORDER.get(pts[i]["verdict"], 0))
    for i in order:
        r = pts[i]
        tip = html.escape(f"#{r['index']} {r['op']} {r['module'] or ''} {r['phase']}: "
                          f"{r['verdict']} rel_euc_dist={_fmt(r.get('rel_euc_dist'))}")
        big = r["verdict"] == "error" or (culprit is not None and r["index"] == culprit["index"])
        out.append(f'<a href="#row-{r["index"]}"><circle cx="{x(i):.1f}" cy="{y(_y(r)):.1f}" '
                   f'r="{5 if big else 2.5}" fill="{COLOURS.get(r["verdict"], "#000")}"'
                   + (' stroke="#000" stroke-width="1"' if big else "")
                   + f'><title>{tip}</title></circle></a>')
    out.append("</svg>")
    return "".join(out)


def _row_box(title: str, r: dict[str, Any] | None) -> str:
    if r is None:
        return f'<div class="box"><b>{title}:</b> none</div>'
    return (f'<div class="box"><b>{title}:</b> <a href="#row-{r["index"]}">#{r["index"]}</a> '
            f'<code>{html.escape(str(r["op"]))}</code> ({html.escape(str(r["phase"]))}) in '
            f'<code>{html.escape(str(r["module"] or "-"))}</code> at '
            f'<code>{html.escape(str(r["source"] or "?"))}</code><br>'
            f'{html.escape(str(r["my_address"]))} vs {html.escape(str(r["golden_address"]))}: '
            f'{html.escape(r["verdict"])}, {html.escape(r["message"] or "")}</div>')


def render(report: Report) -> str:
    s = report.summary
    counts = " ".join(f'<span style="color:{COLOURS.get(k, "#000")}">{k} {v}</span>'
                      for k, v in s["counts"].items())
    head = "".join(f'<th onclick="sortBy(this)">{c}</th>' for c in TABLE_COLS)
    body = []
    for r in report.rows:
        cells = "".join(
            f'<td data-v="{html.escape(_fmt(r.get(c)))}">{html.escape(_fmt(r.get(c)))}</td>'
            for c in TABLE_COLS)
        body.append(f'<tr id="row-{r["index"]}" class="{r["verdict"]}">{cells}</tr>')
    suspects = "".join(
        f'<li><a href="#row-{x["index"]}">#{x["index"]}</a> <code>{html.escape(str(x["op"]))}'
        f'</code> {html.escape(str(x["module"] or "-"))} ({x["phase"]}): score '
        f'{_fmt(x["score"])}, {x["verdict"]}</li>' for x in s.get("suspects", []))
    warn = f'<div class="box">{html.escape(s["warning"])}</div>' if s.get("warning") else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>accuracy compare report</title>
<style>{_CSS}</style><script>{_JS}</script></head><body>
<h1>accuracy compare: {html.escape(str(s.get("my")))} vs {html.escape(str(s.get("golden")))}</h1>
<div class="counts">{counts}</div>{warn}
{_row_box("Culprit", s.get("culprit"))}
{_row_box("First divergence", s.get("first_divergence"))}
<h2>Divergence chart</h2>{chart(report.rows, s.get("culprit"))}
<h2>Suspects</h2><ol>{suspects}</ol>
<h2>Rows</h2><p>Filter: <select onchange="filt(this.value)"><option value="">all</option>
{"".join(f'<option>{k}</option>' for k in s["counts"])}</select> (click a header to sort)</p>
<table id="rows"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>
</body></html>
"""
