"""`Monitor`: figures over steps, triggers, snapshots and capture, behind step hooks.

One added call in a training loop:

    train_step = accuracy.monitor.watch(train_step, model, optimizer, path="run.monitor.h5")
    for batch in data:
        loss = train_step(batch)      # unchanged

`watch` returns the step wrapped: before it, a snapshot when due and the batch kept; around it,
the figures; after it, the triggers and, when one fires, the capture of that step (re-run from
the snapshot with the dumper on, replayed and compared) written beside the series. A driver
that owns the loop (a Trainer callback) calls `begin_step()` / `end_step(loss)` instead.
Nothing here ever stops the user's training: our failures are logged and recorded as events.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accuracy.dumper.compiled import standing
from accuracy.errors import UsageError
from accuracy.monitor.capture import Capture, capture_step, loss_value
from accuracy.monitor.figures import Collector
from accuracy.monitor.resume import continue_run, restore_triggers
from accuracy.monitor.series import SeriesWriter
from accuracy.monitor.sinks import TensorBoard, scalars_of
from accuracy.monitor.snapshots import Store, parse_bytes
from accuracy.monitor.triggers import StepFigures, Trigger, resolve
from accuracy.native import fastpath

log = logging.getLogger(__name__)


def _flag_device() -> torch.device:
    """Where the default process group takes a collective's tensor: CPU for gloo, the
    accelerator for NCCL and its kind."""
    from torch import distributed as dist

    try:
        return torch.device(dist.distributed_c10d._get_object_coll_device())
    except Exception:  # noqa: BLE001 - a private helper that may move: gloo's CPU then
        return torch.device("cpu")


def _rank() -> tuple[int, int]:
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Monitor:
    """Per-step figures of `model` (and `optimizer`), written to `path` (HDF5, one per rank:
    a `{rank}` in the path expands).

    freq: record figures every `freq` steps (the loss and loss triggers see every step).
    detail_every: on every `detail_every`-th recorded step (steps 0, 10, 20... by default),
        also the parameters' norms, the update ratios and the optimizer state's norms; on the
        others they are not measured (NaN). 1: every recorded step. The loss, the global
        gradient norm, every gradient's and every module output's figures are on every
        recorded step.
    modules: glob patterns of the modules whose outputs are measured (default all).
    triggers: 'default' (non-finite, loss spike, gradient-norm jump), None, or a list of
        `Trigger`s / callables `fn(StepFigures) -> bool | str`.
    snapshot_every: keep the state to re-run a step every K steps (None: no capture).
    snapshot_budget: bytes (or '2GB') the snapshots and kept batches may use in memory; a budget
        too small for one snapshot is refused with the size needed.
    capture_dir: where captures go (default: `<path without .h5>.captures/`).
    reduce: with torch.distributed, rank 0 writes figures reduced across ranks (norms
        combined as L2, min/max, counts summed, loss averaged) and the other ranks write none.
    flush_every, flush_seconds: rows are written to the file in batches, when `flush_every`
        rows wait or the oldest has waited `flush_seconds` (None: no time limit), at once on
        a trigger, and at close, exit, an exception in a watched step and SIGTERM; kill -9
        loses the rows waiting then. `flush_every=1`: every row at once.
    stateful: more objects a step reads the state of (an LR scheduler, a GradScaler): kept in
        snapshots through their state_dict()/load_state_dict().
    start_step: the first step's number. A job resumed from a checkpoint at step N passes N:
        its rows continue the run's series (in a segment beside the earlier file, joined by
        `read_series`) and the triggers' history is restored from the earlier rows.
    sinks: more writers of the scalars (objects with `scalars(step, values)` and
        `text(step, tag, text)`: see accuracy.monitor.sinks).
    tensorboard: a `SummaryWriter`, or a folder to open one in: the loss, the gradient norm,
        the figures the triggers read, and trigger events as text.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 path: str | os.PathLike[str] = "run.monitor.h5", *, freq: int = 1,
                 modules: str | Iterable[str] = "*",
                 triggers: str | Iterable[Trigger | Callable[..., Any]] | None = "default",
                 snapshot_every: int | None = 10, snapshot_budget: int | str | None = None,
                 capture_dir: str | os.PathLike[str] | None = None, reduce: bool = False,
                 detail_every: int = 10, flush_every: int = 50,
                 flush_seconds: float | None = 1.0, overwrite: bool = False,
                 step_fn: Callable[..., Any] | None = None,
                 stateful: Iterable[Any] = (), start_step: int = 0,
                 sinks: Iterable[Any] = (), tensorboard: Any = None) -> None:
        if not isinstance(model, nn.Module):
            raise UsageError(f"Monitor needs an nn.Module, got {type(model).__name__}")
        if not isinstance(freq, int) or freq < 1:
            raise UsageError(f"freq must be an int >= 1, got {freq!r}")
        for name, v in (("detail_every", detail_every), ("flush_every", flush_every)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(f"{name} must be an int >= 1, got {v!r}")
        if flush_seconds is not None and (isinstance(flush_seconds, bool) or not isinstance(
                flush_seconds, int | float) or not flush_seconds >= 0):
            raise UsageError(f"flush_seconds must be a number >= 0 or None, got "
                             f"{flush_seconds!r}")
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise UsageError(f"start_step must be an int >= 0, got {start_step!r}")
        self.rank, self.world_size = _rank()
        self.path = Path(str(path).replace("{rank}", str(self.rank)))
        self.model, self.optimizer, self.freq, self.reduce = model, optimizer, freq, reduce
        self.detail_every = detail_every
        self.triggers = resolve(triggers)
        self.step_fn = step_fn
        self.store: Store | None = None
        if snapshot_every is not None:
            self.store = Store(int(snapshot_every), parse_bytes(snapshot_budget),
                               tuple(stateful))
            self.snapshot_bytes = self.store.check_budget(model, optimizer)
        stem = self.path.name[:-3] if self.path.name.endswith(".h5") else self.path.name
        self.capture_dir = Path(capture_dir) if capture_dir is not None else \
            self.path.with_name(stem + ".captures")
        fastpath.load_in_background()  # the figures' C++ path, once built (reductions.py)
        self.collector = Collector(model, optimizer, modules)
        writes = not (reduce and self.world_size > 1 and self.rank != 0)
        self.fired: list[tuple[int, str]] = []
        self.writer: SeriesWriter | None = None
        if writes:
            run = continue_run(self.path, start_step, overwrite)
            if run.earlier is not None:
                self.fired = restore_triggers(self.triggers, run.earlier, start_step, freq)
                self._captured_earlier = any(
                    e.get("kind") == "capture" and isinstance(e.get("step"), int)
                    and e["step"] < start_step for e in run.earlier.events)
                log.info("monitor: resumed at step %d: writing %s after %d earlier rows of %s",
                         start_step, run.path.name, int((run.earlier.step < start_step).sum()),
                         self.path.name)
            self.writer = SeriesWriter(run.path, flush_every=flush_every,
                                       flush_seconds=flush_seconds, overwrite=overwrite,
                                       attrs={"rank": self.rank, "world_size": self.world_size,
                                              "freq": freq, "detail_every": detail_every,
                                              "reduced": bool(reduce),
                                              "model": type(model).__name__, **run.attrs})
        self.sinks = [*sinks, *([TensorBoard(tensorboard)] if tensorboard is not None else [])]
        self._sink_figures = sorted({f for t in self.triggers for f in t.figures if "/" in f})
        self.current_step = start_step  # the next step's number (a probe's counter)
        self.captures: list[Capture] = []
        self._batch: Any = None
        self._in_step = False
        self._capturing = False
        self._said_compiled: set[int] = set()
        self._finalizer = weakref.finalize(self, _close_writer, self.writer, self.sinks)
        if self.writer is not None:
            log.info("monitor: %s", self.plan(flush_every, flush_seconds))

    def plan(self, flush_every: int, flush_seconds: float | None) -> str:
        """The one line said at the start: what is measured when, and what a kill loses."""
        every = "step" if self.freq == 1 else f"{self.freq} steps"
        detail = ("every recorded step also" if self.detail_every == 1 else
                  f"every {self.freq * self.detail_every} steps also")
        tail = "" if self.detail_every == 1 else " (detail_every=1: every step)"
        if flush_every == 1:
            rows = "rows written each at once"
        else:
            limit = f" or {flush_seconds:g} s" if flush_seconds is not None else ""
            rows = (f"rows written in batches ({flush_every} rows{limit}), at once on a "
                    "trigger, and on exit or SIGTERM: kill -9 loses the rows waiting")
        snaps = (f"snapshots every {self.store.every} steps" if self.store is not None
                 else "no snapshots (no capture)")
        return (f"writing {self.path.name}: every {every} the loss, the global gradient norm "
                f"and the figures of {len(self.collector.module_names)} modules' outputs and "
                f"{len(self.collector.params)} gradients; {detail} the parameter norms, update "
                f"ratios and optimizer state{tail}; {rows}; {snaps}")

    # -- step hooks -----------------------------------------------------------------------

    def begin_step(self, *args: Any, **kwargs: Any) -> None:
        """Call before the step runs, with the step's batch (the arguments the step function
        will be called with) if the step can be re-run; without them, captures say the step
        cannot be re-run exactly."""
        if self._capturing:
            return
        self._in_step = True
        try:
            batch = (args, kwargs) if (args or kwargs) else None
            if self.store is not None:
                # a program compiled from now on is recorded as it runs when a flagged step
                # is captured, not recompiled there (accuracy/dumper/compiled/standing.py)
                standing.ensure()
                self.store.before_step(self.current_step, self.model, self.optimizer, batch)
                if self.store.disabled and not getattr(self, "_said_disabled", False):
                    self._said_disabled = True
                    self._event("snapshots-stopped", message=self.store.disabled)
            if self.current_step % self.freq == 0:
                self.collector.start(
                    detail=(self.current_step // self.freq) % self.detail_every == 0)
        except Exception:
            log.exception("monitor: begin_step failed (training goes on)")

    def set_batch(self, *args: Any, **kwargs: Any) -> None:
        """The current step's batch, when it is known only after `begin_step` (a driver that
        sees the inputs inside the step)."""
        if self._capturing or self.store is None or not self._in_step:
            return
        try:
            self.store.set_batch(self.current_step, (args, kwargs))
        except Exception:
            log.exception("monitor: keeping the batch failed (training goes on)")

    def add_micro_batch(self, *args: Any, **kwargs: Any) -> None:
        """One more micro-batch of the current step (gradient accumulation): the step's kept
        batch is the list of its micro-batches' `(args, kwargs)`, so the step function of a
        re-run is called as `step_fn(micro_batches)` and runs them all."""
        if self._capturing or self.store is None or not self._in_step:
            return
        try:
            self.store.add_part(self.current_step, (args, kwargs))
        except Exception:
            log.exception("monitor: keeping the micro-batch failed (training goes on)")

    def end_step(self, loss: Any = None, micro_steps: int = 1) -> list[str]:
        """Call after the step (forward, backward, optimizer step) with its loss. With gradient
        accumulation a step is one optimizer step: `loss` is the whole step's (as the framework
        logs it) and `micro_steps` the micro-batches it accumulated. Returns the reasons of the
        triggers that fired on this step."""
        if self._capturing:
            return []
        step = self.current_step
        self.current_step += 1
        self._in_step = False
        reasons: list[str] = []
        try:
            value = loss_value(loss) if loss is not None else math.nan
            figs = self.collector.collect() if self.collector.recording else None
            grad_norm = figs["grad_norm"] if figs else math.nan
            if figs is not None:
                figs = self._reduce(figs, value) if self.reduce and self.world_size > 1 else figs
                if figs is not None and self.writer is not None:
                    self.writer.append({
                        "step": step, "loss": figs.get("loss", value),
                        "grad_norm": figs["grad_norm"], "micro_steps": micro_steps,
                        "module_names": self.collector.module_names,
                        "param_names": self.collector.param_names,
                        "module": figs["module"], "param": figs["param"],
                        "state": figs["state"]})
            changed = getattr(self.collector, "unmeasured", None)  # None: another Collector
            if changed:
                self.collector.unmeasured = set()
                names = [self.collector.module_names[i] for i in sorted(changed)]
                msg = (f"the outputs of {len(names)} module(s) were changed in place after the "
                       f"module returned, before their figures were taken: not measured at "
                       f"step {step} (NaN), measured as they return from now on: "
                       f"{', '.join(names[:10])}")
                log.warning("monitor: %s", msg)
                self._event("not-measured", step=step, message=msg, modules=names)
            blind = self.collector.compiled_modules - self._said_compiled
            if blind:
                self._said_compiled |= blind
                names = [self.collector.module_names[i] for i in sorted(blind)]
                msg = (f"{len(names)} module(s) run inside torch.compile are not measured (their "
                       f"outputs are never materialised one by one): {', '.join(names[:10])}")
                log.warning("monitor: %s", msg)
                self._event("not-measured", step=step, message=msg, modules=names)
            s = StepFigures(step, value, grad_norm, figs, loss_known=loss is not None,
                            grad_known=bool(figs is None or figs.get("grads", 1)))
            if self.sinks and self.writer is not None:
                self._send(step, value, grad_norm, figs)
            for t in self.triggers:
                try:
                    why = t.check(s)
                except Exception as exc:
                    log.exception("monitor: trigger %s failed", t.name)
                    why = None
                    self._event("trigger-error", step=step, trigger=t.name, message=str(exc))
                if why:
                    reasons.append(f"{t.name}: {why}")
            if self.world_size > 1 and self.store is not None:
                reasons = self._agree(step, reasons)
            if reasons:
                self._fired(step, value, reasons)
        except Exception:
            log.exception("monitor: end_step failed (training goes on)")
        return reasons

    def _send(self, step: int, loss: float, grad_norm: float, figs: dict[str, Any] | None
              ) -> None:
        values = scalars_of(loss, grad_norm, figs, self._sink_figures,
                            self.collector.module_names, self.collector.param_names)
        for sink in self.sinks:
            try:
                sink.scalars(step, values)
            except Exception as e:  # noqa: BLE001 - a logger's failure is not the training's
                self._sink_failed(sink, e)

    def _text(self, step: int, tag: str, text: str) -> None:
        if self.writer is None:
            return
        for sink in self.sinks:
            try:
                sink.text(step, tag, text)
            except Exception as e:  # noqa: BLE001
                self._sink_failed(sink, e)

    def _sink_failed(self, sink: Any, e: Exception) -> None:
        said = self.__dict__.setdefault("_sinks_said", set())
        if id(sink) not in said:
            said.add(id(sink))
            log.error("monitor: writing to %s failed (%s); the monitor's file is unaffected",
                      type(sink).__name__, e)

    def wrap(self, step_fn: Callable[..., Any]) -> Callable[..., Any]:
        """The step function with the monitor around it (see `watch`)."""
        self.step_fn = step_fn

        def monitored(*args: Any, **kwargs: Any) -> Any:
            self.begin_step(*args, **kwargs)
            try:
                loss = step_fn(*args, **kwargs)
            except BaseException:
                self.flush()  # the rows before the failed step reach the file
                raise
            self.end_step(loss)
            return loss

        monitored.monitor = self  # type: ignore[attr-defined]
        monitored.__wrapped__ = step_fn  # type: ignore[attr-defined]
        return monitored

    # -- a probe, as PrecisionDebugger is (callbacks drive start/stop/step) ------------------

    def start(self, model: Any = None) -> None:
        """A probe's step opens: `begin_step()` without the batch (a flagged step is then
        reported as not re-runnable; `watch` or `set_batch` keep it). `model` is ignored: the
        monitor measures the model it was made with."""
        self.begin_step()

    def stop(self) -> None:
        """A probe's region closes; the figures are taken at `step()`."""

    def step(self, loss: Any = None) -> list[str]:
        """A probe's step ends: `end_step(loss)`. Without a loss (a driver that does not know
        it), loss triggers stay quiet and gradient triggers still run."""
        return self.end_step(loss)

    # -- triggers and capture -------------------------------------------------------------

    def flush(self) -> None:
        """Write the rows waiting in memory (training goes on whatever happens)."""
        if self.writer is not None:
            try:
                self.writer.flush()
            except Exception:
                log.exception("monitor: writing the waiting rows failed")

    def _fired(self, step: int, loss: float, reasons: list[str]) -> None:
        reason = "; ".join(reasons)
        self._event("trigger", step=step, loss=loss, reasons=reasons)
        self.flush()  # the flagged row and its event reach the file before the capture runs
        self._text(step, "monitor/trigger", f"step {step}: {reason}")
        first = not self.fired
        self.fired.append((step, reason))
        # after the second, flags go to the file's events and to INFO: a run that stays NaN
        # would print one warning per step for the rest of training
        log.log(logging.WARNING if len(self.fired) <= 2 else logging.INFO,
                "monitor: step %d flagged: %s", step, reason)
        if not first:
            if len(self.fired) == 2:
                done = (f"captured once, step {self.fired[0][0]}"
                        if self.captures or getattr(self, "_captured_earlier", False) else
                        f"step {self.fired[0][0]} was not captured")
                msg = (f"triggers fired again at step {step} (and may on every step): {done}; "
                       "later steps are recorded as events only (logged at INFO)")
                log.warning("monitor: %s", msg)
                self._event("capture-once", step=step, message=msg)
            return
        if self.store is None or self.step_fn is None:
            why = ("snapshots are off (snapshot_every=None)" if self.store is None else
                   "the monitor has no step function to re-run (use watch() or step_fn=)")
            self._event("not-captured", step=step, message=why)
            log.warning("monitor: step %d not captured: %s", step, why)
            return
        self._capturing = True
        try:
            cap = capture_step(self.step_fn, self.model, self.optimizer, self.store, step,
                               reason, loss, self.capture_dir)
        finally:
            self._capturing = False
        self.captures.append(cap)
        self._event("capture", step=step, exact=cap.exact, folder=cap.folder,
                    culprit=cap.culprit, messages=cap.messages)
        self._text(step, "monitor/capture", cap.format())
        log.warning("monitor: %s", cap.format())

    def _event(self, kind: str, step: int | None = None, **info: Any) -> None:
        if self.writer is not None:
            try:
                self.writer.event(kind, self.current_step if step is None else step, **info)
            except Exception:
                log.exception("monitor: writing an event failed")

    # -- ranks ----------------------------------------------------------------------------

    def _agree(self, step: int, reasons: list[str]) -> list[str]:
        """Whether any rank's triggers fired on `step` (collective: every rank calls it each
        step). A capture re-runs steps, and their collectives pair with whatever the other
        ranks run: a rank capturing alone corrupted its neighbour's live steps with its
        re-runs' all-reduces, then died when the neighbour exited. So all capture, or none."""
        from torch import distributed as dist

        flag = torch.tensor([1.0 if reasons else 0.0], device=_flag_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if reasons or not flag.item():
            return reasons
        return [f"another rank: its triggers fired at step {step}, so every rank captures it "
                "(a re-run's collectives must pair across ranks)"]

    def _reduce(self, figs: dict[str, Any], loss: float) -> dict[str, Any] | None:
        """All ranks' figures reduced (collective: every rank calls it each recorded step)."""
        import numpy as np
        from torch import distributed as dist

        parts = [("module", k, len(v)) for k, v in figs["module"].items()]
        parts += [("param", k, len(v)) for k, v in figs["param"].items()]
        flat = [x for kind, k, _ in parts for x in figs[kind][k]] + [figs["grad_norm"], loss]
        mine = torch.tensor(flat, dtype=torch.float64)
        gathered = [torch.zeros_like(mine) for _ in range(self.world_size)]
        dist.all_gather(gathered, mine)
        allr = torch.stack(gathered).numpy()
        out: dict[str, Any] = {"module": {}, "param": {}, "state": figs["state"]}
        at = sum(n for _, _, n in parts)
        # a column no rank measured (every N steps' figures, a parameter without a gradient)
        # stays NaN, unsaid: numpy warns on every such column
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            self._reduce_parts(parts, allr, out)
            out["grad_norm"] = float(np.nanmax(allr[:, at]))
            out["loss"] = float(np.nanmean(allr[:, at + 1]))
        return out if self.rank == 0 else None

    @staticmethod
    def _reduce_parts(parts: list[tuple[str, str, int]], allr: Any, out: dict[str, Any]
                      ) -> None:
        import numpy as np

        at = 0
        for kind, k, n in parts:
            block = allr[:, at:at + n]
            at += n
            if k.endswith("_min"):
                red = np.nanmin(block, axis=0) if block.size else block[0]
            elif k.endswith("_max"):
                red = np.nanmax(block, axis=0) if block.size else block[0]
            elif k.endswith(("_nan", "_inf")):
                red = np.nansum(block, axis=0)
            elif k == "act_norm":  # each rank's own data: the L2 norm over all of it
                red = np.sqrt(np.nansum(block ** 2, axis=0))
            else:  # parameters, their gradients (all-reduced), updates: replicated, so the
                # largest shows a rank that strays
                red = np.nanmax(block, axis=0)
            # nansum of a column no rank measured is 0: it stays "not measured" (NaN)
            red = np.where(np.isnan(block).all(axis=0), np.nan, red)
            out[kind][k] = red.tolist()

    def close(self) -> None:
        """Flush and mark the series complete (also done at exit)."""
        self.collector.close()
        self._finalizer()


def _close_writer(writer: SeriesWriter | None, sinks: Iterable[Any] = ()) -> None:
    if writer is not None:
        try:
            writer.close()
        except Exception:
            log.exception("monitor: closing the series failed")
    for sink in sinks:
        close = getattr(sink, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                log.exception("monitor: closing %s failed", type(sink).__name__)


def watch(step_fn: Callable[..., Any], model: nn.Module,
          optimizer: torch.optim.Optimizer | None = None, **options: Any) -> Callable[..., Any]:
    """Wrap a training step `step_fn(*batch) -> loss` (forward, backward, optimizer step) with a
    `Monitor(model, optimizer, **options)`; the monitor is the wrapper's `.monitor`."""
    return Monitor(model, optimizer, **options).wrap(step_fn)
