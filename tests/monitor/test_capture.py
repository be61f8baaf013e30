"""The capture of a non-finite step whose loss stays finite: a NaN only the gradients carry (a
backward overflow, or another rank's inf/nan brought in by DDP's gradient all-reduce). The
capture scans for overflow births whenever the step is non-finite, not only when the loss is,
and a birth in a collective is reported as another rank's, not as 'no culprit found'."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import torch

import accuracy.monitor as am
from accuracy.aten import FROM_COLLECTIVE
from accuracy.overflow.scan import Finding, OverflowReport
from accuracy.records import CallSite
from tests._support.ranks import run_ranks

BOOM = 5  # the step whose backward overflows


def _backward_overflow_run(tmp_path: Path, zero_after: bool, **options):
    """A small MLP whose step BOOM multiplies the first layer's output gradient by 1e39 (a
    tensor hook: an op of the backward, from finite inputs): the loss stays finite, the
    gradients go inf/nan. `zero_after`: the step sets the gradients to None after the optimizer
    step, so only the monitor's flag (read before it) says they were non-finite."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def train_step(x, y, boom):
        opt.zero_grad()
        h = model[0](x)
        if boom:
            h.register_hook(lambda g: g * 1e39)
        loss = torch.nn.functional.cross_entropy(model[2](model[1](h)), y)
        loss.backward()
        opt.step()
        if zero_after:
            opt.zero_grad(set_to_none=True)
        return loss

    step = am.watch(train_step, model, opt, path=tmp_path / "bw.monitor.h5", snapshot_every=4,
                    **options)
    losses = []
    for i in range(BOOM + 1):
        g = torch.Generator().manual_seed(i)
        loss = step(torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g),
                    i == BOOM)
        losses.append(float(loss.detach()))
    step.monitor.close()
    return step.monitor, losses


def _assert_names_the_backward_birth(mon, losses) -> None:
    assert all(map(torch.isfinite, torch.tensor(losses)))  # only the gradients went bad
    (cap,) = mon.captures
    assert cap.step == BOOM and cap.exact is True
    text = (Path(cap.folder) / "capture.txt").read_text()
    assert "inf/nan born at aten.mul.Tensor" in text, text
    assert "[backward]" in text and "no culprit found" not in text, text
    assert cap.culprit["verdict"] == "overflow birth" and cap.culprit["phase"] == "backward"
    assert "CULPRIT: aten.mul.Tensor" in text


def test_a_non_finite_gradient_norm_under_a_finite_loss_names_the_birth(tmp_path):
    """The monitor flags 'global gradient norm is inf/nan' while the loss is finite, and the
    step clears its gradients after the optimizer step: the flag alone makes the scan run."""
    mon, losses = _backward_overflow_run(tmp_path, zero_after=True)
    (cap,) = mon.captures
    assert cap.reason.startswith("non-finite: global gradient norm is")
    _assert_names_the_backward_birth(mon, losses)
    assert cap.rerun_grads_finite is True  # set to None after the step: nothing left to see


def test_non_finite_gradients_of_the_rerun_name_the_birth_without_the_non_finite_trigger(
        tmp_path):
    """Another trigger flagged the step (a user's predicate, NonFinite off): the re-run's own
    gradients, inf/nan, make the capture scan for the birth."""
    mon, losses = _backward_overflow_run(
        tmp_path, zero_after=False, triggers=[am.Predicate(lambda s: s.step == BOOM, "mine")])
    (cap,) = mon.captures
    assert cap.reason.startswith("mine: ")
    _assert_names_the_backward_birth(mon, losses)
    assert cap.rerun_grads_finite is False


def _finding(op: str, label: str = "") -> Finding:
    return Finding(CallSite(62, op, "backward", "DistributedDataParallel.module.0", "", 0),
                   [{"idx": 0, "dtype": "float32", "shape": [484], "nan": 484, "inf": 0}],
                   label=label)


def test_a_birth_in_a_collective_sends_the_user_to_the_other_ranks():
    from accuracy.monitor.capture import THROUGH_COLLECTIVE, Capture, name_birth

    cap = Capture(step=2, reason="non-finite: global gradient norm is nan at step 2",
                  rerun_loss=1.3, rerun_grads_finite=False)
    report = OverflowReport("device.h5", "tensor", False, 138,
                            births=[_finding("c10d.allreduce_.default", FROM_COLLECTIVE),
                                    _finding("aten.mul.Tensor")])
    name_birth(cap, report, "pass")
    text = cap.format()
    assert "inf/nan arrived through a collective at c10d.allreduce_.default" in text
    assert "another rank" in text and "look at the other ranks' captures" in text
    assert "CULPRIT" not in text and "from finite inputs; every kernel" not in text
    assert cap.culprit["verdict"] == THROUGH_COLLECTIVE
    assert cap.culprit["op"] == "c10d.allreduce_.default"
    # a birth in this rank's own op keeps its verdict
    own = Capture(step=2, reason=cap.reason, rerun_loss=float("nan"))
    name_birth(own, OverflowReport("device.h5", "tensor", False, 10,
                                   births=[_finding("aten.mul.Tensor")]), "pass")
    assert own.culprit["verdict"] == "overflow birth"
    assert "CULPRIT: aten.mul.Tensor" in own.format() and "collective" not in own.format()


WORKER = textwrap.dedent('''
    import json, os, sys
    import torch, torch.distributed as dist
    from torch import nn
    import accuracy.monitor as am

    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    boom = {"on": False}
    if rank == 1:  # rank 1 overflows in its forward; rank 0's own step stays finite
        m[0].register_forward_hook(lambda mod, i, o: o * 1e39 if boom["on"] else o)
    model = nn.parallel.DistributedDataParallel(m)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def train_step(x, y, on):
        boom["on"] = on
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    step = am.watch(train_step, model, opt, path=os.path.join(out, "run_{rank}.monitor.h5"),
                    snapshot_every=2, overwrite=True)
    g = torch.Generator().manual_seed(100 + rank)
    for i in range(3):
        step(torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g), i == 2)
    step.monitor.close()
    caps = [{"step": c.step, "folder": c.folder, "reason": c.reason, "culprit": c.culprit}
            for c in step.monitor.captures]
    with open(os.path.join(out, f"result_{rank}.json"), "w") as f:
        json.dump(caps, f, default=str)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # past torch's own exit-time teardown, which aborts now and then with gloo
''')


def test_ddp_rank_whose_gradients_another_rank_poisoned_says_so(tmp_path):
    """Two CPU ranks with DDP: rank 1's forward overflows at step 2, DDP's all-reduce brings
    its inf/nan into rank 0's gradients (loss finite). Rank 0's capture says the inf/nan came
    through a collective from another rank; rank 1's names its own op."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run_ranks([[sys.executable, str(script), str(tmp_path)]] * 2, cwd=tmp_path, timeout=120)
    (r0,) = json.loads((tmp_path / "result_0.json").read_text())
    (r1,) = json.loads((tmp_path / "result_1.json").read_text())
    assert r0["step"] == r1["step"] == 2
    assert r0["reason"].startswith("non-finite: global gradient norm is")  # loss finite
    text = (Path(r0["folder"]) / "capture.txt").read_text()
    assert "inf/nan arrived through a collective at c10d.allreduce_.default" in text, text
    assert "look at the other ranks' captures" in text and "no culprit found" not in text, text
    assert r0["culprit"]["verdict"] == "through a collective"
    assert r1["culprit"]["verdict"] == "overflow birth"
    assert r1["culprit"]["op"] == "aten.mul.Tensor" and r1["culprit"]["phase"] == "forward"
