"""Compare two dumps: align op streams, score every tensor, judge, and name the culprit.

    report = accuracy.compare.compare("npu.h5", "gpu.h5", replay="replay.h5")
    report.summary["culprit"]; report.write("report/")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accuracy._lazy import lazy_getattr

if TYPE_CHECKING:
    from accuracy.compare.api import compare
    from accuracy.compare.cluster import compare_on_cluster
    from accuracy.compare.html import NOT_JUDGED, not_judged
    from accuracy.compare.metrics import register_metric
    from accuracy.compare.report import Report, load_report
    from accuracy.compare.row import Row, Verdict
    from accuracy.compare.writers import csv_cell, xlsx_workbook

_LAZY = {
    "compare": "accuracy.compare.api",
    "compare_on_cluster": "accuracy.compare.cluster",
    "register_metric": "accuracy.compare.metrics",
    "Report": "accuracy.compare.report",
    "Row": "accuracy.compare.row",
    "Verdict": "accuracy.compare.row",
    "load_report": "accuracy.compare.report",
    # what the server's exports and chart share with the report files
    "csv_cell": "accuracy.compare.writers",
    "xlsx_workbook": "accuracy.compare.writers",
    "NOT_JUDGED": "accuracy.compare.html",
    "not_judged": "accuracy.compare.html",
}

__all__ = ["NOT_JUDGED", "Report", "Row", "Verdict", "compare", "compare_on_cluster", "csv_cell",
           "load_report", "not_judged", "register_metric", "xlsx_workbook"]


__getattr__ = lazy_getattr(__name__, _LAZY)
