"""Rounding rules: how a device's matrix unit sees an input, expressed on CPU tensors.

Each rule maps a tensor to a tensor of the *same dtype* whose values are what the device would
have used (e.g. fp32 values rounded to the nearest fp16). Tensors a rule does not apply to
(integers, or dtypes already as narrow as the target) come back unchanged.

Rules run inside `sim`'s dispatch handler, with dispatch disabled by the caller.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Rounding = Callable[[torch.Tensor], torch.Tensor]

_ROUNDINGS: dict[str, Rounding] = {}
_DESCRIPTIONS: dict[str, str] = {}


def register_rounding(name: str, fn: Rounding, description: str = "") -> None:
    """Make a rounding rule usable by name in profiles."""
    doc = (fn.__doc__ or "").strip()
    _ROUNDINGS[name] = fn
    _DESCRIPTIONS[name] = description or (doc.splitlines()[0] if doc else "")


def get_rounding(name: str) -> Rounding:
    """The rounding rule registered under `name`."""
    try:
        return _ROUNDINGS[name]
    except KeyError:
        known = ", ".join(sorted(_ROUNDINGS))
        raise ValueError(f"unknown rounding {name!r}; known: {known}") from None


def roundings() -> dict[str, str]:
    """Registered rounding names and one-line descriptions."""
    return dict(_DESCRIPTIONS)


def _wider_float(t: torch.Tensor, target: torch.dtype) -> bool:
    """Whether rounding `t` to `target` loses anything: a wider format, or one of the same
    width with more mantissa bits (fp16 values rounded to bf16's 7 bits)."""
    if not t.is_floating_point() or t.dtype == target:
        return False
    return (t.dtype.itemsize > target.itemsize
            or torch.finfo(t.dtype).eps < torch.finfo(target).eps)


def to_fp16(t: torch.Tensor) -> torch.Tensor:
    """Round to the nearest IEEE half (overflow gives inf, as a real fp16 cast does)."""
    if not _wider_float(t, torch.float16):
        return t
    return t.to(torch.float16).to(t.dtype)


def to_bf16(t: torch.Tensor) -> torch.Tensor:
    """Round to the nearest bfloat16 (8 exponent bits, 7 mantissa bits)."""
    if not _wider_float(t, torch.bfloat16):
        return t
    out = t.to(torch.bfloat16).to(t.dtype)
    if t.dtype == torch.float16:  # 65504 rounds to bf16's 65536, past fp16's range: keep it
        out = torch.where(torch.isinf(out) & torch.isfinite(t), t, out)
    return out


def to_tf32(t: torch.Tensor) -> torch.Tensor:
    """Round fp32 to 10 mantissa bits, nearest-even (TF32 tensor cores). Other dtypes unchanged."""
    if t.dtype != torch.float32:
        return t
    bits = t.contiguous().view(torch.int32)
    # Finite values only: rounding up carries into the exponent, which is exactly right, and
    # no finite pattern can carry into the sign bit, so int32 arithmetic cannot overflow.
    lsb = torch.bitwise_and(torch.bitwise_right_shift(bits, 13), 1)
    rounded = torch.bitwise_and(bits + 0x0FFF + lsb, -0x2000)
    out = torch.where(torch.isfinite(t.contiguous()), rounded, bits).view(torch.float32)
    return out.reshape(t.shape)


def _fp8_scaled(t: torch.Tensor, fp8: torch.dtype) -> torch.Tensor:
    if not _wider_float(t, fp8):
        return t
    finite = torch.isfinite(t)
    wide = t.to(torch.float32)
    amax = torch.where(finite, wide.abs(), torch.zeros_like(wide)).max() if t.numel() else None
    if amax is None or float(amax) == 0.0:
        return t
    scale = amax / torch.finfo(fp8).max
    q = (wide / scale).to(fp8).to(torch.float32) * scale
    # Non-finite values have no fp8 e4m3 encoding: leave them as they were.
    return torch.where(finite, q, wide).to(t.dtype)


def to_fp8_e4m3(t: torch.Tensor) -> torch.Tensor:
    """Quantise to float8_e4m3fn with one per-tensor scale (amax maps to 448)."""
    return _fp8_scaled(t, torch.float8_e4m3fn)


def to_fp8_e5m2(t: torch.Tensor) -> torch.Tensor:
    """Quantise to float8_e5m2 with one per-tensor scale (amax maps to 57344)."""
    return _fp8_scaled(t, torch.float8_e5m2)


def identity(t: torch.Tensor) -> torch.Tensor:
    """No change."""
    return t


register_rounding("none", identity)
register_rounding("fp16", to_fp16)
register_rounding("bf16", to_bf16)
register_rounding("tf32", to_tf32)
register_rounding("fp8-e4m3", to_fp8_e4m3)
register_rounding("fp8-e5m2", to_fp8_e5m2)


def to_fp4_e2m1(t: torch.Tensor) -> torch.Tensor:
    """Quantise to fp4 e2m1 with one e8m0 scale per 32 elements of the last dimension (MX)."""
    from .formats import E2M1, quantize

    if not t.is_floating_point() or t.numel() == 0:
        return t
    return quantize(t, E2M1, block=32, figures=False).value


register_rounding("fp4-e2m1", to_fp4_e2m1)
