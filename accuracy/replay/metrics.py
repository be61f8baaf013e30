"""Per-output local-error metrics: device and same-dtype reference, both against the fp64 one.

All arithmetic is in float64 (complex values as their real/imag pairs). See docs/replay.md for
the definitions and why the error ratio has a floor.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from accuracy import native

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half an ulp at 1.0 (eps/2): the floor of the error ratio, see docs/replay.md."""
    if dtype.is_complex:
        dtype = torch.float64 if dtype == torch.complex128 else torch.float32
    if dtype.is_floating_point:
        return torch.finfo(dtype).eps / 2
    return 0.0


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (so NaN payloads and -0.0 count as they should)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    if a.device == b.device and a.data_ptr() == b.data_ptr() and a.stride() == b.stride():
        return True  # the same memory (a view of a cached input, say)
    if a.device.type != "cpu" or b.device.type != "cpu":
        view = _BITS[a.element_size()] if not a.is_complex() else None
        if view is None:
            a, b = torch.view_as_real(a), torch.view_as_real(b)
            view = _BITS[a.element_size()]
        return torch.equal(a.view(view), b.view(view))
    if a.stride() == b.stride():  # same layout (a view of each side's input): no copies
        a, b = _dense(a), _dense(b)
    # numpy's byte comparison is several times faster than torch.equal here
    ua = a.contiguous().reshape(-1).view(torch.uint8).numpy()
    ub = b.contiguous().reshape(-1).view(torch.uint8).numpy()
    if ua.size % 8 == 0:  # compare 8 bytes at a time: half the time of a byte compare
        ua, ub = ua.view(np.int64), ub.view(np.int64)
    return _equal_by_chunks(ua, ub)


_CHUNK_BYTES = 256 << 10  # fits in L2: the comparison's temporary stays in cache


def _equal_by_chunks(a: np.ndarray, b: np.ndarray) -> bool:
    """np.array_equal over cache-sized chunks, stopping at the first chunk that differs: an
    output off the reference (most of them on a device unlike the CPU) is told apart after
    its first 256 KB instead of a pass over all of it; equal ones cost what one pass costs."""
    step = max(1, _CHUNK_BYTES // a.itemsize)
    for i in range(0, a.size, step):
        if not np.array_equal(a[i:i + step], b[i:i + step]):
            return False
    return True


def _dense(t: torch.Tensor) -> torch.Tensor:
    """`t` with its dimensions ordered by stride: contiguous (so compared without a copy)
    where `t` is a permutation of a dense block; two tensors of one shape and strides map
    element for element."""
    if t.is_contiguous() or t.dim() < 2:
        return t
    order = sorted(range(t.dim()), key=lambda d: -t.stride(d))
    p = t.permute(order)
    return p if p.is_contiguous() else t


def _f64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        return torch.view_as_real(t.to(torch.complex128)).reshape(-1)
    return t.to(torch.float64).reshape(-1)


def _nan_aware(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """(||a-b||, max|a-b|, ||b finite||) where matching NaN/inf count as no difference."""
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    diff = torch.where(same, 0.0, a - b)
    if not torch.isfinite(diff).all():
        return math.inf, math.inf, float(torch.linalg.vector_norm(
            torch.where(torch.isfinite(b), b, 0.0)))
    return (float(torch.linalg.vector_norm(diff)), float(diff.abs().max()),
            float(torch.linalg.vector_norm(torch.where(torch.isfinite(b), b, 0.0))))


def compare(x: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, float]:
    """(relative L2 error, max abs error, cosine) of x against ref, in one float64 pass.

    Relative error is ||x - ref|| / ||ref|| (absolute when ||ref|| is 0). NaN/inf where the
    reference holds the same value count as no error; anywhere else they make the error inf.
    Cosine is 1 when both are ~0 (msaccucmp's convention) and NaN when either is non-finite.
    """
    if x.numel() == 0:
        return 0.0, 0.0, 1.0
    if x.is_complex() or ref.is_complex() or not (
            x.is_floating_point() and ref.is_floating_point()):
        a, b = _f64(x), _f64(ref)
    else:
        fused = _fused_compare(x.detach(), ref.detach())  # an fp32 side read as it is
        if fused is not None:
            return fused
        # no flattening copies: the norms take any strides
        a, b = x.detach().to(torch.float64), ref.detach().to(torch.float64)
        fused = _fused_compare(a, b)
        if fused is not None:
            return fused
    na = float(torch.linalg.vector_norm(a))
    den = float(torch.linalg.vector_norm(b))
    # a - b in place when `a` is already a private float64 copy
    diff = a.sub_(b) if a.data_ptr() != x.data_ptr() else a - b
    num = float(torch.linalg.vector_norm(diff))
    if math.isfinite(num):  # the common case: everything finite, no masking needed
        lo, hi = torch.aminmax(diff)  # several times faster than the inf-norm
        mx = max(-float(lo), float(hi))
    else:
        num, mx, den = _nan_aware(_f64(x), _f64(ref))
    del diff, a
    # a.b from the three norms: saves a pass; its rounding (~1e-16) is harmless here
    return _figures(na, den, num, (na * na + den * den - num * num) / 2, mx)


def _fused_compare(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float] | None:
    """`compare` of two contiguous CPU tensors, `b` float64 and `a` float64 or float32, in
    one C pass (accuracy/native: the compare's kernel, whose relative-error figures are not
    used here); None where the kernels are not built, the dtypes or layout do not suit, or a
    value is not finite (the torch path sets matching NaN/inf apart)."""
    if (a.dtype not in (torch.float32, torch.float64) or b.dtype != torch.float64
            or a.device.type != "cpu" or b.device.type != "cpu" or a.shape != b.shape
            or not (a.is_contiguous() and b.is_contiguous())):
        return None
    got = native.compare_pass(a.data_ptr(), b.data_ptr(), a.numel(), 1.0,
                              mine_fp32=a.dtype == torch.float32)
    if got is None:
        return None
    sxx, syy, sxy, sdd, _sad, max_ad, _srel, _max_rel = got[0]
    return _figures(math.sqrt(sxx), math.sqrt(syy), math.sqrt(sdd), sxy, max_ad)


def _figures(na: float, den: float, num: float, dot: float, mx: float
             ) -> tuple[float, float, float]:
    """(relative L2 error, max abs error, cosine) from the norms of x, ref and x - ref, and
    x.ref (see `compare`)."""
    rel = num / den if den > 0 else num
    if not (math.isfinite(na) and math.isfinite(den) and math.isfinite(num)):
        cos = math.nan
    elif na < 1e-300 and den < 1e-300:
        cos = 1.0
    elif na < 1e-300 or den < 1e-300:
        cos = 0.0
    else:
        cos = min(1.0, max(-1.0, dot / (na * den)))
    return rel, mx, cos


def error_ratio(err_device: float, err_reference: float, floor: float) -> float:
    """err_device / err_reference, both floored at the dtype's unit roundoff.

    Integer and bool outputs have floor 0: the ratio is 1 when they match, inf when not.
    """
    if floor <= 0:
        return 1.0 if err_device == 0 else math.inf
    d, r = max(err_device, floor), max(err_reference, floor)
    if math.isinf(d):
        return math.inf if not math.isinf(r) else 1.0
    return d / r


def output_metrics(idx: int, device: torch.Tensor, same: torch.Tensor,
                   high: torch.Tensor) -> dict[str, Any]:
    """The `extra["replay"]["outputs"]` entry for one output (keys fixed: compare reads them)."""
    exact = bit_equal(device, same)
    if device.is_floating_point() or device.is_complex():
        e_dev, mx, cos = compare(device, high)
        e_ref = e_dev if exact else (0.0 if same is high else compare(same, high)[0])
        floor = unit_roundoff(device.dtype)
    else:  # integers and bools: the exact same-dtype result is the reference
        e_dev = 0.0 if exact else float((device != same).sum()) / max(device.numel(), 1)
        _, mx, cos = (0.0, 0.0, 1.0) if exact else compare(device, same)
        e_ref, floor = 0.0, 0.0
    return {
        "idx": idx,
        "err_device": e_dev,
        "err_reference": e_ref,
        "error_ratio": error_ratio(e_dev, e_ref, floor),
        "max_abs": mx,
        "cosine": cos,
        "bit_exact": exact,
    }


def agreeing_metrics(idx: int) -> dict[str, Any]:
    """Device output bit-identical to the same-dtype reference: ratio 1 by definition.

    The errors against fp64 are not computed (null): they would be the reference's own, and
    the fp64 run is the most expensive part of a replay.
    """
    return {"idx": idx, "err_device": None, "err_reference": None, "error_ratio": 1.0,
            "max_abs": 0.0, "cosine": 1.0, "bit_exact": True}


def exact_metrics(idx: int, device: Any, ref: torch.Tensor, equal: bool | None = None
                  ) -> dict[str, Any]:
    """Metrics for an op whose reference is exact (views, copies): no upcast run needed.
    equal: True when the bits are already known equal (`device` need not be read)."""
    if equal or bit_equal(device, ref):
        return {"idx": idx, "err_device": 0.0, "err_reference": 0.0, "error_ratio": 1.0,
                "max_abs": 0.0, "cosine": 1.0, "bit_exact": True}
    floating = device.is_floating_point() or device.is_complex()
    e_dev, mx, cos = compare(device, ref)
    if not floating:
        e_dev = float((device != ref).sum()) / max(device.numel(), 1)
    floor = unit_roundoff(device.dtype)
    return {"idx": idx, "err_device": e_dev, "err_reference": 0.0,
            "error_ratio": error_ratio(e_dev, 0.0, floor), "max_abs": mx, "cosine": cos,
            "bit_exact": False}
