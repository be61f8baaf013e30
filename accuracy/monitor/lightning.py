"""A Lightning callback for the monitor: figures every step, triggers, and the capture of a
flagged step, as `MonitorCallback` does for the `transformers` Trainer.

    from accuracy.monitor.lightning import MonitorLightningCallback
    trainer = L.Trainer(callbacks=[MonitorLightningCallback(path="run.monitor.h5")])

At the start of training it makes a `Monitor` of the LightningModule with the trainer's
optimizer and LR schedulers (kept in snapshots); a step is one training batch
(`on_train_batch_start` to `on_train_batch_end`: forward, backward, optimizer step and
step-interval schedulers), its loss the `training_step`'s (`outputs["loss"]`). Each batch is
kept, so a capture re-runs a flagged step as Lightning's automatic optimization does:
`training_step`, `zero_grad`, backward, gradient clipping as the trainer sets it, optimizer
step, step-interval schedulers. With manual optimization, several optimizers or
`accumulate_grad_batches` > 1 the step is not re-run (figures and triggers only; the capture
says why).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from accuracy.monitor.core import Monitor

log = logging.getLogger(__name__)


def _loss(outputs: Any) -> Any:
    if isinstance(outputs, dict):
        return outputs.get("loss")
    return outputs if isinstance(outputs, torch.Tensor) else None


class MonitorLightningCallback(Callback):
    """options: those of `Monitor` (path, freq, triggers, snapshot_every, snapshot_budget...)."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.monitor: Monitor | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            return
        opts = list(trainer.optimizers)
        optimizer = opts[0] if len(opts) == 1 else None
        schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
        why = ("manual optimization" if not pl_module.automatic_optimization else
               f"{len(opts)} optimizers" if len(opts) != 1 else
               f"accumulate_grad_batches={trainer.accumulate_grad_batches}"
               if trainer.accumulate_grad_batches != 1 else None)
        step_fn = None
        if why is None:
            step_fn = self._make_step_fn(trainer, pl_module, optimizer)
        else:
            log.warning("monitor: %s: flagged steps will not be re-run", why)
        self.monitor = Monitor(pl_module, optimizer, step_fn=step_fn, stateful=schedulers,
                               **self.options)
        self.monitor.current_step = trainer.global_step  # resumed training: its step numbers

    def _make_step_fn(self, trainer: Any, pl_module: Any, optimizer: Any) -> Any:
        step_schedulers = [c.scheduler for c in trainer.lr_scheduler_configs
                           if c.interval == "step" and c.frequency == 1]

        def step_fn(batch: Any, batch_idx: int) -> Any:
            loss = _loss(pl_module.training_step(batch, batch_idx))
            optimizer.zero_grad()
            loss.backward()
            clip, algo = trainer.gradient_clip_val, trainer.gradient_clip_algorithm
            if clip:
                if algo == "value":
                    torch.nn.utils.clip_grad_value_(pl_module.parameters(), clip)
                else:
                    torch.nn.utils.clip_grad_norm_(pl_module.parameters(), clip)
            optimizer.step()
            for s in step_schedulers:
                s.step()
            return loss

        return step_fn

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        if self.monitor is not None:
            self.monitor.begin_step(batch, batch_idx)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.monitor is not None:
            self.monitor.end_step(_loss(outputs))

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            self.monitor.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.on_train_end(trainer, pl_module)
