"""Issue 25, the single-process half of the distributed rules: uninitialised memory followed
until it is filled, a different scalar argument named (never PASS), GradScaler's phase."""

from __future__ import annotations

import torch
from torch import nn

from accuracy import aten
from accuracy.compare.api import compare
from accuracy.dumper.core import dumper
from accuracy.dumpfile.reader import load_dump
from accuracy.replay import replay


def _ops(path):
    with load_dump(path) as d:
        return {(r.op, r.seq): r for r in d.records}


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


def test_partly_filled_outputs_are_a_registry_fact_users_extend():
    assert aten.PARTLY_FILLED_OUTPUTS["fsdp.all_gather_copy_in.default"] == (1,)
    aten.register("mylib.pack.default", partly_filled=(0, 2))
    try:
        assert aten.PARTLY_FILLED_OUTPUTS["mylib.pack.default"] == (0, 2)
    finally:
        aten.register("mylib.pack.default", partly_filled=())
    assert "mylib.pack.default" not in aten.PARTLY_FILLED_OUTPUTS


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


def _rank_report(culprit: dict | None, first_div: dict | None):
    from accuracy.compare.report import Report

    summary = {"counts": {"error": 1 if culprit else 0}, "my": "m", "golden": "g",
               "verdict": "error", "rows": 0, "culprit": culprit, "first_divergence": first_div}
    return Report([], summary)


def test_diverged_first_is_where_a_rank_kernel_fault_starts_not_where_error_grows():
    """Rank 1's kernel is wrong at epoch 0 (its output not yet an accumulated error); the
    error grows into one on both ranks at epoch 1, rank 0's a little earlier in seq: rank 1
    diverged first."""
    from accuracy.compare.multirank import merge

    def row(seq: int, op: str = "aten.add.Tensor") -> dict:
        return {"index": seq, "seq_my": seq, "op": op, "kind": "op", "io": "output",
                "local_verdict": "error"}

    reports = {0: _rank_report(None, row(50)), 1: _rank_report(row(10), row(60))}
    epochs = {0: {50: 1}, 1: {10: 0, 60: 1}}
    s = merge(reports, epochs, {}).summary
    assert s["first_rank"] == 1
    assert s["ranks"][1]["label"] == "culprit" and s["culprit"]["rank"] == 1


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
