"""A foreach or fused optimizer (every accelerator's default) against the per-tensor one (CPU's
default): their ops have nothing in common, yet the states they write are the same, and
compare pairs those parameter by parameter and judges them. Run on CPU, where AdamW takes all
three implementations (`foreach=`, `fused=`): the npu test device's own runs are in
tests/testdevice/test_testdevice_flows.py."""

from __future__ import annotations

import pytest
import torch

from accuracy import dumper, load_dump
from accuracy.compare import compare
from accuracy.device_backend import sim

STATES = ("param", "exp_avg", "exp_avg_sq")


def _run(path, steps: int = 1, faults=None, **impl) -> list[str]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, **impl)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
    for step in range(steps):
        last = step == steps - 1
        with (sim(profile="exact", faults=faults) if last and faults else _Nothing()), \
                (dumper(str(path)) if last else _Nothing()):
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    return [n for n, _ in model.named_parameters()]


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _state_rows(rep):
    return [r for r in rep.rows if r.kind == "op" and r.phase == "optimizer" and r.io == "output"
            and "paired by optimizer state" in (r.message or "")]


@pytest.mark.parametrize("impl", [{"foreach": True}, {"fused": True}], ids=["foreach", "fused"])
@pytest.mark.parametrize("steps", [1, 2], ids=["first_step", "second_step"])
def test_each_parameters_states_pair_with_the_per_tensor_optimizers(tmp_path, impl, steps):
    """The first step makes the states inside step() (learnt as they appear); the last write of
    each pairs with the other run's last, whatever the number of writes (fused AdamW decays and
    updates a parameter in one write, per-tensor AdamW in two)."""
    _run(tmp_path / "gold.h5", steps, foreach=False)
    _run(tmp_path / "mine.h5", steps, **impl)
    with load_dump(tmp_path / "mine.h5") as d:
        params = {r.module for r in d.records if r.op == "aten.zeros_like.default"} or None
    rep = compare(tmp_path / "mine.h5", tmp_path / "gold.h5")
    rows = _state_rows(rep)
    last = {(r.module, st) for r in rows for st in STATES
            if f": {st} of " in r.message and "its last write" in r.message}
    names = {r.module for r in rows}
    assert params is None or params <= names
    assert {(n, st) for n in names for st in STATES} <= last and len(names) == 4
    assert all(r.verdict.value == "pass" for r in rows), [
        (r.module, r.message) for r in rows if r.verdict.value != "pass"][:3]
    assert rep.summary["counts"]["error"] == 0 and not rep.summary.get("blind")
    coverage = rep.summary["coverage"]  # the other implementation's intermediates: by design
    assert "phases_uncompared" not in coverage and coverage["compared"] == coverage["my_tensors"]
    # an input pairs only with the same state read after as many writes: on the first step
    # (the same parameters and gradients on both sides) the same values
    reads = [r for r in rep.rows if "as read" in (r.message or "")]
    assert {r.message.split(": ")[1].split(" of ")[0] for r in reads} >= {"grad", "exp_avg"}
    assert steps > 1 or not any(r.max_abs_err for r in reads), [
        (r.module, r.message) for r in reads if r.max_abs_err][:3]


def test_a_faulty_foreach_update_is_named_by_the_parameter_it_wrote(tmp_path):
    """Paired by state, a fault in the foreach kernel's update of one parameter's exp_avg is
    judged against the per-tensor update of the same state (its inputs paired too: the
    gradient and the state as read) and named the culprit."""
    fault = sim.fault("aten._foreach_lerp_.Scalar", kind="bias", value=0.1, output=1)
    _run(tmp_path / "gold.h5", 1, foreach=False)
    names = _run(tmp_path / "mine.h5", 1, faults=[fault], foreach=True)
    rep = compare(tmp_path / "mine.h5", tmp_path / "gold.h5")
    c = rep.summary["culprit"]
    assert c is not None and c["op"] == "aten._foreach_lerp_.Scalar", rep.summary["counts"]
    assert c["module"].endswith(names[1]) and c["tensor_index"] == 1
    errors = [r for r in rep.rows if r.kind == "op" and r.io == "output"
              and r.verdict.value == "error"]
    assert [(r.op, r.tensor_index) for r in errors] == [("aten._foreach_lerp_.Scalar", 1)]
