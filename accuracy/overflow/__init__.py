"""Overflow detection: find the op where inf/nan (or near-limit values) were born.

Online: `dumper(path, check_overflow=True, overflow_nums=1, overflow_raise=False,
saturation=None)`. Offline: `scan(dump)` / `accuracy overflow dump.h5 [--confirm-on cpu]`.

One record for a finding, online and offline: `OverflowFinding` (accuracy/records.py); its
older names `OverflowEvent` (online) and `Finding` (offline) are the same class.
"""

from accuracy.aten import HANDLED
from accuracy.dumper.finite_probe import Saturation
from accuracy.dumper.overflow_watch import OverflowDetected, OverflowEvent, OverflowWarning
from accuracy.overflow.scan import Finding, OverflowReport, scan
from accuracy.records import OverflowFinding

__all__ = ["HANDLED", "Finding", "OverflowDetected", "OverflowEvent", "OverflowFinding",
           "OverflowReport", "OverflowWarning", "Saturation", "scan"]
