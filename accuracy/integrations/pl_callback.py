"""Lightning: one callback drives the debugger, the monitor, or both.

    trainer = L.Trainer(callbacks=[AccuracyLightningCallback(debugger,
                                                             monitor={"path": "run.monitor.h5"})])

A step is one optimizer step: from the first training batch it accumulates to the batch after
which the trainer's `global_step` moved (with `accumulate_grad_batches` N, N batches: forward,
backward, then clipping and the optimizer inside `optimizer.step(closure)`); validation runs
outside it. Steps are numbered from `trainer.global_step`, so a resumed fit goes on where the
checkpoint stopped.

The monitor (`monitor=` the options of `accuracy.monitor.Monitor`) is made at the start of
training with the LightningModule, the trainer's optimizer and its LR schedulers (kept in
snapshots). Its loss is the step's: the sum of the batches' `training_step` losses as
Lightning scales them for accumulation (the mean over the step's batches). Each batch is kept,
so a flagged step is re-run as automatic optimization runs it: every batch's `training_step`,
`zero_grad` after the first, backward, the trainer's gradient clipping, optimizer step,
step-interval schedulers. Manual optimization or several optimizers: figures and triggers, no
re-run. Its scalars also go to the trainer's loggers (`log_metrics`; trigger events as text
where the logger's experiment has `add_text`, as TensorBoard's does).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback

from accuracy.errors import UsageError
from accuracy.integrations.probes import Probes

log = logging.getLogger(__name__)


def _loss(outputs: Any) -> Any:
    if isinstance(outputs, dict):
        return outputs.get("loss")
    return outputs if isinstance(outputs, torch.Tensor) else None


class AccuracyLightningCallback(Callback):
    """Drives `probes` (PrecisionDebugger, ...) and, with `monitor=` (a dict of `Monitor`
    options, or True for the defaults), a monitor around each optimizer step."""

    def __init__(self, *probes: Any, monitor: dict[str, Any] | bool | None = None) -> None:
        self.monitor_options = ({} if monitor is True else dict(monitor)
                                if isinstance(monitor, dict) else None)
        if monitor is not None and monitor is not False and self.monitor_options is None:
            raise UsageError(f"monitor= takes a dict of Monitor options or True, not "
                             f"{type(monitor).__name__}")
        if not probes and self.monitor_options is None:
            raise UsageError("give the callback at least one probe, e.g. "
                             "PrecisionDebugger(config_path='config.json'), or monitor={...}")
        self.probes = Probes(probes) if probes else None
        self.monitor: Any = None
        self._open = False
        self._step_at = 0
        self._loss: torch.Tensor | None = None
        self._micro = 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.probes is not None:
            self.probes.sync(trainer.global_step)
        if self.monitor_options is not None and self.monitor is None:
            try:
                self._make_monitor(trainer, pl_module)
            except Exception as e:  # noqa: BLE001 - the training goes on without the monitor
                log.error("monitor: not started: %s", e)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        if not self._open:  # the first batch of an optimizer step
            self._open, self._step_at = True, trainer.global_step
            self._loss, self._micro = None, 0
            if self.probes is not None:
                self.probes.begin(pl_module)
            if self.monitor is not None:
                self.monitor.begin_step()
        if self.monitor is not None:
            self.monitor.add_micro_batch(batch, batch_idx)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        loss = _loss(outputs)
        if isinstance(loss, torch.Tensor):
            part = loss.detach()
            self._loss = part if self._loss is None else self._loss + part
        self._micro += 1
        if trainer.global_step != self._step_at:  # the optimizer stepped: the step ends
            self._end_step()

    def _end_step(self) -> None:
        self._open = False
        if self.monitor is not None:
            self.monitor.end_step(self._loss, micro_steps=max(1, self._micro))
        if self.probes is not None:
            self.probes.end()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.probes is not None:
            self.probes.close()
        if self.monitor is not None:
            self.monitor.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.on_train_end(trainer, pl_module)

    # -- the monitor -----------------------------------------------------------------------

    def _make_monitor(self, trainer: Any, pl_module: Any) -> None:
        from accuracy.monitor.core import Monitor

        opts = dict(self.monitor_options or {})
        opts_list = list(trainer.optimizers)
        optimizer = opts_list[0] if len(opts_list) == 1 else None
        schedulers = [c.scheduler for c in trainer.lr_scheduler_configs]
        why = ("manual optimization" if not pl_module.automatic_optimization else
               f"{len(opts_list)} optimizers" if len(opts_list) != 1 else None)
        step_fn = None
        if why is None:
            step_fn = self._make_step_fn(trainer, pl_module, optimizer)
        else:
            log.warning("monitor: %s: flagged steps will not be re-run", why)
        sinks = [*opts.pop("sinks", ()), *([_Loggers(trainer)] if trainer.loggers else [])]
        self.monitor = Monitor(pl_module, optimizer, step_fn=step_fn, stateful=schedulers,
                               start_step=int(trainer.global_step), sinks=sinks, **opts)
        acc = trainer.accumulate_grad_batches
        log.info("monitor: a step is one optimizer step (%s), numbered from %d",
                 f"accumulate_grad_batches={acc}: {acc} batches each, the loss their mean"
                 if acc > 1 else "one batch", trainer.global_step)

    def _make_step_fn(self, trainer: Any, pl_module: Any, optimizer: Any) -> Any:
        step_schedulers = [c.scheduler for c in trainer.lr_scheduler_configs
                           if c.interval == "step" and c.frequency == 1]
        scale = trainer.accumulate_grad_batches

        def step_fn(micro_batches: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> Any:
            total = None
            for i, (a, k) in enumerate(micro_batches):
                loss = _loss(pl_module.training_step(*a, **k))
                if i == 0:
                    optimizer.zero_grad()
                if scale > 1:
                    loss = loss / scale
                loss.backward()
                total = loss.detach() if total is None else total + loss.detach()
            clip, algo = trainer.gradient_clip_val, trainer.gradient_clip_algorithm
            if clip:
                if algo == "value":
                    torch.nn.utils.clip_grad_value_(pl_module.parameters(), clip)
                else:
                    torch.nn.utils.clip_grad_norm_(pl_module.parameters(), clip)
            optimizer.step()
            for s in step_schedulers:
                s.step()
            return total

        return step_fn


class _Loggers:
    """The monitor's scalars to the trainer's loggers (`log_metrics` at the trainer's step
    count); trigger events as text where the experiment writes text (TensorBoard's)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if not values:
            return
        for lg in self.trainer.loggers:
            lg.log_metrics(dict(values), step=self.trainer.global_step)

    def text(self, step: int, tag: str, text: str) -> None:
        for lg in self.trainer.loggers:
            exp = getattr(lg, "experiment", None)
            if callable(getattr(exp, "add_text", None)):
                exp.add_text(tag, text, self.trainer.global_step)
