"""Lightning: `Trainer(callbacks=[AccuracyLightningCallback(debugger)])`.

A region is one training batch (`on_train_batch_start` to `on_train_batch_end`: forward,
backward and, with automatic optimization, the optimizer step); validation runs outside it.
The step number starts at `trainer.global_step`; with `accumulate_grad_batches` > 1 each
batch counts as a step.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback

from accuracy.integrations.probes import Probes


class AccuracyLightningCallback(Callback):
    """Drives `probes` (PrecisionDebugger, ...) around each training batch."""

    def __init__(self, *probes: Any) -> None:
        self.probes = Probes(probes)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.probes.sync(trainer.global_step)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        self.probes.begin(pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self.probes.end()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.probes.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.probes.close()
