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
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack

from accuracy.monitor.snapshots import State, Store

log = logging.getLogger(__name__)


@dataclass
class Capture:
    """What a capture found. `exact`: the re-run's loss has the flagged loss's bits (None: no
    re-run happened); `culprit`: the op compare named (op, module, phase, source...)."""

    step: int
    reason: str
    folder: str | None = None
    snapshot_step: int | None = None
    flagged_loss: float | None = None
    rerun_loss: float | None = None
    exact: bool | None = None
    culprit: dict[str, Any] | None = None
    reference: str | None = None
    messages: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def format(self) -> str:
        lines = [f"capture of step {self.step}: {self.reason}"]
        lines += [f"  {m}" for m in self.messages]
        if self.culprit:
            c = self.culprit
            lines.append(f"  CULPRIT: {c.get('op')} in {c.get('module') or '-'} "
                         f"[{c.get('phase')}] at {c.get('source') or '?'}")
        if self.folder:
            lines.append(f"  files: {self.folder}")
        return "\n".join(lines)


def loss_value(loss: Any) -> float:
    """The loss as a Python float (a tensor's value, read without any dispatch mode; a
    DTensor loss, as tensor parallel's `loss_parallel` gives, through its own dispatch)."""
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
        with dumper(dump_path=device, mode="tensor", overwrite=True):
            loss = _call(step_fn, store.batches[step][0])  # type: ignore[index]
        cap.rerun_loss = loss_value(loss)
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
            with _disable_current_modes(), dumper(dump_path=ref, mode="tensor", overwrite=True):
                _call(step_fn, store.batches[step][0])  # type: ignore[index]
            golden = ref
        else:
            cap.reference = "none (no emulated device): local errors from the replay only"
            golden = device
        replay(device, rep, on="cpu", overwrite=True)
        report = compare(device, golden, replay=rep)
        report.write(folder / "report")
        cap.culprit = _short(report.summary.get("culprit"))
        if not math.isfinite(cap.rerun_loss):
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


def _overflow_birth(cap: Capture, device: Path, verdict: str | None) -> None:
    """A non-finite loss: name the op where inf/nan was born (`accuracy overflow`'s scan). On
    plain torch the replay finds every kernel honest, so without this the capture of a NaN
    step would name nothing; the birth becomes the culprit where compare named none."""
    from accuracy.overflow.scan import scan

    births = scan(device).culprits
    if not births:
        cap.messages.append("the loss is non-finite but no op of the re-run turned finite "
                            "inputs into inf/nan (they came in with the batch or the state)")
        return
    b = births[0]
    where = f"{b.op} in {b.module or '-'} [{b.phase}] at {b.source or '?'} (seq {b.seq})"
    honest = "; every kernel matched its reference, so the values overflowed, not a kernel" \
        if verdict == "pass" else ""
    cap.messages.append(f"inf/nan born at {where}, from finite inputs{honest} "
                        "(`accuracy overflow device.h5` lists every birth)")
    if not cap.culprit:
        cap.culprit = {"op": b.op, "module": b.module, "phase": b.phase, "source": b.source,
                       "seq": b.seq, "verdict": "overflow birth", "outputs": b.outputs}


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
