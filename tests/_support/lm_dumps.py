"""The tiny transformer's training step dumped, as several test modules need it."""

from __future__ import annotations

from pathlib import Path

import torch

from accuracy.device_backend import sim
from accuracy.dumper.core import dumper
from accuracy.examples import lm_batch, lm_step, tiny_lm


def lm_dump(path: Path, seed: int | None = None, **sim_kw) -> Path:
    """One step (batch 2, sequence 16) dumped to `path`; on `sim(**sim_kw)` when given.
    `seed`: the model's weights and torch's generator (other values, same ops)."""
    if seed is not None:
        torch.manual_seed(seed)
    model, batch = tiny_lm(0 if seed is None else seed), lm_batch(batch=2, seq=16)
    if sim_kw:
        with sim(**sim_kw), dumper(path):
            lm_step(model, batch)
    else:
        with dumper(path):
            lm_step(model, batch)
    return path


def faulty_lm_pair(folder: Path) -> tuple[Path, Path]:
    """(device, golden): golden on CPU fp32, device on sim fp16-cube with a layer-norm bias
    fault in encoder layer 1 (its culprit)."""
    with dumper(str(folder / "golden.h5")):
        lm_step(tiny_lm(), lm_batch())
    fault = sim.fault("aten.native_layer_norm.default", module="encoder.layers.1.*",
                      kind="bias", value=0.05)
    with sim(profile="fp16-cube", faults=[fault]), dumper(str(folder / "device.h5")):
        lm_step(tiny_lm(), lm_batch())
    return folder / "device.h5", folder / "golden.h5"


def addmm_fault():
    """The faulty kernel of `addmm_fault_runs`: a 0.05 bias on the first addmm of encoder
    layer 1's linear1."""
    return sim.fault("aten.addmm.default", module="encoder.layers.1.linear1", kind="bias",
                     value=0.05, occurrence=0)


def addmm_fault_runs(folder: Path) -> tuple[Path, dict]:
    """A golden CPU step (`gold.h5`) and the same step on `sim` with `addmm_fault()`
    (`dev.h5`), batch 2, sequence 8: (folder, the batch)."""
    batch = lm_batch(batch=2, seq=8)
    with dumper(folder / "gold.h5"):
        lm_step(tiny_lm(), batch)
    with sim(profile="exact", faults=[addmm_fault()]), dumper(folder / "dev.h5"):
        lm_step(tiny_lm(), batch)
    return folder, batch
