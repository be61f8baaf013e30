"""The proof's one-page HTML report (Jinja2, autoescaped: op and module names are untrusted)."""

from __future__ import annotations

from typing import Any

import jinja2

_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>accuracy: proof by substitution</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:right}
td.l,th.l{text-align:left}.ok{color:#070}.bad{color:#a00}
.bar{display:inline-block;height:.8em;background:#48c}
</style></head><body>
<h1>Proof by substitution</h1>
<p class="{{ 'ok' if p.convincing else 'bad' }}"><strong>{{ p.sentence }}</strong></p>
<p>Culprit(s): {% for c in p.culprits %}<code>{{ c }}</code>{% if not loop.last %}, {% endif %}
{% endfor %}. Reference: {{ p.on }}{% if p.dtype %} at {{ p.dtype }}{% endif %}.
Golden loss {{ "%.8g"|format(p.golden_loss) }}.</p>
<table><tr><th class="l">run</th><th>loss</th><th>|loss − golden|</th><th>loss gap closed</th>
<th>‖grad − golden‖</th><th>gradient gap closed</th><th>calls substituted</th></tr>
{% for a in [p.device, p.culprit, p.control] %}
<tr><td class="l">{{ a.name }}</td><td>{{ "%.8g"|format(a.loss) }}</td>
<td>{{ fmt(a.loss_gap) }}</td><td class="l">{{ pct(a.loss_closed) }}
{% if a.loss_closed is number and a.loss_closed > 0 %}<span class="bar"
 style="width:{{ (100 * [a.loss_closed, 1]|min)|round|int }}px"></span>{% endif %}</td>
<td>{{ fmt(a.grad_gap) }}</td><td>{{ pct(a.grad_closed) }}</td><td>{{ a.calls|length }}</td></tr>
{% endfor %}</table>
{% for a in [p.culprit, p.control] %}
<h2>{{ a.name }} calls</h2>
<table><tr><th>call</th><th class="l">op</th><th class="l">phase</th><th class="l">module</th>
<th class="l">substituted</th></tr>
{% for c in a.calls %}<tr><td>{{ c.seq }}</td><td class="l"><code>{{ c.op }}</code></td>
<td class="l">{{ c.phase }}</td><td class="l">{{ c.module or "-" }}</td>
<td class="l">{{ "yes" if c.substituted else "no" }}</td></tr>{% endfor %}
</table>{% endfor %}
{% if p.notes %}<h2>Notes</h2><ul>{% for n in p.notes %}<li>{{ n }}</li>{% endfor %}</ul>
{% endif %}
<p>The control substitutes as many randomly chosen non-culprit calls (seeded) as the culprit
matched: a gap closed by the culprit but not by the control is the culprit's doing.</p>
</body></html>
"""


def _pct(v: Any) -> str:
    return f"{100 * v:.1f}%" if isinstance(v, int | float) else "n/a"


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, int | float) else "n/a"


def render_proof(proof: dict[str, Any]) -> str:
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(_TEMPLATE).render(p=proof, pct=_pct, fmt=_fmt)
