"""Moved: the Lightning callback is `accuracy.integrations.AccuracyLightningCallback`.

`MonitorLightningCallback(**options)` is `AccuracyLightningCallback(monitor=options)`; this
name stays for scripts written against it and warns once."""

from __future__ import annotations

import warnings
from typing import Any

from accuracy.integrations.pl_callback import AccuracyLightningCallback


class MonitorLightningCallback(AccuracyLightningCallback):
    """Deprecated: `AccuracyLightningCallback(monitor={...})`."""

    def __init__(self, **options: Any) -> None:
        warnings.warn("accuracy.monitor.lightning.MonitorLightningCallback moved: use "
                      "accuracy.integrations.AccuracyLightningCallback(monitor={...})",
                      DeprecationWarning, stacklevel=2)
        super().__init__(monitor=options)
