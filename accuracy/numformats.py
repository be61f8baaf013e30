"""Number formats, as data: limits, mantissa bits, unit roundoff (imports nothing).

The one table every part reads: `sim`'s fp8/MX profiles and the quantisation figures
(accuracy/device_backend/formats.py, which adds the rounding and scaling code) and the
compare's honest bound (accuracy/compare/precision.py, numerics.py), which must stay
importable without torch, hence a module of its own outside device_backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Format:
    """A floating-point element format.

    Attributes:
        name: our short name ("e4m3", "e5m2", "e2m1", "fp16", ...).
        dtype: the dtype name the compare uses ("float8_e4m3fn", "float16", ...).
        exponent_bits, mantissa_bits: field widths (mantissa without the implicit bit).
        max: largest finite value; min_normal: smallest normal; min_subnormal: smallest
            positive subnormal (the spacing of the subnormal range).
        emax: exponent of the largest normal binade (MX: element emax).
    """

    name: str
    dtype: str
    exponent_bits: int
    mantissa_bits: int
    max: float
    min_normal: float
    min_subnormal: float
    emax: int

    @property
    def unit_roundoff(self) -> float:
        """Relative rounding error bound of a normal value (round to nearest)."""
        return 2.0 ** -(self.mantissa_bits + 1)

    @property
    def torch_dtype(self) -> Any:
        """The torch dtype of this format, or None (tf32, fp4: no element dtype)."""
        import torch

        return getattr(torch, self.dtype, None) if self.dtype != "tf32" else None


FP32 = Format("fp32", "float32", 8, 23, 3.4028234663852886e38, 2.0 ** -126,
              2.0 ** -149, 127)
FP16 = Format("fp16", "float16", 5, 10, 65504.0, 2.0 ** -14, 2.0 ** -24, 15)
BF16 = Format("bf16", "bfloat16", 8, 7, 3.3895313892515355e38, 2.0 ** -126,
              2.0 ** -133, 127)
TF32 = Format("tf32", "tf32", 8, 10, 3.4028234663852886e38, 2.0 ** -126,
              2.0 ** -136, 127)
E4M3 = Format("e4m3", "float8_e4m3fn", 4, 3, 448.0, 2.0 ** -6, 2.0 ** -9, 8)
E5M2 = Format("e5m2", "float8_e5m2", 5, 2, 57344.0, 2.0 ** -14, 2.0 ** -16, 15)
E2M1 = Format("e2m1", "float4_e2m1", 2, 1, 6.0, 1.0, 0.5, 2)
# The MX block scale: 8 exponent bits, no mantissa, 2^-127 .. 2^127 (0xFF is NaN).
E8M0_MIN_EXP, E8M0_MAX_EXP = -127, 127
MX_BLOCK = 32

FORMATS: dict[str, Format] = {f.name: f for f in (FP32, FP16, BF16, TF32, E4M3, E5M2, E2M1)}
FORMATS.update({f.dtype: f for f in list(FORMATS.values())})


def get_format(name: str) -> Format:
    """A format by our name ("e4m3") or its dtype name ("float8_e4m3fn")."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown number format {name!r}; known: "
                         f"{', '.join(sorted(FORMATS))}") from None


def unit_roundoffs() -> dict[str, float]:
    """dtype name -> unit roundoff, for every format here (the compare's bound uses it)."""
    return {f.dtype: f.unit_roundoff for f in FORMATS.values()}


def subnormal_spacings() -> dict[str, float]:
    """dtype name -> spacing of the subnormal range, for the narrow formats (fp16 and below)."""
    return {f.dtype: f.min_subnormal for f in FORMATS.values() if f.exponent_bits <= 5}
