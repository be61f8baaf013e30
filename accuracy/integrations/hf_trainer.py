"""Hugging Face `Trainer`: `trainer.add_callback(AccuracyTrainerCallback(debugger, monitor))`.

A region is one optimizer step (`on_step_begin` to `on_step_end`: forward and backward of
every accumulated micro-batch, then the optimizer); the step number is `state.global_step`.
A probe that is itself a `TrainerCallback` (the monitor's `MonitorCallback`) gets the Trainer's
events from this one callback: its step opens after the plain probes start and closes before
they stop, so its figures are taken outside a debugger's region.
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import TrainerCallback

from accuracy.errors import UsageError
from accuracy.integrations.probes import Probes

log = logging.getLogger(__name__)


class AccuracyTrainerCallback(TrainerCallback):
    """Drives `probes` (PrecisionDebugger, MonitorCallback, ...) around each Trainer step."""

    def __init__(self, *probes: Any) -> None:
        self.callbacks = tuple(p for p in probes if isinstance(p, TrainerCallback))
        plain = [p for p in probes if not isinstance(p, TrainerCallback)]
        if not plain and not self.callbacks:
            raise UsageError("give the callback at least one probe, e.g. "
                             "PrecisionDebugger(config_path='config.json')")
        self.probes = Probes(plain) if plain else None

    def _forward(self, event: str, *args: Any, **kw: Any) -> None:
        for cb in self.callbacks:
            try:
                getattr(cb, event)(*args, **kw)
            except Exception as e:  # noqa: BLE001 - the training goes on
                log.error("%s.%s() failed: %s", type(cb).__name__, event, e)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.probes is not None:
            self.probes.sync(state.global_step)
        self._forward("on_train_begin", args, state, control, **kw)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                      **kw: Any) -> None:
        if self.probes is not None:
            self.probes.begin(model)
        self._forward("on_step_begin", args, state, control, model=model, **kw)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._forward("on_step_end", args, state, control, **kw)
        if self.probes is not None:
            self.probes.end()

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._forward("on_train_end", args, state, control, **kw)
        if self.probes is not None:
            self.probes.close()
