"""A call whose scalar arguments differ from golden's (accuracy/compare/arguments.py) is named
with both values, never passed."""

from __future__ import annotations

import torch
from torch import nn

from accuracy.compare.api import compare
from accuracy.dumper.core import dumper
from accuracy.replay import replay


def _scaled(path, scale: float) -> None:
    torch.manual_seed(0)
    m = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    with dumper(path, overwrite=True):
        (m(x) * scale).tanh().sum()


def test_a_different_scalar_argument_is_reported_with_both_values_never_pass(tmp_path):
    _scaled(tmp_path / "dev.h5", 1.05)
    _scaled(tmp_path / "gold.h5", 1.0)
    replay(tmp_path / "dev.h5", tmp_path / "rp.h5")
    rep = compare(tmp_path / "dev.h5", tmp_path / "gold.h5", tmp_path / "rp.h5")
    (row,) = [r for r in rep.rows if r.op == "aten.mul.Tensor" and r.io == "output"]
    assert row.verdict == "error"
    assert "arguments differ: args[1] my 1.05, golden 1.0" in row.message
    assert rep.summary["culprit"]["op"] == "aten.mul.Tensor"
    # the same scalar: nothing said
    _scaled(tmp_path / "gold2.h5", 1.05)
    rep = compare(tmp_path / "dev.h5", tmp_path / "gold2.h5")
    assert not any("arguments differ" in (r.message or "") for r in rep.rows)

