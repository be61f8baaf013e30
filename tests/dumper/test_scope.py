"""Phases (accuracy/dumper/scope.py): what a user's step does is told apart as forward,
backward and optimizer."""

from __future__ import annotations

import torch
from torch import nn

from accuracy.dumper.core import dumper
from accuracy.dumpfile.reader import load_dump


def _ops(path):
    with load_dump(path) as d:
        return {(r.op, r.seq): r for r in d.records}


def test_gradscaler_unscale_and_update_are_optimizer_phase(tmp_path):
    m = nn.Linear(4, 2)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with dumper(tmp_path / "gs.h5"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = m(torch.randn(3, 4)).float().sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    phases = {op: r.phase for (op, _), r in _ops(tmp_path / "gs.h5").items()}
    assert phases["aten._amp_foreach_non_finite_check_and_unscale_.default"] == "optimizer"
    assert phases["aten._amp_update_scale_.default"] == "optimizer"
    assert phases["aten.addmm.default"] == "forward"

