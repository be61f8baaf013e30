"""The emulated reference (replay/emulate.py): a 1e-3 fault on an op that computes at bf16
precision, a third of the op's own rounding, is the culprit with a replay; a clean bf16 run
stays clean; a device that does not round like the emulation is not judged by it."""

from __future__ import annotations

import torch
from torch import nn

from accuracy.compare.api import compare
from accuracy.device_backend import rounding, sim
from accuracy.dumper import dumper
from accuracy.dumpfile import load_dump
from accuracy.replay import replay


def _step() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                      nn.Linear(64, 8))
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(1))
    m(x).pow(2).mean().backward()


def _run(tmp_path, name: str, faults=(), profile: str = "bf16") -> tuple:
    gold, dev, rp = tmp_path / "gold.h5", tmp_path / f"{name}.h5", tmp_path / f"{name}-r.h5"
    if not gold.exists():
        with dumper(gold):
            _step()
    with sim(profile=profile, faults=list(faults)), dumper(dev):
        _step()
    replay(dev, rp)
    seq = None
    with load_dump(dev) as d:
        seq = next((r.seq for r in d.records if r.extra.get("faults")), None)
    return compare(dev, gold, rp), seq


def test_a_1e3_bias_on_a_bf16_compute_matmul_is_the_culprit_with_replay(tmp_path):
    fault = sim.fault("aten.addmm.default", "*2", kind="bias", value=1e-3)
    rep, seq = _run(tmp_path, "bias", [fault])
    assert seq is not None
    culprit = rep.summary["culprit"]
    assert culprit is not None and culprit["seq_my"] == seq, culprit
    assert culprit["compute_precision"] == "bfloat16"
    assert culprit["emulated_excess"] > 10  # honest ops sit well under 1
    assert "emulated (bfloat16 inputs) residual" in culprit["message"]


def test_a_1e3_noise_on_a_bf16_backward_matmul_is_the_culprit(tmp_path):
    fault = sim.fault("aten.mm.default", "*0", kind="noise", value=1e-3)
    rep, seq = _run(tmp_path, "noise", [fault])
    assert rep.summary["culprit"] is not None and rep.summary["culprit"]["seq_my"] == seq


def test_a_clean_bf16_run_stays_clean_and_its_residuals_are_within_the_bound(tmp_path):
    rep, _ = _run(tmp_path, "clean")
    assert rep.summary["counts"]["error"] == 0 and rep.summary["counts"]["warning"] == 0
    emulated = [r for r in rep.rows if r.emulated_excess is not None]
    assert len(emulated) >= 6  # forward and backward matmuls, each at bf16
    assert max(r.emulated_excess for r in emulated) < 1.0


def _truncate_bf16(t: torch.Tensor) -> torch.Tensor:
    """bf16 by truncation (round toward zero): what some hardware converters do."""
    if t.dtype != torch.float32:
        return t
    return (t.contiguous().view(torch.int32) & -65536).view(torch.float32).reshape(t.shape)


def _on_a_truncating_device(tmp_path, monkeypatch, step):
    """`step` dumped on CPU and on a bf16 sim whose converter truncates, compared with `-r`."""
    with monkeypatch.context() as mp:
        mp.setitem(rounding._ROUNDINGS, "bf16", _truncate_bf16)
        gold, dev = tmp_path / "gold.h5", tmp_path / "trunc.h5"
        with dumper(gold):
            step()
        with sim(profile="bf16"), dumper(dev):
            step()
    replay(dev, tmp_path / "trunc-r.h5")
    return compare(dev, gold, tmp_path / "trunc-r.h5")


def test_a_device_that_does_not_round_like_the_emulation_is_not_judged_by_it(tmp_path,
                                                                             monkeypatch):
    """The device's rules say bf16, its converter truncates: every honest matmul's residual
    against the round-to-nearest emulation is far over the bound, so the emulated figure is
    reported and not used (no false errors), and the usual judgement stands."""
    rep = _on_a_truncating_device(tmp_path, monkeypatch, _step)
    emulated = [r for r in rep.rows if r.emulated_excess is not None]
    assert emulated and sorted(r.emulated_excess for r in emulated)[len(emulated) // 2] > 1
    assert all("not used" in r.message for r in emulated)
    assert all(r.verdict != "error" for r in emulated)


def _three_kernels() -> None:
    """One output each of three matmul kernels: too few per kernel for the per-kernel rule,
    enough together for the run's (the device's rounding is judged over them all)."""
    g = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(16, 64, generator=g), torch.randn(64, 64, generator=g), torch.randn(64)
    with torch.no_grad():
        h = torch.addmm(b, x @ w, w)
        torch.bmm(h.unsqueeze(0), w.unsqueeze(0)).sum()


def test_a_truncating_device_seen_over_few_ops_per_kernel_is_not_judged_by_the_emulation(
        tmp_path, monkeypatch):
    """A short step (one mm, one addmm, one bmm) on a device that truncates: no kernel has
    enough outputs of its own to show how it rounds, the run's matmuls together do, and their
    emulated residuals (far over the bound) are reported, not used: no false error."""
    rep = _on_a_truncating_device(tmp_path, monkeypatch, _three_kernels)
    emulated = [r for r in rep.rows if r.emulated_excess is not None]
    assert len({r.op for r in emulated}) == 3 and len(emulated) == 3, [r.op for r in emulated]
    assert min(r.emulated_excess for r in emulated) > 1
    assert all("not used" in r.message and "the device does not round like" in r.message
               for r in emulated), [r.message for r in emulated]
    assert all(r.verdict != "error" for r in rep.rows), [r.op for r in rep.rows
                                                           if r.verdict == "error"]
