"""Uninitialised memory followed until it is filled (accuracy/dumper/uninit.py): bytes no op
has written are not data, and become data once an op fills them."""

from __future__ import annotations

import torch
from torch import nn

from accuracy.dumper.core import dumper
from accuracy.dumpfile.reader import load_dump


def test_views_of_an_empty_buffer_are_not_data_until_a_copy_fills_them(tmp_path):
    with dumper(tmp_path / "u.h5"):
        buf = torch.empty(8)
        half = buf[:4]
        half.copy_(torch.ones(4))  # fills half of it
        v = buf.view(2, 4)  # still half garbage: not data
        top = half.mul(2)  # the filled half: data
        buf[4:].fill_(3.0)
        w = buf.view(4, 2)  # filled: data
    del v, top, w
    with load_dump(tmp_path / "u.h5") as d:
        views = [r for r in d.records if r.op == "aten.view.default"]
        first, last = views[0], views[-1]
        assert first.extra["uninitialized_io"] == {"input": [0], "output": [0]}
        assert not first.outputs[0].has_data
        assert "uninitialized_io" not in last.extra and last.outputs[0].has_data
        mul = next(r for r in d.records if r.op == "aten.mul.Tensor")
        assert mul.outputs[0].has_data and mul.outputs[0].load().tolist() == [2.0] * 4


def test_a_parameter_filled_by_its_initialiser_is_data(tmp_path):
    """nn.Linear built inside the dump: empty -> Parameter -> uniform_ fills it; a later
    detach of the parameter is data, not uninitialised memory."""
    with dumper(tmp_path / "p.h5"):
        lin = nn.Linear(4, 3)
        lin.weight.detach().clone()
    with load_dump(tmp_path / "p.h5") as d:
        (det, *_) = [r for r in d.records if r.op == "aten.detach.default"
                     and r.inputs[0].has_data and r.inputs[0].shape == (3, 4)]
        assert "uninitialized_io" not in det.extra and det.outputs[0].has_data



def test_what_is_computed_from_unfilled_bytes_is_not_data(tmp_path):
    """A pipeline stage runs its forward once on an `empty_strided` input to learn its output
    shapes: the ops computed from it (and from them) are not data, never judged; the same
    layer on real data is; an in-place op reading unfilled bytes leaves its target unfilled."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 4)
    with dumper(tmp_path / "t.h5"):
        probe = torch.empty_strided((2, 8), (8, 1))
        lin(probe).relu()
        lin(torch.ones(2, 8)).relu()
        acc = torch.ones(4)
        acc.add_(torch.empty(4))
        acc.mul(2)
        # send_object_list's pickle: `empty` then `set_` onto bytes made outside dispatch
        pickle = torch.ByteTensor(torch.ByteStorage._from_buffer(b"\x01\x02\x03"))
        pickle.add(1)
    with load_dump(tmp_path / "t.h5") as d:
        first, second = [r for r in d.records if r.op == "aten.addmm.default"]
        relu1, relu2 = [r for r in d.records if r.op == "aten.relu.default"]
        add = next(r for r in d.records if r.op == "aten.add_.Tensor")
        mul = next(r for r in d.records if r.op == "aten.mul.Tensor")
    for r in (first, relu1, add, mul):
        assert r.extra["uninitialized_io"]["output"] == [0], r.op
        assert not r.outputs[0].has_data
        add1 = next(r for r in d.records if r.op == "aten.add.Tensor")
    for r in (second, relu2, add1):
        assert "uninitialized_io" not in r.extra and r.outputs[0].has_data
