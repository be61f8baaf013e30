"""What a `sim` profile did not emulate: ops holding matrix products outside its rules.

A rounding profile (fp16-cube, bf16, tf32...) rounds the operands of the GEMMs in its rules.
Fused ops with matrix products inside (flash attention, GEMV, RNN layers) fall outside them
and run at full precision: there the emulated device is more exact than hardware, and an error
of its rounding cannot show. The report says so, from the dump alone (its profile's rules and
its op names), rather than let a clean verdict over them read as evidence.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from accuracy.patterns import op_matches

# Ops with matrix products inside that reach the dispatcher whole (not as mm/bmm).
MATRIX_PRODUCT_OPS = (
    "aten._scaled_dot_product_*", "aten._flash_attention_*", "aten._efficient_attention_*",
    "aten.mv.*", "aten.addmv*", "aten.dot.*", "aten.vdot.*", "aten.addr*", "aten._cdist_*",
    "aten.mkldnn_rnn*",
)


def unemulated_note(attrs: dict[str, Any], ops: Iterable[str]) -> str | None:
    """A note naming the calls of matrix-product ops a rounding profile left unrounded."""
    sim = attrs.get("sim")
    if not isinstance(sim, dict):
        return None
    rules = [r for r in sim.get("rules") or [] if isinstance(r, dict) and r.get("op")]
    if not any(r.get("rounding") and not r.get("quant") for r in rules):
        return None  # exact, or an fp8/MX recipe (which leaves attention alone on purpose)
    left = Counter(op for op in ops
                   if any(op_matches(p, op) for p in MATRIX_PRODUCT_OPS)
                   and not any(op_matches(str(r["op"]), op) for r in rules))
    if not left:
        return None
    calls = ", ".join(f"{op} x{n}" for op, n in sorted(left.items()))
    return (f"sim profile {sim.get('profile')!r} rounds the operands of the GEMMs in its rules; "
            f"{sum(left.values())} calls of other ops with matrix products ran unrounded "
            f"({calls}): there the emulated device is more exact than hardware and a rounding "
            "error inside them cannot show (a Rule for them: docs/backends.md)")
