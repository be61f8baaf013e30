"""Hugging Face `Trainer`: one callback drives the debugger, the monitor, or both.

    trainer = Trainer(model, args, train_dataset=ds)
    trainer.add_callback(AccuracyTrainerCallback(debugger, monitor={"path": "run.monitor.h5"},
                                                 trainer=trainer))

A step is one optimizer step (`on_step_begin` to `on_step_end`: forward and backward of every
accumulated micro-batch, then clipping and the optimizer); its number is `state.global_step`,
so a run resumed from a checkpoint goes on numbering where it stopped. Plain probes (the
debugger) open before the monitor's step and close after it, so the monitor's figures are taken
outside a debugger's region.

The monitor (`monitor=` the options of `accuracy.monitor.Monitor`) is made at the start of
training with the Trainer's model, optimizer and LR scheduler. Given the trainer, the callback
wraps `trainer.training_step` to keep each micro-batch (with `num_items_in_batch`) and to add
up the micro-batches' losses as the Trainer does for its logged loss; a flagged step is re-run
as the Trainer's inner loop runs it: every micro-batch's `training_step`, clipping to
`max_grad_norm`, optimizer step, scheduler step, `zero_grad`. Its scalars also go to the
loggers of `report_to` (TensorBoard, W&B, ...), trigger events as text.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers import TrainerCallback

from accuracy.errors import UsageError
from accuracy.integrations.probes import Probes

log = logging.getLogger(__name__)


class AccuracyTrainerCallback(TrainerCallback):
    """Drives `probes` (PrecisionDebugger, ...) and, with `monitor=` (a dict of `Monitor`
    options, or True for the defaults), a monitor around each Trainer step. `trainer`: needed
    to re-run a flagged step, to take the step's loss as the Trainer logs it and to hand the
    scalars to `report_to`; without it the monitor records figures and gradient triggers."""

    def __init__(self, *probes: Any, monitor: dict[str, Any] | bool | None = None,
                 trainer: Any = None) -> None:
        self.callbacks = tuple(p for p in probes if isinstance(p, TrainerCallback))
        plain = [p for p in probes if not isinstance(p, TrainerCallback)]
        self.monitor_options = ({} if monitor is True else dict(monitor)
                                if isinstance(monitor, dict) else None)
        if monitor is not None and monitor is not False and self.monitor_options is None:
            raise UsageError(f"monitor= takes a dict of Monitor options or True, not "
                             f"{type(monitor).__name__}")
        if not plain and not self.callbacks and self.monitor_options is None:
            raise UsageError("give the callback at least one probe, e.g. "
                             "PrecisionDebugger(config_path='config.json'), or monitor={...}")
        self.probes = Probes(plain) if plain else None
        self.trainer = trainer
        self.monitor: Any = None
        self._original_step: Any = None
        self._loss: torch.Tensor | None = None
        self._micro = 0
        self._in_step = False

    def _forward(self, event: str, *args: Any, **kw: Any) -> None:
        for cb in self.callbacks:
            try:
                getattr(cb, event)(*args, **kw)
            except Exception as e:  # noqa: BLE001 - the training goes on
                log.error("%s.%s() failed: %s", type(cb).__name__, event, e)

    # -- the Trainer's events ---------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.probes is not None:
            self.probes.sync(state.global_step)
        if self.monitor_options is not None and self.monitor is None:
            try:
                self._make_monitor(args, state, **kw)
            except Exception as e:  # noqa: BLE001 - the training goes on without the monitor
                log.error("monitor: not started: %s", e)
        self._forward("on_train_begin", args, state, control, **kw)

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                      **kw: Any) -> None:
        if self.probes is not None:
            self.probes.begin(model)
        self._forward("on_step_begin", args, state, control, model=model, **kw)
        if self.monitor is not None:
            self._loss, self._micro, self._in_step = None, 0, True
            self.monitor.begin_step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.monitor is not None and self._in_step:
            self._in_step = False
            loss = self._loss if self.trainer is not None else None
            self.monitor.end_step(loss, micro_steps=max(1, self._micro))
        self._forward("on_step_end", args, state, control, **kw)
        if self.probes is not None:
            self.probes.end()

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._forward("on_train_end", args, state, control, **kw)
        self._close()
        if self.probes is not None:
            self.probes.close()

    # -- the monitor -----------------------------------------------------------------------

    def _make_monitor(self, args: Any, state: Any, model: Any = None, optimizer: Any = None,
                      lr_scheduler: Any = None, **_: Any) -> None:
        from accuracy.monitor.core import Monitor

        opts = dict(self.monitor_options or {})
        sinks = list(opts.pop("sinks", ()))
        step_fn = None
        if self.trainer is not None:
            step_fn = self._make_step_fn(args, model, optimizer, lr_scheduler)
            sinks.append(_ReportTo(self.trainer))
        else:
            log.warning("monitor: without trainer= a flagged step cannot be re-run and the "
                        "loss is not known: AccuracyTrainerCallback(..., trainer=trainer)")
        stateful = (lr_scheduler,) if lr_scheduler is not None else ()
        self.monitor = Monitor(model, optimizer, step_fn=step_fn, stateful=stateful,
                               start_step=int(state.global_step), sinks=sinks, **opts)
        if self.trainer is not None:
            self._wrap_training_step()
        acc = args.gradient_accumulation_steps
        log.info("monitor: a step is one optimizer step (%s), numbered from %d",
                 f"gradient_accumulation_steps={acc}: {acc} micro-batches each, the loss "
                 "summed over them as the Trainer logs it" if acc > 1 else "one micro-batch",
                 state.global_step)

    def _make_step_fn(self, args: Any, model: Any, optimizer: Any, lr_scheduler: Any) -> Any:
        trainer = self.trainer
        original = trainer.training_step

        def step_fn(micro_batches: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> Any:
            before = getattr(trainer, "current_gradient_accumulation_steps", None)
            trainer.current_gradient_accumulation_steps = len(micro_batches)
            try:
                loss = None
                for a, k in micro_batches:
                    part = original(model, *a, **k)
                    loss = part if loss is None else loss + part
            finally:
                if before is not None:
                    trainer.current_gradient_accumulation_steps = before
            if args.max_grad_norm is not None and args.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
            optimizer.step()
            if lr_scheduler is not None:
                lr_scheduler.step()
            model.zero_grad()
            return loss

        return step_fn

    def _wrap_training_step(self) -> None:
        trainer = self.trainer
        self._original_step = original = trainer.training_step

        def training_step(model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
            mon = self.monitor
            if mon is None or not self._in_step:
                return original(model, inputs, *a, **kw)
            mon.add_micro_batch(inputs, *a, **kw)  # num_items_in_batch too
            out = original(model, inputs, *a, **kw)
            if isinstance(out, torch.Tensor):
                part = out.detach()
                self._loss = part if self._loss is None else self._loss + part
            self._micro += 1
            return out

        trainer.training_step = training_step

    def _close(self) -> None:
        if self._original_step is not None and self.trainer is not None:
            self.trainer.training_step = self._original_step
            self._original_step = None
        if self.monitor is not None:
            self.monitor.close()


class _ReportTo:
    """The monitor's scalars and trigger events handed to the Trainer's `report_to` loggers
    (their own `on_log`: TensorBoard writes numbers as scalars and text as text), at the
    Trainer's step count, beside its own loss. The console printers are not among them."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self._classes: tuple[type, ...] | None = None

    def _loggers(self) -> list[Any]:
        if self._classes is None:
            from transformers.integrations import get_reporting_integration_callbacks

            self._classes = tuple(get_reporting_integration_callbacks(
                self.trainer.args.report_to))
        if not self._classes:
            return []
        return [cb for cb in self.trainer.callback_handler.callbacks
                if isinstance(cb, self._classes)]

    def _log(self, logs: dict[str, Any]) -> None:
        t = self.trainer
        for cb in self._loggers():
            cb.on_log(t.args, t.state, t.control, logs=logs)

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if values:
            self._log(dict(values))

    def text(self, step: int, tag: str, text: str) -> None:
        self._log({tag: text})
