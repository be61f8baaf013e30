"""Compare two dumps: align op streams, score every tensor, judge, and name the culprit.

    report = accuracy.compare.compare("npu.h5", "gpu.h5", replay="replay.h5")
    report.summary["culprit"]; report.write("report/")
"""

from accuracy.compare.api import compare
from accuracy.compare.metrics import register_metric
from accuracy.compare.report import Report, Row, load_report

__all__ = ["Report", "Row", "compare", "load_report", "register_metric"]
