"""The fp8/MX quantisation figures a dump holds, per op (for reports and time series).

`sim`'s fp8 and MX profiles (and anything else that publishes figures through
`accuracy.device_backend.quant_figures`) leave one dict per quantised GEMM operand in the op's
`extra["quant"]`: arg, role (activation / weight / gradient), gemm (fprop / dgrad / wgrad),
format, block, scaling, underflow_pct, overflow_pct, scale_min/max, scale_inv_min/max, amax,
dynamic_range, block_dynamic_range, mse, rel_error (see device_backend/formats.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

NUMERIC = ("underflow_pct", "overflow_pct", "scale_min", "scale_max", "scale_inv_min",
           "scale_inv_max", "amax", "dynamic_range", "block_dynamic_range", "mse", "rel_error")


@dataclass(frozen=True)
class OpQuant:
    """The figures of one recorded op: where it ran, and one dict per operand."""

    seq: int
    op: str
    module: str
    phase: str
    step: int
    operands: list[dict[str, Any]]


def figures_of(extra: dict[str, Any]) -> list[dict[str, Any]]:
    """The well-formed operand figures of one op's extra (malformed entries dropped: the
    file is untrusted)."""
    raw = extra.get("quant") if isinstance(extra, dict) else None
    if not isinstance(raw, list):
        return []
    out = []
    for f in raw:
        if not isinstance(f, dict) or not isinstance(f.get("arg"), str):
            continue
        clean = {k: v for k, v in f.items() if isinstance(k, str)}
        for k in NUMERIC:
            v = clean.get(k)
            if v is not None and not (isinstance(v, int | float) and not isinstance(v, bool)):
                clean[k] = None
        out.append(clean)
    return out


def quant_figures(dump: Any) -> list[OpQuant]:
    """Every op of an opened dump (`load_dump`) that carries figures, in seq order: what a
    monitor plots per step and GEMM operand."""
    out = []
    for r in dump.records:
        figs = figures_of(r.extra)
        if figs:
            out.append(OpQuant(r.seq, r.op, r.module, r.phase, r.step, figs))
    return out


def _g(v: Any) -> str:
    return "?" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3g}"


def summary(figures: list[dict[str, Any]]) -> str:
    """One line per op: each operand's format and its figures (TE's names in docs/fp8.md)."""
    parts = []
    for f in figures:
        hp = " high-precision" if f.get("high_precision") else ""
        parts.append(
            f"{f.get('arg')}({f.get('role', '?')}) {f.get('format', '?')}"
            f"{'/' + str(f['block']) if f.get('block') else ''}{hp}: "
            f"under {_g(f.get('underflow_pct'))}% over {_g(f.get('overflow_pct'))}% "
            f"scale_inv {_g(f.get('scale_inv_min'))}..{_g(f.get('scale_inv_max'))} "
            f"range {_g(f.get('dynamic_range'))} block range {_g(f.get('block_dynamic_range'))} "
            f"mse {_g(f.get('mse'))} rel {_g(f.get('rel_error'))}")
    return "; ".join(parts)
