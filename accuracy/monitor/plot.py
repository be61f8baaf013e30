"""Plots of a monitor series as one self-contained HTML page (no network, no server).

The page holds uPlot (vendored under accuracy/server/static/vendor/uplot) inline, the data as
JSON inside a `<script type="application/json">` block with every `<`, `>` and `&` escaped,
and a small script that draws: loss and global gradient norm over steps; for the chosen figure,
each layer over steps; and a layer x step heat map of each value against its layer's median
(log ratio), so the step and the layer where a problem starts stand out. Names (untrusted)
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
from pathlib import Path
from typing import Any

import numpy as np

from accuracy.jsonsafe import jsonable
from accuracy.monitor.series import Series, read_series

VENDOR = Path(__file__).resolve().parent.parent / "server" / "static" / "vendor" / "uplot"
MAX_STEPS = 2000  # columns drawn; longer runs are binned by each bin's largest |value|


def _bin(values: np.ndarray, steps: np.ndarray, max_steps: int) -> tuple[np.ndarray, np.ndarray]:
    n = values.shape[0]
    if n <= max_steps:
        return values, steps
    edges = np.linspace(0, n, max_steps + 1).astype(int)
    out = np.full((max_steps,) + values.shape[1:], np.nan)
    for i in range(max_steps):
        block = values[edges[i]:edges[i + 1]]
        key = np.where(np.isnan(block), -1.0, np.abs(block))  # Inf ranks first, NaN last
        idx = np.expand_dims(key.argmax(axis=0), 0)
        out[i] = np.take_along_axis(block, idx, 0)[0]
    return out, steps[edges[:-1]]


def _clean(a: np.ndarray) -> list[Any]:
    """JSON-safe: NaN -> null, +/-Inf -> strings the page shows as such."""
    def one(v: float) -> Any:
        if math.isnan(v):
            return None
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return float(v)
    if a.ndim == 1:
        return [one(float(v)) for v in a]
    return [[one(float(v)) for v in row] for row in a]


def series_data(s: Series, max_steps: int = MAX_STEPS) -> dict[str, Any]:
    """What the page draws, as JSON-ready data."""
    steps = s.step
    loss, st = _bin(s.loss, steps, max_steps)
    gn, _ = _bin(s.grad_norm, steps, max_steps)
    figures: dict[str, Any] = {}
    for kind, table in (("module", s.module), ("param", s.param), ("state", s.state)):
        names = s.module_names if kind == "module" else s.param_names
        for fig, values in sorted(table.items()):
            v, _ = _bin(values, steps, max_steps)
            figures[f"{kind}/{fig}"] = {"names": names, "values": _clean(v)}
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
    with np.errstate(all="ignore"):
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
        "<h2>per layer <select id='fig'></select> <label><input type='checkbox' id='log' "
        "checked> log scale</label></h2><div id='lines'></div>"
        "<h2>layer &times; step (value / the layer's median, log10)</h2>"
        "<div id='hover' class='hover'>&nbsp;</div><canvas id='heat'></canvas>"
        f"<script type='application/json' id='data'>{data}</script>"
        f"<script>{safe_js}</script><script>{own}</script></body></html>")


_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1em 2em; }
h2 { font-size: 1.05em; margin-top: 1.5em; }
.hover { font-family: monospace; min-height: 1.2em; }
#events div { color: #a00; }
.focus { font-weight: bold; margin: 0.5em 0; }
canvas#heat { image-rendering: pixelated; border: 1px solid #ccc; }
"""


def write_plot(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Read a monitor file and write its HTML page to `out`."""
    s = read_series(path)
    o = Path(out)
    o.write_text(render_html(s), encoding="utf-8")
    return o
