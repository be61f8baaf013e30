"""One loop, one way in: an observer registered once sees every call of a step.

`dumper.observe(observer)` is the public way to watch what the dumper records. Compiled kernels
used to bypass the observers (a second write path straight into the recorder), so a quant,
subclass or user's observer never saw a kernel; now an eager op (from the dispatch mode) and a
kernel launch (from the Inductor hook) both go through `Loop.emit`, placed by one step.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accuracy import dumper, load_dump
from accuracy.dumper.calls import KernelCall, OpCall
from accuracy.dumpfile import schema
from tests._support.miscompile import inductor_cache

pytestmark = pytest.mark.filterwarnings("ignore:Using `torch.compile")


class _Eager(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))  # eager line


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.fc(self.ln(x)))  # compiled line


EAGER_LINE = f"{__file__}:{_Eager.forward.__code__.co_firstlineno + 1}"
COMPILED_LINE = f"{__file__}:{_Block.forward.__code__.co_firstlineno + 1}"


class Seen:
    """A user's observer: keeps the site of every call it is shown, before and after."""

    def __init__(self) -> None:
        self.befores: list = []
        self.afters: list = []

    def before(self, call) -> None:
        self.befores.append(call.site)

    def after(self, call, outputs) -> None:
        self.afters.append((type(call), call.site, len(outputs)))

    def finish(self) -> dict:
        return {}


def test_one_observer_sees_every_eager_op_and_kernel_launch_with_the_same_site(tmp_path):
    with inductor_cache(tmp_path):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = nn.Sequential(_Eager(), torch.compile(_Block()))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(3, 8)
        seen = Seen()
        d = dumper(tmp_path / "run.h5", mode="statistics")
        assert d.observe(seen) is seen  # registered once, before the block
        with d:
            for _ in range(2):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
                d.step()
    calls = seen.afters
    # every call the loop numbered was shown to it, before and after, in order
    assert [site for _, site, _ in calls] == seen.befores
    assert [site.seq for _, site, _ in calls] == list(range(d.loop.seq))
    with load_dump(tmp_path / "run.h5") as dump:
        assert dump.attrs["ops_seen"] == len(calls) == len(dump.records)
        rows = [(r.seq, r.op, r.phase, r.module, r.source, r.step) for r in dump.records]
        rank = dump.attrs["rank"]
        # kernels' notes and the compiled watch's attributes are names schema.py declares
        assert {k for r in dump.records for k in r.extra} - set(schema.EXTRA) == set()
        assert set(dump.attrs) - set(schema.ROOT) == set()
        assert any(schema.EXTRA_FUSED_GRAPH in r.extra for r in dump.records)
    # the same call-site fields as the rows the dumper wrote, for ops and kernels alike
    assert [(s.seq, s.op, s.phase, s.module, s.source, s.step) for _, s, _ in calls] == rows
    assert {s.rank for _, s, _ in calls} == {rank}
    kernels = [s for kind, s, _ in calls if kind is KernelCall]
    ops = [s for kind, s, _ in calls if kind is OpCall]
    assert len(kernels) + len(ops) == len(calls)
    for step in (0, 1):  # each step's kernel launches reach it too (compiled once, at step 0)
        assert {s.phase for s in kernels if s.step == step} == {"forward", "backward"}
        assert {s.phase for s in ops if s.step == step} == {"forward", "backward", "optimizer"}
    assert all(s.op.startswith("inductor.") for s in kernels)
    # placed like eager rows: the module as the eager model names it, the user's line
    assert {s.module for s in kernels} <= {"Sequential.1", "Sequential.1.ln", "Sequential.1.fc"}
    assert any(s.phase == "forward" and s.module == "Sequential.1.ln"
               and s.source == COMPILED_LINE for s in kernels)
    assert any(s.phase == "backward" and s.module.startswith("Sequential.1")
               and s.source == COMPILED_LINE for s in kernels)
    fc = [s for s in ops if s.op == "aten.addmm.default"]
    assert {(s.phase, s.module, s.source) for s in fc} == {("forward", "Sequential.0.fc",
                                                            EAGER_LINE)}
    assert any(s.phase == "backward" and s.module == "Sequential.0.fc"
               and s.source == EAGER_LINE for s in ops)
    assert {s.module for s in ops if s.phase == "optimizer" and s.op.startswith("aten.")} \
        >= {"Sequential.0.fc.weight", "Sequential.1.fc.weight"}
