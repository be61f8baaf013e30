"""Moved: the Lightning callback is `accuracy.integrations.AccuracyLightningCallback`.

Importing this module says what to write instead. It does not re-export the callback: that
would be an import from the monitor back to the adapters that drive it (a circle between the
two parts), for a change of two lines in a script."""

raise ImportError(
    "accuracy.monitor.lightning.MonitorLightningCallback moved: write `from "
    "accuracy.integrations import AccuracyLightningCallback` and "
    "`AccuracyLightningCallback(monitor={...your options...})` (it drives the debugger too: "
    "docs/monitor.md)")
