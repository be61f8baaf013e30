"""Every path of `tensor_stats` (numpy for small CPU tensors, the large CPU float path, torch
elsewhere) stores the same figures: min/max exact, mean and L2 to float accuracy, non-finite
counts exact, and the checksum equal to the reader's bit-pattern sum of the tensor's bytes."""

from __future__ import annotations

import math

import pytest
import torch

from accuracy.dumpfile.checksum import checksum, part_size
from accuracy.dumpfile.stats import _SMALL, tensor_stats


def _reference(t: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(the bit-pattern sum of `t`'s bytes as the reader computes it, `t` in float64)."""
    flat = t.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy()
    dtype = str(flat.dtype).removeprefix("torch.")
    return checksum(raw, part_size(dtype, flat.element_size())), flat.double()


@pytest.mark.parametrize("n", [100, _SMALL + 7, 3 * _SMALL])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int32,
                                   torch.int64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "offset"])
def test_every_path_stores_the_same_figures(n, dtype, layout):
    g = torch.Generator().manual_seed(n)
    base = (torch.randn(2 * n + 4, generator=g) * 1000).to(dtype)
    if layout == "contiguous":
        t = base[:n]
    elif layout == "transposed":
        t = base[: (n // 4) * 4].view(4, -1).t()  # dense, not contiguous
    elif layout == "strided":
        t = base[: 2 * n: 2]  # not dense
    else:
        t = base[3: n + 3]  # a view at an offset into its storage
    (mn, mx, mean, l2, nans, infs), cs = tensor_stats(t)
    ref_cs, v = _reference(t)
    assert (mn, mx) == (v.min().item(), v.max().item())
    assert mean == pytest.approx(v.mean().item(), rel=1e-5, abs=1e-3)
    assert l2 == pytest.approx(v.norm().item(), rel=1e-5)
    assert (nans, infs) == (0, 0)
    assert cs == ref_cs


@pytest.mark.parametrize("n", [100, 3 * _SMALL])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_non_finite_values_are_counted_on_every_path(n, dtype):
    t = torch.randn(n).to(dtype)
    t[5], t[7], t[9], t[11] = math.nan, math.inf, -math.inf, math.nan
    (mn, mx, _mean, l2, nans, infs), cs = tensor_stats(t)
    assert (nans, infs) == (2, 2)
    assert math.isnan(mn) or mn == -math.inf
    assert math.isnan(l2)
    assert cs == _reference(t)[0]
