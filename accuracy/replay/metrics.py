"""Per-output local-error metrics: device and same-dtype reference, both against the fp64 one.

All arithmetic is in float64 (complex values as their real/imag pairs). See docs/replay.md for
the definitions and why the error ratio has a floor.
"""

from __future__ import annotations

import math
from typing import Any

import torch

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
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    view = _BITS[a.element_size()]
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))


def _f64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.is_complex():
        return torch.view_as_real(t.to(torch.complex128)).reshape(-1)
    return t.to(torch.float64).reshape(-1)


def rel_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Relative L2 error ||x - ref|| / ||ref|| (absolute when ||ref|| is 0).

    NaN/inf where the reference has the same non-finite value count as no error; anywhere else
    a non-finite difference makes the error inf.
    """
    a, b = _f64(x), _f64(ref)
    if a.numel() == 0:
        return 0.0
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    diff = torch.where(same, 0.0, a - b)
    if not torch.isfinite(diff).all():
        return math.inf
    finite_ref = torch.where(torch.isfinite(b), b, 0.0)
    num = float(torch.linalg.vector_norm(diff))
    den = float(torch.linalg.vector_norm(finite_ref))
    return num / den if den > 0 else num


def max_abs(x: torch.Tensor, ref: torch.Tensor) -> float:
    a, b = _f64(x), _f64(ref)
    if a.numel() == 0:
        return 0.0
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    d = torch.where(same, 0.0, (a - b).abs())
    d = torch.where(torch.isnan(d), math.inf, d)
    return float(d.max())


def cosine(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Cosine similarity; 1 when both are ~0 (msaccucmp's convention), NaN if non-finite."""
    a, b = _f64(x), _f64(ref)
    na, nb = float(torch.linalg.vector_norm(a)), float(torch.linalg.vector_norm(b))
    if not (math.isfinite(na) and math.isfinite(nb)):
        return math.nan
    if na < 1e-300 and nb < 1e-300:
        return 1.0
    if na < 1e-300 or nb < 1e-300:
        return 0.0
    return float(torch.dot(a, b)) / (na * nb)


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
    floating = device.is_floating_point() or device.is_complex()
    if floating:
        e_dev, e_ref = rel_error(device, high), rel_error(same, high)
        floor = unit_roundoff(device.dtype)
        target = high
    else:  # integers and bools: the exact same-dtype result is the reference
        e_dev = float((device != same).sum()) / max(device.numel(), 1)
        e_ref, floor, target = 0.0, 0.0, same
    return {
        "idx": idx,
        "err_device": e_dev,
        "err_reference": e_ref,
        "error_ratio": error_ratio(e_dev, e_ref, floor),
        "max_abs": max_abs(device, target),
        "cosine": cosine(device, target),
        "bit_exact": bit_equal(device, same),
    }
