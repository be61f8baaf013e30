"""index.html: one self-contained page (inline SVG chart, inline CSS/JS), opens offline.

Rendered by Jinja2 with autoescape (template `report.html` beside this module): op names,
modules, phases, sources and messages come from dump files and are untrusted.
"""

from __future__ import annotations

import json
import math
from typing import Any

from markupsafe import Markup, escape

from accuracy.compare.row import Row, Verdict
from accuracy.compare.terminal import count_parts

COLOURS = {"pass": "#2e9d4f", "warning": "#e0a100", "error": "#d0342c", "unmatched": "#888888",
           "fused away": "#888888",
           "skipped": "#bbbbbb"}
PHASE_BG = {"forward": "#eef4fb", "backward": "#fbf1ea", "optimizer": "#f1f1f1"}
TABLE_COLS = ("index", "kind", "op", "phase", "module", "io", "tensor_index", "dtype_my",
              "dtype_golden", "shape_my", "cosine", "rel_euc_dist", "max_abs_err",
              "max_rel_err", "one_thousandth_err_ratio", "local_error_ratio", "amplification",
              "verdict", "message", "source", "quant")
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


# compare/verdict.py's message for a tensor whose values are all below the zero floor: its
# relative distance is noise (layer norm's mean output on a normalised input, ~1e-8 of noise,
# reads 1.4), so the chart draws it at the floor, grey, not as a passing op near the top.
NOT_JUDGED = "not judged"


def not_judged(message: str | None) -> bool:
    return NOT_JUDGED in (message or "")


def _y(row: Row) -> float:
    red = row.rel_euc_dist
    if not_judged(row.message) or red is None or (isinstance(red, float) and math.isnan(red)):
        return Y_MIN
    if red <= 0:
        return Y_MIN
    return max(Y_MIN, min(Y_MAX, math.log10(red)))


def chart(rows: list[Row], culprit: dict[str, Any] | None) -> dict[str, Any]:
    """Geometry of the SVG chart: log10 relative Euclidean distance of each op output along
    execution order. Numbers only; the template draws (and escapes) it."""
    pts = [r for r in rows if r.kind == "op" and r.io == "output"
           and r.verdict != Verdict.SKIPPED]
    n = max(len(pts), 1)
    pw, ph = W - PAD_L - 10, H - PAD_T - PAD_B

    def x(i: int) -> float:
        return PAD_L + (i + 0.5) * pw / n

    def y(v: float) -> float:
        return PAD_T + (Y_MAX - v) / (Y_MAX - Y_MIN) * ph

    bands = []
    start = 0
    for i in range(1, len(pts) + 1):  # phase bands
        if i == len(pts) or pts[i].phase != pts[start].phase:
            name = str(pts[start].phase or "")
            bands.append({"x": x(start) - pw / n / 2, "width": (i - start) * pw / n,
                          "fill": PHASE_BG.get(name, "#fff"), "name": name})
            start = i
    grid = [{"y": y(v), "label": f"1e{v}"} for v in range(int(Y_MIN), int(Y_MAX) + 1, 2)]
    culprit_x = None
    if culprit is not None:
        ci = next((i for i, r in enumerate(pts) if r.index == culprit["index"]), None)
        if ci is not None:
            culprit_x = x(ci)
    points = []
    # Passing points first, errors last, so the few that matter are drawn on top.
    for i in sorted(range(len(pts)), key=lambda i: pts[i].verdict.rank):
        r = pts[i]
        big = r.verdict == Verdict.ERROR or (culprit is not None
                                            and r.index == culprit["index"])
        points.append({
            "index": r.index, "x": x(i), "y": y(_y(r)), "big": big,
            "fill": COLOURS["skipped"] if not_judged(r.message) else COLOURS.get(r.verdict, "#000"),
            "tip": f"#{r.index} {r.op} {r.module or ''} {r.phase}: "
                   f"{NOT_JUDGED if not_judged(r.message) else r.verdict} "
                   f"rel_euc_dist={_fmt(r.rel_euc_dist)}",
        })
    return {"W": W, "H": H, "pad_l": PAD_L, "pad_t": PAD_T, "pw": pw, "ph": ph,
            "bands": bands, "grid": grid, "culprit_x": culprit_x, "points": points}


_ENV = None


def template() -> Any:
    """The report template, with autoescape on: every value from a dump or config is text."""
    global _ENV
    if _ENV is None:
        import jinja2

        _ENV = jinja2.Environment(
            loader=jinja2.PackageLoader("accuracy.compare", "."),
            autoescape=True, undefined=jinja2.StrictUndefined)
    return _ENV.get_template("report.html")


def _cell_text(v: Any) -> str:
    """A cell's text, escaped. A number's text (digits, '.', 'e', '+', '-', 'inf', 'nan')
    holds nothing to escape, so only other values go through `escape`."""
    t = type(v)
    if t is float:
        return f"{v:.6g}" if v - v == 0.0 else str(v)  # inf - inf and nan - nan are nan
    if t is int:
        return str(v)
    if v is None:
        return ""
    return escape(_fmt(v))


def _row_html(r: Row) -> str:
    """One table row, each cell escaped once (it is written twice: as data-v and as text);
    the template's own loop escaped it twice, at ~10 us a cell."""
    cells = "".join(f'<td data-v="{e}">{e}</td>'
                    for e in (_cell_text(getattr(r, c)) for c in TABLE_COLS))
    return f'<tr id="row-{escape(r.index)}" class="{escape(r.verdict)}">{cells}</tr>'


def render(rows: list[Row], summary: dict[str, Any]) -> str:
    """A report's page from its rows and summary."""
    s = summary
    rows_html = Markup("".join(map(_row_html, rows)))  # every value in it escaped above
    culprit, first = s.get("culprit"), s.get("first_divergence")
    # the same row twice is one box that says so, not two identical boxes
    same = (isinstance(culprit, dict) and isinstance(first, dict)
            and culprit.get("index") == first.get("index"))
    boxes = ([("Culprit (also the first divergence)", culprit)] if same
             else [("Culprit", culprit), ("First divergence", first)])
    return template().render(
        css=Markup(_CSS), js=Markup(_JS), summary=s, colours=COLOURS, cols=TABLE_COLS,
        rows_html=rows_html, chart=chart(rows, culprit), fmt=_fmt, boxes=boxes,
        counts=count_parts(s),
    )
