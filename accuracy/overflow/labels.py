"""Names of GradScaler's deliberate non-finite checks, and the labels the reports use."""

from __future__ import annotations

AMP_CHECK_OPS = frozenset({
    "aten._amp_foreach_non_finite_check_and_unscale_.default",
    "aten._amp_non_finite_check_and_unscale_.default",
})
AMP_UPDATE_OP = "aten._amp_update_scale_.default"
AMP_OPS = AMP_CHECK_OPS | {AMP_UPDATE_OP}

HANDLED = "handled by loss scaling"
AMP_CHECK = "GradScaler non-finite check (deliberate, not a culprit)"
AMP_UPDATE = "GradScaler scale update (deliberate, not a culprit)"


def amp_label(op: str) -> str:
    """The label for one of GradScaler's own ops ('' for any other op)."""
    if op in AMP_CHECK_OPS:
        return AMP_CHECK
    if op == AMP_UPDATE_OP:
        return AMP_UPDATE
    return ""
