"""The dumper on training features users have: AdamW inside the dump, CPU bf16 autocast,
inference mode, activation checkpointing, custom autograd Functions."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from accuracy import dumper, load_dump


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _x(n: int = 8) -> torch.Tensor:
    return torch.randn(n, 16, generator=torch.Generator().manual_seed(1))


def test_adamw_step_is_recorded_as_the_optimizer_phase(tmp_path):
    model = MLP()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, foreach=False)
    with dumper(str(tmp_path / "d.h5")):
        model(_x()).square().mean().backward()
        grad = model.fc1.weight.grad.clone()
        before = model.fc1.weight.detach().clone()
        opt.step()
    after = model.fc1.weight.detach()
    with load_dump(tmp_path / "d.h5") as d:
        # profiler.record_function markers around step() are not computations: left out here
        phases = [r.phase for r in d.records if r.op.startswith("aten.")]
        assert set(phases) == {"forward", "backward", "optimizer"}
        first_opt = phases.index("optimizer")
        assert "optimizer" not in phases[:first_opt] and set(phases[first_opt:]) == {"optimizer"}
        assert "backward" in phases[:first_opt]
        opt_recs = [r for r in d.records if r.phase == "optimizer"]
        # the update reads fc1's gradient and writes fc1's weight, in place
        assert any(torch.equal(t.load(), grad) for r in opt_recs for t in r.inputs
                   if tuple(t.shape) == tuple(grad.shape))
        writes = [r for r in opt_recs if r.extra.get("inplace") and r.inputs
                  and tuple(r.inputs[0].shape) == tuple(after.shape)
                  and torch.equal(r.inputs[0].load(), before)]
        assert writes, "no in-place op on fc1.weight recorded with its pre-step value"
    assert not torch.equal(before, after)


def test_cpu_bf16_autocast_records_the_dtypes_that_ran(tmp_path):
    model = MLP()
    with dumper(str(tmp_path / "d.h5")), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(_x())
    assert out.dtype == torch.bfloat16
    with load_dump(tmp_path / "d.h5") as d:
        mms = [r for r in d.records if r.op == "aten.addmm.default"]
        assert len(mms) == 2
        for r in mms:
            assert {t.dtype for t in r.inputs} == {"bfloat16"}
            assert r.outputs[0].dtype == "bfloat16"
        casts = [r for r in d.records if r.op == "aten._to_copy.default"]
        assert casts and all(r.inputs[0].dtype == "float32" and r.outputs[0].dtype == "bfloat16"
                             for r in casts)
        assert torch.equal(mms[-1].outputs[0].load(), out)


def test_inference_mode_tensors_are_recorded(tmp_path):
    model = MLP()
    with torch.inference_mode():
        x = _x()
        with dumper(str(tmp_path / "d.h5")):
            out = model(x)
            again = x.sin()
            x.sin()  # inference tensors have no version counter: stored, not linked wrongly
    with load_dump(tmp_path / "d.h5") as d:
        assert d.records[-3].outputs[0].load().equal(out)
        sins = [r for r in d.records if r.op == "aten.sin.default"]
        assert len(sins) == 2 and all(torch.equal(r.outputs[0].load(), again) for r in sins)
        assert all(torch.equal(r.inputs[0].load(), x) for r in sins)


def test_activation_checkpointing_records_the_recomputation(tmp_path):
    model = MLP()
    x = _x()
    with dumper(str(tmp_path / "d.h5")):
        # relu saves its output: the backward must recompute fc1's addmm and the relu
        h = checkpoint(lambda t: torch.relu(model.fc1(t)), x, use_reentrant=False)
        model.fc2(h).sum().backward()
    with load_dump(tmp_path / "d.h5") as d:
        relu = [r for r in d.records if r.op == "aten.relu.default"]
        fc1 = [r for r in d.records if r.op == "aten.addmm.default"
               and tuple(r.outputs[0].shape) == (8, 32)]
        # fc1 and relu ran twice: in the forward, and recomputed during the backward
        assert len(fc1) == len(relu) == 2
        assert [r.phase for r in fc1] == ["forward", "backward"]
        assert torch.equal(fc1[0].outputs[0].load(), fc1[1].outputs[0].load())
        assert torch.equal(relu[1].outputs[0].load(), h.detach())
        grads = [t.load() for r in d.records if r.phase == "backward" for t in r.outputs
                 if tuple(t.shape) == tuple(model.fc1.weight.shape)]
        assert any(torch.equal(g, model.fc1.weight.grad) for g in grads)


class TimesTwoBackThree(torch.autograd.Function):
    """Forward x * 2, backward grad * 3: a custom Function whose backward is its own code."""

    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 3


def test_custom_autograd_function_forward_and_backward(tmp_path):
    x = torch.randn(5, requires_grad=True, generator=torch.Generator().manual_seed(2))
    with dumper(str(tmp_path / "d.h5")):
        TimesTwoBackThree.apply(x).sum().backward()
    with load_dump(tmp_path / "d.h5") as d:
        fwd = [r for r in d.records if r.phase == "forward" and r.op == "aten.mul.Tensor"]
        bwd = [r for r in d.records if r.phase == "backward" and r.op == "aten.mul.Tensor"]
        assert len(fwd) == 1 and torch.equal(fwd[0].outputs[0].load(), x.detach() * 2)
        assert len(bwd) == 1 and torch.equal(bwd[0].outputs[0].load(), x.grad)
    assert torch.equal(x.grad, torch.full((5,), 3.0))

