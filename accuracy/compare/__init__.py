"""Compare two dumps: align op streams, score every tensor, judge, and name the culprit.

    report = accuracy.compare.compare("npu.h5", "gpu.h5", replay="replay.h5")
    report.summary["culprit"]; report.write("report/")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accuracy._lazy import lazy_getattr

if TYPE_CHECKING:
    from accuracy.compare.api import compare
    from accuracy.compare.metrics import register_metric
    from accuracy.compare.report import Report, load_report
    from accuracy.compare.row import Row, Verdict

_LAZY = {
    "compare": "accuracy.compare.api",
    "register_metric": "accuracy.compare.metrics",
    "Report": "accuracy.compare.report",
    "Row": "accuracy.compare.row",
    "Verdict": "accuracy.compare.row",
    "load_report": "accuracy.compare.report",
}

__all__ = ["Report", "Row", "Verdict", "compare", "load_report", "register_metric"]


__getattr__ = lazy_getattr(__name__, _LAZY)
