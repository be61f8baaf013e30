"""Per-tensor statistics, computed on the tensor's own device in a handful of reductions.

The result is (floats, checksum): floats = [min, max, mean, l2, nan_count, inf_count] and
checksum = the sum of the raw bit patterns (wrapping in int32, or int64 for 8-byte types).
On CPU the values are Python numbers; elsewhere they stay device tensors, read by the writer
thread, so the training thread never waits for the device.
"""

from __future__ import annotations

import math

import torch

_BITS_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NAN = float("nan")
EMPTY_STATS = ((_NAN, _NAN, _NAN, _NAN, 0, 0), 0)
_FP8 = {d for d in (getattr(torch, n, None) for n in (
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"))
    if d is not None}


def _checksum(t: torch.Tensor) -> torch.Tensor:
    """Sum of the raw bit patterns, accumulated with wrap-around (fast, one pass)."""
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    elif t.is_complex():
        t = torch.view_as_real(t)
    size = t.element_size()
    acc = torch.int64 if size == 8 else torch.int32
    return t.view(_BITS_VIEW[size]).sum(dtype=acc)


def _value_view(t: torch.Tensor) -> torch.Tensor:
    """A view (or cheap cast) of `t` that the reductions below accept."""
    if t.is_complex():
        return torch.view_as_real(t)
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if t.dtype in _FP8:
        return t.float()
    return t


def tensor_stats(t: torch.Tensor):
    """Statistics of `t`; call with python dispatch disabled so other modes don't see it."""
    t = t.detach()
    if t.numel() == 0:
        return EMPTY_STATS
    x = _value_view(t)
    mn, mx = torch.aminmax(x)
    if x.is_floating_point():
        # fp32 accumulation (cascade-summed by torch) is 5x faster than fp64 and accurate
        # enough for statistics; fp64 tensors keep fp64.
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        total = torch.sum(x, dtype=acc)
        l2 = torch.linalg.vector_norm(x, dtype=acc)
    else:
        total = torch.sum(x, dtype=torch.float64)
        l2 = torch.linalg.vector_norm(x.double())
    checksum = _checksum(t)
    n = x.numel()
    if t.device.type == "cpu":
        mn_f, mx_f = mn.item(), mx.item()
        if x.is_floating_point() and not (math.isfinite(mn_f) and math.isfinite(mx_f)):
            nans, infs = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
        else:
            nans = infs = 0
        return (mn_f, mx_f, total.item() / n, l2.item(), nans, infs), checksum.item()
    if x.is_floating_point():
        nans = torch.isnan(x).sum(dtype=torch.float64)
        infs = torch.isinf(x).sum(dtype=torch.float64)
    else:
        nans = infs = torch.zeros((), dtype=torch.float64, device=x.device)
    floats = torch.stack([mn.double(), mx.double(), total.double() / n, l2.double(), nans,
                          infs])
    return floats, checksum
