"""Replay's per-output figures (relative L2 error, max abs error, cosine against the fp64
reference), with the C kernels and without them: the same figures either way."""

from __future__ import annotations

import math

import pytest
import torch

from accuracy.replay.metrics import compare
from tests._support.native import PATHS, take_path


@pytest.fixture(autouse=True, params=PATHS)
def metrics_path(request, monkeypatch):
    """Every test here runs with the fused C pass and with torch's passes alone."""
    return take_path(request.param, monkeypatch)


def _reference(x: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, float]:
    a, b = x.double().reshape(-1), ref.double().reshape(-1)
    d = a - b
    return (float(d.norm() / b.norm()), float(d.abs().max()),
            float(a @ b / (a.norm() * b.norm())))


@pytest.mark.parametrize("n", [1, 1000, 70_000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_figures_match_the_formulas(n, dtype):
    g = torch.Generator().manual_seed(n)
    ref = torch.randn(n, dtype=torch.float64, generator=g) + 0.5
    x = (ref + 1e-3 * torch.randn(n, dtype=torch.float64, generator=g)).to(dtype)
    rel, mx, cos = compare(x, ref)
    want = _reference(x, ref)
    assert rel == pytest.approx(want[0], rel=1e-9)
    assert mx == want[1]
    assert cos == pytest.approx(want[2], rel=1e-12)


def test_a_transposed_output_is_compared_element_for_element():
    ref = torch.randn(64, 48, dtype=torch.float64)
    x = (ref + 1e-4).float().t().contiguous().t()  # the same values, column-major memory
    assert not x.is_contiguous()
    rel, mx, _cos = compare(x, ref)
    want = _reference(x, ref)
    assert mx == want[1] and mx == pytest.approx(1e-4, rel=0.05)
    assert rel == pytest.approx(want[0], rel=1e-9)


def test_matching_non_finite_values_are_no_error_and_others_are_inf():
    ref = torch.tensor([1.0, math.nan, math.inf, 2.0], dtype=torch.float64)
    same = ref.float()
    assert compare(same, ref)[:2] == (0.0, 0.0)
    other = torch.tensor([1.0, 0.0, math.inf, 2.0])
    assert compare(other, ref)[0] == math.inf


def test_zero_sides():
    z = torch.zeros(10, dtype=torch.float64)
    assert compare(z.float(), z) == (0.0, 0.0, 1.0)
    rel, mx, cos = compare(torch.ones(10), z)
    assert (rel, mx, cos) == (math.sqrt(10), 1.0, 0.0)


def test_an_fp32_output_is_compared_without_an_fp64_copy(metrics_path, monkeypatch):
    """The fp32 side is read as it is by the kernels: the same figures as through a copy."""
    g = torch.Generator().manual_seed(7)
    ref = torch.randn(5000, dtype=torch.float64, generator=g)
    x = (ref * 1.001).float()
    got = compare(x, ref)
    want = compare(x.double(), ref)
    assert got[1] == want[1]
    assert got[0] == pytest.approx(want[0], rel=1e-12) and got[2] == pytest.approx(want[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_live_checks_l2_of_an_input_is_its_fp64_norm(dtype):
    """What the live check's judge reads of a live tensor (`verdict.judge_local`)."""
    from accuracy.live.check import _TensorShape

    t = (torch.randn(3000, generator=torch.Generator().manual_seed(3)) * 1e-20).to(dtype)
    l2 = _TensorShape(0, t).stats["l2"]
    assert l2 == pytest.approx(t.double().norm().item(), rel=1e-9, abs=0)


def test_the_l2_of_a_transposed_input_takes_the_one_c_pass(metrics_path, monkeypatch):
    """A weight's `t` (most inputs of a linear's backward): its memory block is dense, so its
    norm is the C pass's over that block, not a float64 copy of the transposed view."""
    from accuracy.live.check import _TensorShape

    w = torch.randn(300, 200, generator=torch.Generator().manual_seed(4))
    want = w.double().norm().item()
    if metrics_path == "fused":
        def no_copy(*a, **k):
            raise AssertionError("norm taken through a float64 copy")

        monkeypatch.setattr(torch.linalg, "vector_norm", no_copy)
    assert _TensorShape(0, w.t()).stats["l2"] == pytest.approx(want, rel=1e-9, abs=0)


# -- bit identity: device output against the same-dtype reference ----------------------------

@pytest.mark.parametrize("where", [0, 40_000, 99_999])  # first chunk, middle, last partial
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.uint8])
def test_one_changed_element_anywhere_is_told_apart(where, dtype):
    from accuracy.replay.metrics import bit_equal

    a = (torch.arange(100_000) % 251).to(dtype)
    b = a.clone()
    assert bit_equal(a, b)
    b[where] = b[where] + 1
    assert not bit_equal(a, b)


def test_an_output_off_the_reference_is_told_apart_without_a_pass_over_all_of_it(monkeypatch):
    import numpy as np

    from accuracy.replay import metrics

    seen = []
    real = np.array_equal

    def counting(x, y):
        seen.append(x.nbytes)
        return real(x, y)

    monkeypatch.setattr(metrics.np, "array_equal", counting)
    a = torch.randn(4 << 20)  # 16 MB
    b = a.clone()
    b[3] += 1  # differs at once, as a device output off the CPU reference does
    assert not metrics.bit_equal(a, b)
    assert sum(seen) <= 256 << 10
