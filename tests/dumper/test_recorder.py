"""What an `out=` buffer held before the call is no input of the op: Inductor's extern kernels
(`extern_kernels.addmm(..., out=buf)`) write into buffers it allocated outside the dispatcher,
holding whatever memory held. Two compiled runs (device against CPU) compared those garbage
values as differing inputs: warnings on every extern matmul of a clean pair of runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accuracy import dumper, load_dump
from accuracy.compare import compare
from tests._support.miscompile import inductor_cache


def _step(buf: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(4, 8, generator=g), torch.randn(8, 8, generator=g),
               torch.randn(8, generator=g))
    torch.addmm(b, x, w, out=buf)
    return torch.nn.functional.gelu(buf).sum()


def test_an_out_buffers_old_contents_are_not_an_input(tmp_path):
    for name, garbage in (("my", 3.0e38), ("golden", -7.0)):
        buf = torch.full((4, 8), garbage)  # made unseen, as a compiled program's buffers are
        with dumper(dump_path=tmp_path / f"{name}.h5"):
            _step(buf)
    with load_dump(tmp_path / "my.h5") as d:
        mm = next(r for r in d.records if r.op == "aten.addmm.out")
        assert mm.extra["uninitialized_io"]["input"] == [3]  # the out= buffer, nothing else
        assert [t.has_data for t in mm.inputs] == [True, True, True, False]
        assert mm.outputs[0].has_data  # what the op wrote is recorded as ever
    rep = compare(tmp_path / "my.h5", tmp_path / "golden.h5")
    assert rep.summary["counts"]["warning"] == 0 and rep.summary["counts"]["error"] == 0, \
        [(r.my_address, r.verdict, r.message) for r in rep.rows if r.verdict.value != "pass"]


def test_an_out_call_writing_over_its_own_input_keeps_that_input(tmp_path):
    """`torch.add(a, b, out=a)`: `a` is read as an input before it is overwritten."""
    a, b = torch.arange(4.0), torch.ones(4)
    with dumper(dump_path=tmp_path / "d.h5"):
        torch.add(a, b, out=a)
    with load_dump(tmp_path / "d.h5") as d:
        add = next(r for r in d.records if r.op == "aten.add.out")
        assert add.extra["uninitialized_io"]["input"] == [2]  # only the out= position
        assert torch.equal(add.inputs[0].load(), torch.arange(4.0))


@pytest.mark.filterwarnings("ignore:Using `torch.compile")
def test_an_eager_write_into_a_compiled_gradient_is_what_later_ops_read(tmp_path):
    """DDP around a compiled module copies the all-reduced gradient into the grad the
    compiled backward made (an eager `copy_` through a tensor object of its own): the
    optimizer then reads the reduced gradient, and so must its recorded input (it read the
    compiled launch's stale record: AdamW replayed on the rank's own gradient, 30 false
    errors per rank with -r)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    with inductor_cache(tmp_path):
        cm = torch.compile(m)
        with dumper(tmp_path / "c.h5", mode="tensor"):
            cm(torch.randn(4, 16)).sum().backward()
            g = m[0].weight.grad
            g.copy_(torch.full_like(g, 0.5))
            g.mul(2)
    with load_dump(tmp_path / "c.h5") as d:
        mul = [r for r in d.records if r.op == "aten.mul.Tensor"][-1]
        assert torch.equal(mul.inputs[0].load(), torch.full((32, 16), 0.5))
