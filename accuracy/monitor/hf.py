"""A `transformers` TrainerCallback for the monitor: figures every step, triggers, and (given
the trainer) the capture of a flagged step.

    from accuracy.monitor.hf import MonitorCallback
    trainer = Trainer(model, args, train_dataset=ds)
    trainer.add_callback(MonitorCallback(trainer, path="run.monitor.h5"))   # the added call
    trainer.train()

The callback makes a `Monitor` at the start of training (model, optimizer, LR scheduler), calls
its step hooks around each optimizer step, takes the loss from the model's output (`.loss`,
averaged over gradient-accumulation micro-batches), and keeps each step's inputs by wrapping
the trainer's `training_step`. A capture re-runs a step as the Trainer's inner loop does with
one micro-batch: `training_step`, gradient clipping to `max_grad_norm`, optimizer step, LR
scheduler step, `zero_grad`; with gradient accumulation above 1 the step is not re-run (the
capture says so). Without the trainer, figures and triggers only.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import TrainerCallback

from accuracy.monitor.core import Monitor

log = logging.getLogger(__name__)


class MonitorCallback(TrainerCallback):
    """options: those of `Monitor` (path, freq, triggers, snapshot_every, snapshot_budget...)."""

    def __init__(self, trainer: Any = None, **options: Any) -> None:
        self.trainer, self.options = trainer, options
        self.monitor: Monitor | None = None
        self._losses: list[torch.Tensor] = []
        self._hook: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, lr_scheduler: Any = None, **kw: Any) -> None:
        if self.monitor is not None:
            return
        step_fn = None
        stateful = (lr_scheduler,) if lr_scheduler is not None else ()
        if self.trainer is not None and args.gradient_accumulation_steps == 1:
            step_fn = self._make_step_fn(args, model, optimizer, lr_scheduler)
            self._wrap_training_step()
        elif self.trainer is not None:
            log.warning("monitor: gradient_accumulation_steps=%d: flagged steps will not be "
                        "re-run (a capture needs one micro-batch per step)",
                        args.gradient_accumulation_steps)
        self.monitor = Monitor(model, optimizer, step_fn=step_fn, stateful=stateful,
                               **self.options)
        self._hook = model.register_forward_hook(self._grab_loss)

    def _make_step_fn(self, args: Any, model: Any, optimizer: Any, lr_scheduler: Any) -> Any:
        original = self.trainer.training_step

        def step_fn(inputs: Any, *a: Any, **kw: Any) -> Any:
            loss = original(model, inputs, *a, **kw)
            if args.max_grad_norm is not None and args.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            if lr_scheduler is not None:
                lr_scheduler.step()
            model.zero_grad()
            return loss

        return step_fn

    def _wrap_training_step(self) -> None:
        trainer, original = self.trainer, self.trainer.training_step

        def training_step(model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
            if self.monitor is not None:
                self.monitor.set_batch(inputs, *a, **kw)  # num_items_in_batch too
            return original(model, inputs, *a, **kw)

        trainer.training_step = training_step

    def _grab_loss(self, _mod: Any, _args: Any, output: Any) -> None:
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor) and torch.is_grad_enabled():
            self._losses.append(loss.detach())

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._losses = []
        if self.monitor is not None:
            self.monitor.begin_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.monitor is None:
            return
        loss = torch.stack(self._losses).float().mean() if self._losses else None
        self.monitor.end_step(loss)

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.monitor is not None:
            self.monitor.close()
