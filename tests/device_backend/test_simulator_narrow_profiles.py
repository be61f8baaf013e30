"""`sim` profiles round every op whose dtype is finer than the profile's precision: fp16 ops
under `bf16` included (same width, 3 fewer mantissa bits), and rows say what was applied."""

from __future__ import annotations

import torch

from accuracy.compare import compare
from accuracy.device_backend import sim
from accuracy.device_backend.rounding import to_bf16, to_fp16
from accuracy.dumper import dumper
from accuracy.examples import lm_batch, lm_step, tiny_lm
from accuracy.replay import replay


def test_bf16_profile_rounds_fp16_matmul_inputs():
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(8, 16, generator=g).half() for _ in range(2))
    with sim(profile="bf16"):
        out = torch.mm(a, b.t())
    expect = torch.mm(a.bfloat16().half(), b.t().bfloat16().half())
    assert not torch.equal(out, torch.mm(a, b.t()))
    assert torch.equal(out, expect)


def test_rounding_never_widens_or_overflows():
    bf = torch.tensor([1.0 + 2 ** -7, 3e38], dtype=torch.bfloat16)
    assert to_fp16(bf) is bf  # bf16 is not finer than fp16: left as computed
    top = torch.tensor([65504.0], dtype=torch.float16)
    assert torch.isfinite(to_bf16(top)).all()


def _step():
    lm_step(tiny_lm(layers=1), lm_batch(batch=2, seq=8))


def _autocast_run(tmp_path, faults=()):
    g, d, r = (str(tmp_path / n) for n in ("g.h5", "d.h5", "r.h5"))
    with dumper(g):
        _step()
    with sim(profile="bf16", faults=list(faults)), \
            torch.autocast("cpu", dtype=torch.float16), dumper(d):
        _step()
    replay(d, r)
    return compare(d, g, replay=r)


def test_fp16_autocast_under_bf16_is_rounded_clean_and_says_so(tmp_path):
    report = _autocast_run(tmp_path)
    assert report.summary["counts"]["error"] == 0
    mm = [r for r in report.rows if r["op"] in ("aten.mm.default", "aten.addmm.default")
          and r["io"] == "output" and r["dtype_my"] == "float16"]
    assert mm and all(r["compute_precision"] == "bfloat16" for r in mm)
    # what the rows say was applied: the kernels' local error is bf16's, not fp16's
    assert max(r["local_error_ratio"] for r in mm) > 2


def test_fault_in_fp16_autocast_under_bf16_is_the_culprit(tmp_path):
    fault = sim.fault("aten.addmm.default", kind="bias", value=1e-2, occurrence=1)
    report = _autocast_run(tmp_path, [fault])
    assert report.summary["culprit"]["op"] == "aten.addmm.default"
