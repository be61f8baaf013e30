"""Number formats in one place: their limits, how values round to them, and block scaling.

`sim`'s fp8/MX profiles quantise with these, the replay re-quantises honestly with them, and
the compare's bounds take their unit roundoff from them, so a format's max, smallest normal,
subnormal spacing and mantissa bits are written down exactly once.

Scaling follows TransformerEngine's convention: `scale` multiplies a tensor before the cast
(amax -> the format's max for per-tensor current scaling), `scale_inv = 1 / scale` multiplies
the GEMM's result back. MX formats (OCP Microscaling v1.0) share one power-of-two (e8m0) scale
per block of 32 consecutive elements along the reduction dimension.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from accuracy.numformats import (  # noqa: F401  (re-exported: the formats' one table)
    BF16,
    E2M1,
    E4M3,
    E5M2,
    E8M0_MAX_EXP,
    E8M0_MIN_EXP,
    FORMATS,
    FP16,
    FP32,
    MX_BLOCK,
    TF32,
    Format,
    get_format,
    unit_roundoffs,
)


def round_to(x: torch.Tensor, fmt: Format, saturate: bool = True,
             finite: bool = False) -> torch.Tensor:
    """fp32 values rounded to the nearest value of `fmt` (ties to even), as fp32.

    Out of range: clipped to +-max when `saturate` (what fp8 training casts do), else inf.
    Non-finite values stay as they are (`finite=True`: the caller knows there are none).
    """
    x = x.to(torch.float32)
    if saturate:
        clipped = x.clamp(-fmt.max, fmt.max)
        x = clipped if finite else torch.where(torch.isinf(x), x, clipped)
    dt = fmt.torch_dtype
    if dt is not None and dt.is_floating_point and dt.itemsize <= 2:
        out = x.to(dt).to(torch.float32)
        if not saturate and fmt.name == "e4m3":  # e4m3fn has no inf: out of range is NaN
            out = torch.where(x.abs() > fmt.max, x.sign() * math.inf, out)
        return out
    # generic: the spacing of x's binade (the subnormal spacing below min_normal)
    mag = x.abs()
    _, e = torch.frexp(torch.where(mag > 0, mag, torch.ones_like(mag)))
    exp = torch.clamp(e.to(torch.float32) - 1, min=math.log2(fmt.min_normal))
    step = torch.exp2(exp - fmt.mantissa_bits)
    q = torch.round(mag / step) * step
    if not saturate:
        q = torch.where(q > fmt.max, torch.full_like(q, math.inf), q)
    else:
        q = q.clamp(max=fmt.max)
    return torch.where(torch.isfinite(x), torch.copysign(q, x), x)


def _finite_abs(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    return torch.where(torch.isfinite(a), a, torch.zeros_like(a))


def tensor_scale(amax: float, fmt: Format, margin: int = 0) -> float:
    """Per-tensor scale (TE): fmt.max / amax / 2^margin; 1 where amax is 0 or not finite."""
    if not (amax > 0 and math.isfinite(amax)):
        return 1.0
    s = fmt.max / amax / (2.0 ** margin)
    return s if math.isfinite(s) and s > 0 else 1.0


def blocks(x: torch.Tensor, axis: int, size: int) -> torch.Tensor:
    """`x` as (n_blocks, size) along `axis` (zero-padded at the end of that axis)."""
    x = x.movedim(axis, -1)
    n = x.shape[-1]
    pad = (-n) % size
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(-1, size)


def unblock(b: torch.Tensor, like: torch.Tensor, axis: int) -> torch.Tensor:
    """Inverse of `blocks` for a tensor shaped like `like`."""
    moved = like.movedim(axis, -1)
    n = moved.shape[-1]
    padded = list(moved.shape[:-1]) + [n + (-n) % b.shape[-1]]
    return b.reshape(padded)[..., :n].movedim(-1, axis)


def mx_scales(b: torch.Tensor, fmt: Format) -> torch.Tensor:
    """One e8m0 scale per block row of `b`, as the factor that multiplies the block before the
    cast (the inverse of the shared scale X). X = 2^ceil(log2(amax / max)), rounded up as
    TransformerEngine's MXFP8 does, so no element saturates (the OCP spec's
    2^(floor(log2 amax) - emax) clips the top of the block: up to 12.5% for e4m3)."""
    amax = _finite_abs(b).amax(dim=-1, keepdim=True)
    safe = torch.where(amax > 0, amax, torch.full_like(amax, fmt.max))
    shared = torch.ceil(torch.log2(safe / fmt.max))
    shared = shared.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)
    return torch.exp2(-shared)


@dataclass
class Quantized:
    """A quantised operand: dequantised values (x's dtype) and the figures of the cast."""

    value: torch.Tensor
    figures: dict[str, Any]


def quantize(x: torch.Tensor, fmt: Format, *, block: int = 0, axis: int = -1,
             scale: float | None = None, scale_factor: float = 1.0,
             inv_factor: float = 1.0, saturate: bool = True,
             figures: bool = True) -> Quantized:
    """Quantise `x` to `fmt` and back (fp32 accumulate follows in the caller's GEMM).

    block=0: one per-tensor `scale` (None: current scaling, amax -> max). block=N: MX, one
    e8m0 scale per N elements along `axis`. `scale_factor` multiplies the scale used to cast,
    leaving scale_inv as the honest scale's inverse, and `inv_factor` divides scale_inv
    (faults; both 1 for an honest kernel). Figures report the scale and scale_inv used.
    Non-finite elements pass through unchanged and are left out of the figures.
    """
    wide = x.detach().to(torch.float32)
    all_finite = bool(torch.isfinite(wide).all()) if wide.numel() else True
    if block:
        ax = axis % wide.dim() if wide.dim() else 0
        shaped = wide if wide.dim() else wide.reshape(1)
        b = blocks(shaped, ax, block)
        honest = mx_scales(b, fmt)
        s_used = honest * scale_factor
        scaled = b * s_used
        q_b = round_to(scaled, fmt, saturate, all_finite)
        deq = unblock(q_b / (honest * inv_factor), shaped, ax).reshape(wide.shape)
        scaled_full = unblock(scaled, shaped, ax).reshape(wide.shape)
        q_full = unblock(q_b, shaped, ax).reshape(wide.shape)
        inv = 1.0 / (honest * inv_factor)
    else:
        if scale is None:
            amax = float(_finite_abs(wide).max()) if wide.numel() else 0.0
            scale = tensor_scale(amax, fmt)
        s_used = torch.tensor(scale * scale_factor)
        scaled_full = wide * s_used
        q_full = round_to(scaled_full, fmt, saturate, all_finite)
        inv = torch.tensor(1.0 / (scale * inv_factor))
        deq = q_full * inv
    if not all_finite:
        deq = torch.where(torch.isfinite(wide), deq, wide)
    # the operand's own strides: a kernel sees its layout unchanged (the op stream too)
    out = torch.empty_like(x, memory_format=torch.preserve_format).copy_(deq)
    if not figures:
        return Quantized(out, {})
    return Quantized(out, operand_figures(wide, deq, scaled_full, q_full, fmt, s_used, inv,
                                          block, axis, all_finite))


def operand_figures(x: torch.Tensor, deq: torch.Tensor, scaled: torch.Tensor,
                    q: torch.Tensor, fmt: Format, scale: torch.Tensor,
                    scale_inv: torch.Tensor, block: int, axis: int,
                    all_finite: bool = False) -> dict[str, Any]:
    """What TE's debug tools show per GEMM operand, computed on the finite elements.

    underflow_pct: nonzero elements cast to 0; overflow_pct: elements that after scaling lie
    beyond max's rounding boundary (saturated, or inf without saturation); scale and
    scale_inv min and max; dynamic_range: log2(amax / smallest nonzero |x|);
    block_dynamic_range: the largest such range within one block of 32 along `axis`; mse and
    rel_error of the dequantised operand against the operand.
    """
    if not all_finite:  # leave non-finite elements out: as zeros, which count nowhere
        finite = torch.isfinite(x)
        n = int(finite.sum())
        zero = torch.zeros_like(x)
        x, deq = torch.where(finite, x, zero), torch.where(finite, deq, zero)
        scaled = torch.where(finite, scaled, zero)
    else:
        n = x.numel()
    a = x.abs()
    nz = x != 0
    n_nz = int(nz.sum())
    under = int((nz & (q == 0)).sum())
    # beyond the rounding boundary above max: clipped, not merely rounded down to max
    over = int((scaled.abs() > fmt.max * (1.0 + fmt.unit_roundoff)).sum())
    amax = float(a.max()) if x.numel() else 0.0
    amin = float(torch.where(nz, a, math.inf).min()) if n_nz else 0.0
    diff = deq - x
    err2 = float(torch.sum(diff * diff, dtype=torch.float64))
    norm2 = float(torch.sum(x * x, dtype=torch.float64))
    figs = {
        "format": fmt.name,
        "block": int(block),
        "numel": n,
        "underflow_pct": 100.0 * under / n_nz if n_nz else 0.0,
        "overflow_pct": 100.0 * over / n if n else 0.0,
        "scale_min": float(scale.min()),
        "scale_max": float(scale.max()),
        "scale_inv_min": float(scale_inv.min()),
        "scale_inv_max": float(scale_inv.max()),
        "amax": amax,
        "dynamic_range": math.log2(amax / amin) if n_nz and amin > 0 else 0.0,
        "block_dynamic_range": _block_range(a, axis),
        "mse": err2 / n if n else 0.0,
        "rel_error": math.sqrt(err2 / norm2) if norm2 > 0 else 0.0,
    }
    return figs


def _block_range(a: torch.Tensor, axis: int) -> float:
    """The largest log2(max/min nonzero) within one block of MX_BLOCK along `axis` of the
    finite magnitudes `a`."""
    if a.numel() == 0:
        return 0.0
    ax = axis % a.dim() if a.dim() else 0
    b = blocks(a if a.dim() else a.reshape(1), ax, MX_BLOCK)
    hi = b.amax(dim=-1)
    lo = torch.where(b > 0, b, math.inf).amin(dim=-1)
    ok = (hi > 0) & torch.isfinite(lo)
    if not bool(ok.any()):
        return 0.0
    return float(torch.log2(hi[ok] / lo[ok]).max())
