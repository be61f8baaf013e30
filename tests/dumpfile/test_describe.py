"""`accuracy info`: what a dump holds, said in the lines a user reads first."""

from __future__ import annotations

import torch
from torch import nn

from accuracy import dumper, load_dump
from accuracy.dumpfile.describe import describe


def _step(path, **kw) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    with dumper(str(path), **kw):
        model(x).square().sum().backward()


def test_a_load_mode_dump_says_its_ops_ran_on_golden_inputs(tmp_path):
    """A load-mode dump's ops computed on another run's inputs: read as a plain run of the
    device, its figures mislead; `info` of one looked like any other dump."""
    gold, fed = tmp_path / "gold.h5", tmp_path / "fed.h5"
    _step(gold)
    _step(fed, load_file_path=str(gold))
    with load_dump(fed) as d:
        loaded = d.attrs["ops_loaded"]
    assert loaded > 0
    text = describe(fed).format()
    assert f"load mode: {loaded} ops computed on the golden inputs of {gold}" in text
    assert "load mode" not in describe(gold).format()
