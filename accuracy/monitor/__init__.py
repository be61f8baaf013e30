"""A monitor over training steps: per-step figures as an HDF5 time series, triggers, and the
capture of the step that went wrong (re-run from a snapshot, dumped, replayed, compared).
See docs/monitor.md."""

from typing import TYPE_CHECKING

from accuracy._lazy import lazy_getattr

if TYPE_CHECKING:
    from accuracy.monitor.capture import Capture
    from accuracy.monitor.core import Monitor, watch
    from accuracy.monitor.series import MonitorFileError, Series, read_series
    from accuracy.monitor.snapshots import SnapshotBudgetError
    from accuracy.monitor.triggers import (
        GradNormJump,
        LossSpike,
        NonFinite,
        Predicate,
        StepFigures,
        Trigger,
    )

_LAZY = {
    "Capture": "accuracy.monitor.capture",
    "Monitor": "accuracy.monitor.core",
    "watch": "accuracy.monitor.core",
    "MonitorFileError": "accuracy.monitor.series",
    "Series": "accuracy.monitor.series",
    "read_series": "accuracy.monitor.series",
    "SnapshotBudgetError": "accuracy.monitor.snapshots",
    "GradNormJump": "accuracy.monitor.triggers",
    "LossSpike": "accuracy.monitor.triggers",
    "NonFinite": "accuracy.monitor.triggers",
    "Predicate": "accuracy.monitor.triggers",
    "StepFigures": "accuracy.monitor.triggers",
    "Trigger": "accuracy.monitor.triggers",
}

__all__ = [
    "Capture", "GradNormJump", "LossSpike", "Monitor", "MonitorFileError", "NonFinite",
    "Predicate", "Series", "SnapshotBudgetError", "StepFigures", "Trigger", "read_series",
    "watch",
]

__getattr__ = lazy_getattr(__name__, _LAZY)
