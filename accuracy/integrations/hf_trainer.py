"""Hugging Face `Trainer`: `trainer.add_callback(AccuracyTrainerCallback(debugger))`.

A region is one optimizer step (`on_step_begin` to `on_step_end`: forward and backward of
every accumulated micro-batch, then the optimizer); the step number is `state.global_step`.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from accuracy.integrations.probes import Probes


class AccuracyTrainerCallback(TrainerCallback):
    """Drives `probes` (PrecisionDebugger, ...) around each Trainer step."""

    def __init__(self, *probes: Any) -> None:
        self.probes = Probes(probes)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.probes.sync(state.global_step)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                      **kw: Any) -> None:
        self.probes.begin(model)

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.probes.end()

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.probes.close()
