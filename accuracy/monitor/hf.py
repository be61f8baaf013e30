"""Moved: the Trainer callback is `accuracy.integrations.AccuracyTrainerCallback`.

Importing this module says what to write instead. It does not re-export the callback: that
would be an import from the monitor back to the adapters that drive it (a circle between the
two parts), for a change of two lines in a script."""

raise ImportError(
    "accuracy.monitor.hf.MonitorCallback moved: write `from accuracy.integrations import "
    "AccuracyTrainerCallback` and `AccuracyTrainerCallback(monitor={...your options...}, "
    "trainer=trainer)` (it drives the debugger too: docs/monitor.md)")
