"""Plots of a monitor series as one self-contained HTML page (no network, no server).

The page holds uPlot (vendored under accuracy/server/static/vendor/uplot) inline, the data as
JSON inside a `<script type="application/json">` block with every `<`, `>` and `&` escaped,
and a small script that draws: loss and global gradient norm over steps; for the chosen figure,
each layer over steps; and a layer x step heat map of each value against its layer's median
(log ratio; a measured NaN black, a value not measured grey), so the step and the layer where
a problem starts stand out. Names (untrusted)
reach the page only through JSON and `textContent`. The server shows the same page.

The page opens on what fired (`focus`): the figure the first trigger looks at (non-finite: the
NaN/Inf counts that are not zero; a gradient-norm jump: per-parameter gradient norms; a loss
spike or a rule: activation norms), the flagged step marked in every chart and the layer that
stands out at that step (the capture's culprit module when there is one) marked in the heat map.
"""

from __future__ import annotations

import html
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from accuracy.jsonsafe import jsonable
from accuracy.monitor.series import Series, read_series

VENDOR = Path(__file__).resolve().parent.parent / "server" / "static" / "vendor" / "uplot"
MAX_STEPS = 2000  # columns drawn; longer runs are binned by each bin's largest |value|


def _bin(values: np.ndarray, steps: np.ndarray, max_steps: int,
         measured_nan: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each bin's largest |value|: a measured NaN (`measured_nan`) and Inf rank first, a NaN
    that means 'not measured' last."""
    n = values.shape[0]
    if n <= max_steps:
        return values, steps
    edges = np.linspace(0, n, max_steps + 1).astype(int)
    out = np.full((max_steps,) + values.shape[1:], np.nan)
    for i in range(max_steps):
        block = values[edges[i]:edges[i + 1]]
        key = np.where(np.isnan(block), -1.0, np.abs(block))
        if measured_nan is not None:
            key = np.where(measured_nan[edges[i]:edges[i + 1]], np.inf, key)
        idx = np.expand_dims(key.argmax(axis=0), 0)
        out[i] = np.take_along_axis(block, idx, 0)[0]
    return out, steps[edges[:-1]]


# Figures whose NaN is a measured value where their NaN/Inf counts say the tensor held some:
# the file keeps NaN for "not measured" too (series.py), the counts tell them apart.
_COUNTED = {("module", f): ("act_nan", "act_inf") for f in ("act_norm", "act_min", "act_max")}
_COUNTED.update({("param", f): ("grad_nan", "grad_inf")
                 for f in ("grad_norm", "grad_min", "grad_max")})


def _measured_nan(table: dict[str, np.ndarray], kind: str, fig: str,
                  values: np.ndarray) -> np.ndarray | None:
    """Cells whose NaN was measured (the tensor held NaN or Inf), or None."""
    counts = _COUNTED.get((kind, fig))
    if counts is None or any(c not in table for c in counts):
        return None
    with np.errstate(invalid="ignore"):
        held = (np.nan_to_num(table[counts[0]]) > 0) | (np.nan_to_num(table[counts[1]]) > 0)
    return np.isnan(values) & held


def _clean(a: np.ndarray, measured_nan: np.ndarray | None = None) -> list[Any]:
    """JSON-safe: NaN -> null (not measured) or "nan" where `measured_nan` says the value
    was measured, +/-Inf -> strings; the page draws the strings black."""
    def one(v: float, nan: Any = None) -> Any:
        if math.isnan(v):
            return "nan" if nan else None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return float(v)
    if a.ndim == 1:
        return [one(float(v)) for v in a]
    if measured_nan is None:
        return [[one(float(v)) for v in row] for row in a]
    return [[one(float(v), m) for v, m in zip(row, mrow, strict=True)]
            for row, mrow in zip(a, measured_nan, strict=True)]


def series_data(s: Series, max_steps: int = MAX_STEPS) -> dict[str, Any]:
    """What the page draws, as JSON-ready data."""
    steps = s.step
    loss, st = _bin(s.loss, steps, max_steps)
    gn, _ = _bin(s.grad_norm, steps, max_steps)
    figures: dict[str, Any] = {}
    for kind, table in (("module", s.module), ("param", s.param), ("state", s.state)):
        names = s.module_names if kind == "module" else s.param_names
        for fig, values in sorted(table.items()):
            measured = _measured_nan(table, kind, fig, values)
            v, _ = _bin(values, steps, max_steps, measured)
            binned = None if measured is None else _measured_nan(
                {k: _bin(table[k], steps, max_steps)[0] for k in _COUNTED[(kind, fig)]},
                kind, fig, v)
            figures[f"{kind}/{fig}"] = {"names": names, "values": _clean(v, binned)}
    return {"file": s.path.name, "rank": s.attrs.get("rank"), "steps": [int(x) for x in st],
            "loss": _clean(loss), "grad_norm": _clean(gn), "figures": figures,
            "events": jsonable(s.events[:1000]), "focus": focus(s)}


_COUNTS = ("module/act_nan", "module/act_inf", "param/grad_nan", "param/grad_inf")


def _table(s: Series, key: str) -> tuple[list[str], np.ndarray] | None:
    kind, _, fig = key.partition("/")
    table = {"module": s.module, "param": s.param, "state": s.state}.get(kind, {})
    if fig not in table:
        return None
    return (s.module_names if kind == "module" else s.param_names), table[fig]


def _stands_out(values: np.ndarray, row: int) -> int | None:
    """The column whose value at `row` is furthest from its own median (log ratio)."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        # a column never measured (a module run inside torch.compile) has no median: NaN,
        # without numpy's "All-NaN slice" warning, which errstate does not cover
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(np.abs(values), axis=0)
        ratio = np.abs(np.log10(np.abs(values[row]) / med))
    ratio = np.where(np.isfinite(values[row]), ratio, np.inf)
    ratio = np.where(np.isnan(values[row]), -1.0, ratio)
    ratio = np.nan_to_num(ratio, nan=-1.0)
    return int(np.argmax(ratio)) if ratio.size and ratio.max() >= 0 else None


def _first_flagged(names: list[str], flagged: np.ndarray) -> int:
    """The first flagged name, in the model's order, that contains no other flagged one: a
    container's output carries its child's NaN, the child is where it showed first."""
    hit = [names[i] for i in np.flatnonzero(flagged)]

    def holds(a: str, b: str) -> bool:
        return a != b and (a == "(root)" or b.startswith(a + "."))
    for i in np.flatnonzero(flagged):
        if not any(holds(names[i], other) for other in hit):
            return int(i)
    return int(np.flatnonzero(flagged)[0])


def focus(s: Series) -> dict[str, Any] | None:
    """The view that shows what fired first: figure, step, layer and why (None: nothing
    fired; the page opens on activation norms)."""
    first = next((e for e in s.events if e.get("kind") == "trigger"
                  and isinstance(e.get("step"), int)), None)
    if first is None:
        return None
    step = int(first["step"])
    reasons = [str(r) for r in first.get("reasons") or []][:20]
    names = {r.split(":", 1)[0] for r in reasons}
    rows = np.flatnonzero(s.step == step)
    row = int(rows[-1]) if rows.size else None
    figure, layer = "module/act_norm", None
    if "non-finite" in names and row is not None:
        for key in _COUNTS:
            t = _table(s, key)
            if t is not None and np.nan_to_num(t[1][row]).max(initial=0) > 0:
                figure, layer = key, _first_flagged(t[0], np.nan_to_num(t[1][row]) > 0)
                break
    elif "grad-norm-jump" in names:
        figure = "param/grad_norm"
    cap = next((e for e in s.events if e.get("kind") == "capture" and e.get("step") == step),
               None)
    culprit = cap.get("culprit") if isinstance(cap, dict) else None
    t = _table(s, figure)
    if t is None:
        return {"figure": None, "step": step, "layer": None, "why": reasons}
    if layer is None and isinstance(culprit, dict) and figure.startswith("module/"):
        mod = culprit.get("module")
        if isinstance(mod, str) and mod in t[0]:
            layer = t[0].index(mod)
    if layer is None and row is not None:
        layer = _stands_out(t[1], row)
    return {"figure": figure, "step": step, "layer": t[0][layer] if layer is not None else None,
            "why": reasons}


def _json_for_script(data: Any) -> str:
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def render_html(s: Series, title: str | None = None) -> str:
    """The whole page as one string."""
    js = (VENDOR / "uPlot.iife.min.js").read_text(encoding="utf-8")
    css = (VENDOR / "uPlot.min.css").read_text(encoding="utf-8")
    own = (Path(__file__).with_name("plot.js")).read_text(encoding="utf-8")
    data = _json_for_script(series_data(s))
    safe_js = js.replace("</script", "<\\/script")
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; "
        "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:\">"
        f"<title>{html.escape(title or s.path.name)}</title>"
        f"<style>{css.replace('</style', '')}\n{_STYLE}</style></head><body>"
        f"<h1>monitor: {html.escape(title or s.path.name)}</h1>"
        "<div id='focus' class='focus'></div><div id='events'></div>"
        "<h2>loss and global gradient norm</h2><div id='top'></div>"
        "<div id='lossgaps' class='gaps'></div>"
        "<h2>per layer <select id='fig'></select> <label><input type='checkbox' id='log' "
        "checked> log scale</label></h2><div id='lines'></div>"
        "<h2>layer &times; step (value / the layer's median, log10)</h2>"
        "<div class='legend'><span class='sw' style='background:#f00'></span> above "
        "<span class='sw' style='background:#00f'></span> below "
        "<span class='sw' style='background:#000'></span> NaN or Inf "
        "<span class='sw' style='background:#ddd'></span> not measured</div>"
        "<div id='hover' class='hover'>&nbsp;</div><canvas id='heat'></canvas>"
        f"<script type='application/json' id='data'>{data}</script>"
        f"<script>{safe_js}</script><script>{own}</script></body></html>")


_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1em 2em; }
h2 { font-size: 1.05em; margin-top: 1.5em; }
.hover { font-family: monospace; min-height: 1.2em; }
#events div { color: #a00; }
.focus { font-weight: bold; margin: 0.5em 0; }
.gaps { color: #d00; font-size: 0.9em; min-height: 1.2em; }
.legend { font-size: 0.9em; margin-bottom: 0.3em; }
.sw { display: inline-block; width: 0.9em; height: 0.9em; vertical-align: middle;
      border: 1px solid #999; margin-left: 0.6em; }
canvas#heat { image-rendering: pixelated; border: 1px solid #ccc; }
"""


def write_plot(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Read a monitor file and write its HTML page to `out`."""
    s = read_series(path)
    o = Path(out)
    o.write_text(render_html(s), encoding="utf-8")
    return o
