"""Verdicts from fp8/MX quantisation figures: what the error ratio cannot see.

A replay re-quantises a GEMM's operands honestly (replay/ops.py), so a kernel that misuses
its scale or biases its result shows as local error. What an honest re-quantisation
reproduces, it cannot judge: an operand that saturated (its amax was stale, its cast clipped)
or underflowed badly is quantised the same way again. Those are read from the figures the
device recorded, against `[quantization]` thresholds, and named with the figure:

- scale x scale_inv != 1 (per-tensor scaling): the cast and the dequantisation disagree;
- overflow_pct: elements clipped at the format's max (0 for honest current and MX scaling);
- underflow_pct: nonzero elements cast to 0.

A sub-table named after an element format (`[quantization.e2m1]`) overrides the limits for
operands in that format: fp4 keeps 1 mantissa bit and flushes what lies 24x below its block's
amax, so its honest underflow is far above fp8's.
"""

from __future__ import annotations

import math
from typing import Any

from accuracy.compare.row import Row
from accuracy.compare.row import Verdict as V
from accuracy.dumpfile.quant import figures_of, summary

DEFAULTS = {"overflow_warning_pct": 0.01, "overflow_error_pct": 1.0,
            "underflow_warning_pct": 1.0, "underflow_error_pct": 10.0,
            "scale_mismatch": 0.01}


def _scale_mismatch(f: dict[str, Any]) -> float | None:
    """|log2(scale * scale_inv)| of a per-tensor scaled operand (None: not recorded)."""
    s, si = f.get("scale"), f.get("scale_inv")
    if not isinstance(s, int | float) or not isinstance(si, int | float) or s <= 0 or si <= 0:
        return None
    return abs(math.log2(s * si))


def findings(figures: list[dict[str, Any]], sec: dict[str, Any]) -> tuple[V, list[str]]:
    """The worst verdict the figures give, and one sentence per finding."""
    worst, notes = V.PASS, []

    def raise_to(v: V, note: str) -> None:
        nonlocal worst
        if v.rank > worst.rank:
            worst = v
        notes.append(note)

    for f in figures:
        if f.get("high_precision"):
            continue
        arg = f.get("arg")
        fmt = f.get("format", "?")
        own = sec.get(fmt) if isinstance(fmt, str) else None
        lim = {**sec, **own} if isinstance(own, dict) else sec
        mis = _scale_mismatch(f)
        if mis is not None and mis > lim["scale_mismatch"]:
            raise_to(V.ERROR, f"{arg}: scale x scale_inv = {2.0 ** mis:.3g} (wrong scale: the "
                              "cast and its dequantisation disagree)")
        over = f.get("overflow_pct") or 0.0
        if over > lim["overflow_warning_pct"]:
            v = V.ERROR if over > lim["overflow_error_pct"] else V.WARNING
            raise_to(v, f"{arg}: {over:.3g}% of elements saturated at {fmt}'s max "
                        "(overflows%: a stale amax or a saturating cast)")
        under = f.get("underflow_pct") or 0.0
        if under > lim["underflow_warning_pct"]:
            v = V.ERROR if under > lim["underflow_error_pct"] else V.WARNING
            raise_to(v, f"{arg}: {under:.3g}% of nonzero elements underflowed to 0 in {fmt} "
                        "(underflows%)")
    return worst, notes


def judge_quant(rows: list[Row], records: dict[int, Any], cfg: dict[str, Any]) -> int:
    """Add figures and their verdicts to op output rows of quantised GEMMs (in place); how
    many rows the figures made worse."""
    sec = {**DEFAULTS, **(cfg.get("quantization") or {})}
    worse = 0
    for r in rows:
        if r.kind != "op" or r.seq_my is None:
            continue
        rec = records.get(r.seq_my)
        figs = figures_of(rec.extra) if rec is not None else []
        if not figs:
            continue
        r.quant = summary(figs)
        if r.io != "output" or r.tensor_index != 0 or r.verdict not in (V.PASS, V.WARNING,
                                                                         V.ERROR):
            continue
        v, notes = findings(figs, sec)
        if notes:
            r.message = "; ".join([m for m in [r.message] if m] + notes)
        if v.rank > r.verdict.rank:
            r.verdict = v
            worse += 1
    return worse
