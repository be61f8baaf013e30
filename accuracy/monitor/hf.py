"""Moved: the Trainer callback is `accuracy.integrations.AccuracyTrainerCallback`.

`MonitorCallback(trainer, **options)` is `AccuracyTrainerCallback(monitor=options,
trainer=trainer)`; this name stays for scripts written against it and warns once."""

from __future__ import annotations

import warnings
from typing import Any

from accuracy.integrations.hf_trainer import AccuracyTrainerCallback


class MonitorCallback(AccuracyTrainerCallback):
    """Deprecated: `AccuracyTrainerCallback(monitor={...}, trainer=trainer)`."""

    def __init__(self, trainer: Any = None, **options: Any) -> None:
        warnings.warn("accuracy.monitor.hf.MonitorCallback moved: use accuracy.integrations."
                      "AccuracyTrainerCallback(monitor={...}, trainer=trainer)",
                      DeprecationWarning, stacklevel=2)
        super().__init__(monitor=options, trainer=trainer)
