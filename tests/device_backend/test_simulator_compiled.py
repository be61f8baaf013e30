"""`sim` on `torch.compile`d models: module patterns (faults, `high_precision`) select the
same calls as on the eager model, named as the dump names them (issue 50).

Under `sim` dynamo runs a compiled module's frames eagerly (a dispatch mode is active), so
the compiled run under a sim must equal the eager run under the same sim, bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accuracy.device_backend import sim


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 16)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.up(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x.pow(2).mean()


def _model(how: str) -> nn.Module:
    torch.manual_seed(0)
    net = Net()
    if how == "compile(model)":
        return torch.compile(net)
    if how == "model.compile()":
        net.compile()
    elif how == "compile(block)":
        net.layers[1] = torch.compile(net.layers[1])
    return net


def _step(how: str, **sim_kwargs) -> tuple[torch.Tensor, list[torch.Tensor], list[dict]]:
    model = _model(how)
    torch.manual_seed(1)
    x = torch.randn(8, 16)
    with sim(**sim_kwargs) as mode:
        loss = model(x)
        loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()], mode.applied


HOWS = ["compile(model)", "compile(block)", "model.compile()"]


@pytest.mark.parametrize("how", HOWS)
def test_a_module_scoped_fault_fires_on_a_compiled_model_as_on_the_eager_one(how):
    """The issue's case: `sim.fault("aten.mm.default", module="...up", ...)` met no call
    under torch.compile. Forward (addmm) and backward (mm) faults in layers.1.up fire, on the
    same calls and under the same module names as eagerly."""
    faults = [sim.fault("aten.addmm", module="layers.1.up", kind="bias", value=0.05),
              sim.fault("aten::mm", module="layers.1.up", kind="bias", value=0.05,
                        occurrence=0)]
    loss, grads, applied = _step("eager", faults=faults)
    assert [(a["op"], a["module"]) for a in applied] == [
        ("aten.addmm.default", "Net.layers.1.up"), ("aten.mm.default", "Net.layers.1.up")]
    c_loss, c_grads, c_applied = _step(how, faults=faults)
    assert c_applied == applied
    assert torch.equal(c_loss, loss)
    assert all(torch.equal(a, b) for a, b in zip(c_grads, grads, strict=True))


@pytest.mark.parametrize("how", HOWS[:2])
def test_high_precision_modules_run_unquantised_on_a_compiled_model(how):
    """fp8 with `high_precision=["layers.1.*"]`: the compiled model's layer 1 GEMMs run
    unquantised as the eager model's do (before, none matched: every GEMM was quantised)."""
    kw = {"profile": "fp8", "high_precision": ["layers.1.*"]}
    loss, grads, _ = _step("eager", **kw)
    everything, _, _ = _step("eager", profile="fp8")
    assert not torch.equal(loss, everything)  # the switch changes the step
    c_loss, c_grads, _ = _step(how, **kw)
    assert torch.equal(c_loss, loss)
    assert all(torch.equal(a, b) for a, b in zip(c_grads, grads, strict=True))
