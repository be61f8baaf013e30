"""Capture of a flagged step: re-run it from the latest snapshot with the dumper on, check the
re-run is the same step (bit-exact loss), replay and compare it, and name the culprit.

Files, in `<capture_dir>/step_<N>/`: `device.h5` (the re-run, tensor dump), `reference.h5`
(the same step from the same state with every Python dispatch mode off: plain CPU, no `sim`;
without such a mode, the device dump stands in and only local errors, from the replay, count),
`replay.h5`, `report/` (compare's report), `capture.json` and `capture.txt` (this summary).
"""

from __future__ import annotations

import json
import logging
import math
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack

from accuracy.dumper.collectives import local_tensor
from accuracy.monitor.snapshots import State, Store
from accuracy.monitor.triggers import NonFinite

if TYPE_CHECKING:
    from accuracy.dumper import dumper
    from accuracy.overflow.scan import OverflowReport

log = logging.getLogger(__name__)

# The verdict of a capture whose first inf/nan came out of a collective from finite inputs:
# another rank's values (or the reduction's own overflow), not an op of this rank.
THROUGH_COLLECTIVE = "through a collective"


@dataclass
class Capture:
    """What a capture found. `exact`: the re-run's loss has the flagged loss's bits (None: no
    re-run happened); `rerun_grads_finite`: the re-run's gradients were all finite (a NaN only
    the gradients carry leaves the loss finite); `culprit`: the op compare named (op, module,
    phase, source...), or where inf/nan was born."""

    step: int
    reason: str
    folder: str | None = None
    snapshot_step: int | None = None
    flagged_loss: float | None = None
    rerun_loss: float | None = None
    exact: bool | None = None
    rerun_grads_finite: bool | None = None
    culprit: dict[str, Any] | None = None
    reference: str | None = None
    messages: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def format(self) -> str:
        lines = [f"capture of step {self.step}: {self.reason}"]
        lines += [f"  {m}" for m in self.messages]
        if self.culprit:
            c = self.culprit
            where = (f"{c.get('op')} in {c.get('module') or '-'} [{c.get('phase')}] at "
                     f"{c.get('source') or '?'}")
            if c.get("verdict") == THROUGH_COLLECTIVE:  # not this rank's op: say whose it is
                lines.append(f"  THROUGH A COLLECTIVE: inf/nan from another rank (or the "
                             f"reduction's own overflow) at {where}; look at the other ranks' "
                             "captures")
            else:
                lines.append(f"  CULPRIT: {where}")
        if self.folder:
            lines.append(f"  files: {self.folder}")
        return "\n".join(lines)


def loss_value(loss: Any) -> float:
    """The loss as a Python float (a tensor's value, read without any dispatch mode; a
    DTensor loss, as tensor parallel's `loss_parallel` gives, through its own dispatch)."""
    if type(loss) is torch.Tensor and not torch._C._len_torch_dispatch_stack():
        # the common case: a plain tensor, no mode to hide from (a context costs more than
        # the read)
        return float(loss.item()) if loss.numel() == 1 else math.nan
    if isinstance(loss, torch.Tensor):
        with _disable_current_modes():
            return float(loss.detach().float().item()) if loss.numel() == 1 else math.nan
    if isinstance(loss, int | float):
        return float(loss)
    return math.nan


def same_bits(a: float, b: float) -> bool:
    """Bit-for-bit equality of two losses (two NaNs count as the same: their payload is not
    the loss)."""
    if math.isnan(a) and math.isnan(b):
        return True
    return struct.pack("<d", a) == struct.pack("<d", b)


def _call(fn: Callable[..., Any], batch: Any) -> Any:
    args, kwargs = batch
    return fn(*args, **kwargs)


def _foreign_modes() -> list[str]:
    return [type(m).__name__ for m in _get_current_dispatch_mode_stack()
            if not type(m).__module__.startswith("accuracy.dumper")]


def capture_step(step_fn: Callable[..., Any], model: nn.Module,
                 optimizer: torch.optim.Optimizer | None, store: Store, step: int, reason: str,
                 flagged_loss: float, out_dir: Path) -> Capture:
    """Re-run `step` from the latest snapshot, dump it, check it, replay, compare, report."""
    from accuracy.compare import compare
    from accuracy.dumper import dumper
    from accuracy.replay import replay

    t0 = time.perf_counter()
    cap = Capture(step=step, reason=reason, flagged_loss=flagged_loss)
    snap = store.latest_before(step)
    if store.disabled:
        cap.messages.append(f"not captured: {store.disabled}")
        return cap
    if snap is None:
        cap.messages.append(f"not captured: no snapshot at or before step {step} (snapshots "
                            f"every {store.every} steps, within the budget)")
        return cap
    missing = [s for s in range(snap.step, step + 1) if store.batches.get(s) is None]
    if missing:
        cap.messages.append(
            f"step {step} cannot be re-run exactly: the step function was called without its "
            f"batch at step(s) {missing[:5]} (data read inside the step, e.g. from a data "
            "loader, has no state we can restore); pass the batch as the step's argument")
        return cap
    folder = out_dir / f"step_{step}"
    folder.mkdir(parents=True, exist_ok=True)
    cap.folder, cap.snapshot_step = str(folder), snap.step
    device, ref, rep = folder / "device.h5", folder / "reference.h5", folder / "replay.h5"
    extra = store.stateful
    now = State.take(step + 1, model, optimizer, extra)
    try:
        snap.restore(model, optimizer, extra)
        for s in range(snap.step, step):
            _call(step_fn, store.batches[s][0])  # type: ignore[index]
        at_step = State.take(step, model, optimizer, extra)
        with _at_step(dumper(dump_path=device, mode="tensor", overwrite=True), step):
            loss = _call(step_fn, store.batches[step][0])  # type: ignore[index]
        cap.rerun_loss = loss_value(loss)
        cap.rerun_grads_finite = _grads_finite(model)  # the re-run's, not the reference's
        cap.exact = same_bits(cap.rerun_loss, flagged_loss)
        if cap.exact:
            cap.messages.append(f"re-run from the snapshot of step {snap.step} reproduces the "
                                f"flagged loss bit for bit ({flagged_loss!r})")
        else:
            cap.messages.append(
                f"NOT THE SAME STEP: the re-run from the snapshot of step {snap.step} gave loss "
                f"{cap.rerun_loss!r}, the flagged step had {flagged_loss!r}; the step is not "
                "reproducible (a generator we do not see, a data loader without state, "
                "non-deterministic kernels, or state outside the model and optimizer that the "
                "step reads, such as a step counter: pass it as an argument of the step, or an "
                "object with a state_dict() in stateful=): the dump below is of the re-run, not of "
                "the flagged step")
        modes = _foreign_modes()
        at_step.restore(model, optimizer, extra)
        if modes:
            cap.reference = f"the same step with {', '.join(modes)} off (plain torch)"
            with _disable_current_modes(), _at_step(
                    dumper(dump_path=ref, mode="tensor", overwrite=True), step):
                _call(step_fn, store.batches[step][0])  # type: ignore[index]
            golden = ref
        else:
            cap.reference = "none (no emulated device): local errors from the replay only"
            golden = device
        replay(device, rep, on="cpu", overwrite=True)
        report = compare(device, golden, replay=rep)
        report.write(folder / "report")
        cap.culprit = _short(report.summary.get("culprit"))
        if non_finite(cap):
            _overflow_birth(cap, device, report.summary.get("verdict"))
        if not cap.culprit:
            first = report.summary.get("first_divergence")
            cap.messages.append("no culprit found" + (
                f"; first divergence: {first.get('op')} in {first.get('module') or '-'}"
                if first else ""))
    except Exception as exc:  # the user's training goes on; the capture says what failed
        log.exception("monitor: capture of step %d failed", step)
        cap.messages.append(f"capture failed: {type(exc).__name__}: {exc}")
    finally:
        now.restore(model, optimizer, extra)
        cap.seconds = time.perf_counter() - t0
        _write(cap, folder)
    return cap


def _grads_finite(model: nn.Module) -> bool:
    """Whether the gradients the re-run left are all finite (None or zeroed: nothing to see).
    A NaN that only the gradients carry (a backward overflow, another rank's values through
    DDP's all-reduce) leaves the loss finite. Read with dispatch off, as the figures are: this
    rank's shard of a DTensor."""
    with _disable_current_modes(), torch.no_grad():
        ok: dict[torch.device, list[torch.Tensor]] = {}
        for p in model.parameters():
            g = p.grad
            lg = g if g is None or type(g) is torch.Tensor else local_tensor(g)
            if lg is not None and lg.is_floating_point() and lg.numel():
                ok.setdefault(lg.device, []).append(lg.detach().isfinite().all())
        return all(bool(torch.stack(flags).all()) for flags in ok.values())  # one read a device


def _at_step(d: dumper, step: int) -> dumper:
    """`d` recording its ops as step `step`, the training step it re-runs (not 0)."""
    d.current_step = step
    return d


def non_finite(cap: Capture) -> str:
    """What of the captured step is non-finite ('' for nothing), which is when the capture
    scans its dump for overflow births: the re-run's loss or gradients, or the flag itself
    (`NonFinite` fired: the step may zero its gradients after the optimizer step). A NaN only
    the gradients carry (a backward overflow, another rank's through DDP's all-reduce) leaves
    the loss finite."""
    if cap.rerun_loss is not None and not math.isfinite(cap.rerun_loss):
        return "the loss is"
    if cap.rerun_grads_finite is False:
        return "the gradients are"
    if any(r.startswith(f"{NonFinite.name}: ") for r in cap.reason.split("; ")):
        return "the flagged step was"
    return ""


def _overflow_birth(cap: Capture, device: Path, verdict: str | None) -> None:
    """A non-finite step: scan the re-run's dump as `accuracy overflow` does and say where
    inf/nan was born (`name_birth`)."""
    from accuracy.overflow.scan import scan

    name_birth(cap, scan(device), verdict)


def name_birth(cap: Capture, report: OverflowReport, verdict: str | None) -> None:
    """Name the op where the non-finite step's inf/nan was born (`report`: the overflow scan
    of its dump; `verdict`: compare's). On plain torch the replay finds every kernel honest, so
    without this the capture of a NaN step would name nothing; the birth becomes the culprit
    where compare named none. A birth in a collective is another rank's inf/nan (or the
    reduction's own overflow), not this rank's op: said so, so that a healthy rank's capture
    sends the user to the other ranks' captures instead of saying 'no culprit found'."""
    from accuracy.aten import FROM_COLLECTIVE

    births = report.culprits
    if not births:
        cap.messages.append(f"{non_finite(cap) or 'the step is'} non-finite but no op of the "
                            "re-run turned finite inputs into inf/nan (they came in with the "
                            "batch or the state)")
        return
    b = births[0]
    where = f"{b.op} in {b.module or '-'} [{b.phase}] at {b.source or '?'} (seq {b.seq})"
    every = "(`accuracy overflow device.h5` lists every birth)"
    if b.label == FROM_COLLECTIVE:
        cap.messages.append(
            f"inf/nan arrived through a collective at {where}: this rank's inputs to it were "
            "finite, so another rank sent inf/nan (or the reduction itself overflowed), not an "
            f"op of this rank; look at the other ranks' captures {every}")
        verdict_here = THROUGH_COLLECTIVE
    else:
        honest = ("; every kernel matched its reference, so the values overflowed, not a kernel"
                  if verdict == "pass" else "")
        cap.messages.append(f"inf/nan born at {where}, from finite inputs{honest} {every}")
        verdict_here = "overflow birth"
    if not cap.culprit:
        cap.culprit = {"op": b.op, "module": b.module, "phase": b.phase, "source": b.source,
                       "seq": b.seq, "verdict": verdict_here, "outputs": b.outputs}


def _short(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if not row:
        return None
    keys = ("op", "module", "phase", "source", "my_address", "verdict", "local_error_ratio",
            "cosine", "max_abs_err")
    return {k: row.get(k) for k in keys if k in row}


def _write(cap: Capture, folder: Path) -> None:
    try:
        (folder / "capture.json").write_text(json.dumps(asdict(cap), indent=2, default=str))
        (folder / "capture.txt").write_text(cap.format() + "\n")
    except OSError:
        log.exception("monitor: writing the capture summary failed")
