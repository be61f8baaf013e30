"""Dtype names as stored in a dump, and their values decoded with numpy alone.

A dump stores each tensor's raw little-endian bytes and its torch dtype name ("bfloat16",
"float8_e4m3fn"). Reading and comparing needs only numpy: bfloat16 is the top half of a
float32, and every 8-bit float format has 256 codes, decoded through a table built here.
So `accuracy compare` never imports torch; `torch_dtype` imports it only when asked.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

# Names numpy reads directly.
NUMPY: dict[str, type[np.generic]] = {
    "float16": np.float16, "float32": np.float32, "float64": np.float64,
    "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32,
    "int64": np.int64, "bool": np.bool_, "uint16": np.uint16, "uint32": np.uint32,
    "uint64": np.uint64,
}
# Complex tensors are compared as their real view (real and imaginary parts interleaved).
COMPLEX_PART: dict[str, str] = {"complex32": "float16", "complex64": "float32",
                                "complex128": "float64"}
# 8-bit floats: (exponent bits, mantissa bits, exponent bias, kind). Kinds: "ieee" (inf and
# NaN at the top exponent), "fn" (no inf; NaN only where exponent and mantissa are all ones),
# "fnuz" (no inf, no negative zero: 0x80 is the one NaN), "e8m0" (unsigned powers of two).
FLOAT8: dict[str, tuple[int, int, int, str]] = {
    "float8_e4m3fn": (4, 3, 7, "fn"), "float8_e5m2": (5, 2, 15, "ieee"),
    "float8_e4m3fnuz": (4, 3, 8, "fnuz"), "float8_e5m2fnuz": (5, 2, 16, "fnuz"),
    "float8_e8m0fnu": (8, 0, 127, "e8m0"),
}

# Bytes per element of every dtype torch 2.x can name (sub-byte and quantized dtypes included,
# so a dump holding one still opens; only the dtypes above decode to values).
ITEMSIZE: dict[str, int] = {
    **{n: np.dtype(t).itemsize for n, t in NUMPY.items()},
    "bfloat16": 2, "complex32": 4, "complex64": 8, "complex128": 16,
    **{n: 1 for n in FLOAT8}, "float4_e2m1fn_x2": 1,
    "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
    "qint8": 1, "quint8": 1, "qint32": 4, "quint2x4": 1, "quint4x2": 1,
    **{f"int{b}": 1 for b in range(1, 8)}, **{f"uint{b}": 1 for b in range(1, 8)},
}

# torch.finfo(dtype).eps of the floating dtypes (the test checks each against torch).
EPS: dict[str, float] = {
    "float16": 2.0 ** -10, "float32": 2.0 ** -23, "float64": 2.0 ** -52, "bfloat16": 2.0 ** -7,
    "complex32": 2.0 ** -10, "complex64": 2.0 ** -23, "complex128": 2.0 ** -52,
    "float8_e4m3fn": 2.0 ** -3, "float8_e4m3fnuz": 2.0 ** -3, "float8_e5m2": 2.0 ** -2,
    "float8_e5m2fnuz": 2.0 ** -3, "float8_e8m0fnu": 1.0,
}


def itemsize(name: str) -> int:
    """Bytes per element of a stored dtype name; ValueError for a name no torch has."""
    try:
        return ITEMSIZE[name]
    except KeyError:
        raise ValueError(f"unknown tensor dtype {name!r}") from None


def value_dtype(name: str) -> str:
    """The dtype of the values compared: a complex dtype's part, else the dtype itself."""
    return COMPLEX_PART.get(name, name)


def is_float(name: str) -> bool:
    return name.startswith(("float", "bfloat", "complex"))


def eps(name: str) -> float:
    """Machine epsilon of a floating dtype name; float32's for any other (a denominator floor)."""
    return EPS.get(name, EPS["float32"])


def decodable(name: str) -> bool:
    """Whether `decode` turns this dtype's bytes into values."""
    vd = value_dtype(name)
    return vd in NUMPY or vd == "bfloat16" or vd in FLOAT8


@cache
def float8_table(name: str) -> np.ndarray:
    """The float32 value of each of the 256 codes of an 8-bit float format."""
    e_bits, m_bits, bias, kind = FLOAT8[name]
    code = np.arange(256, dtype=np.int64)
    if kind == "e8m0":
        out = np.ldexp(1.0, code - bias)
        out[255] = np.nan
        return out.astype(np.float32)
    sign = np.where(code >> 7, -1.0, 1.0)
    exp = (code >> m_bits) & ((1 << e_bits) - 1)
    man = code & ((1 << m_bits) - 1)
    frac = man / float(1 << m_bits)
    normal = np.ldexp(1.0 + frac, exp - bias)
    subnormal = np.ldexp(frac, 1 - bias)
    out = sign * np.where(exp == 0, subnormal, normal)
    top = exp == (1 << e_bits) - 1
    nan = np.copysign(np.nan, sign)  # NaN keeps its sign bit, as torch decodes it
    if kind == "ieee":
        inf = top & (man == 0)
        out[inf] = sign[inf] * np.inf
        out[top & (man != 0)] = nan[top & (man != 0)]
    elif kind == "fn":
        out[top & (man == (1 << m_bits) - 1)] = nan[top & (man == (1 << m_bits) - 1)]
    else:  # fnuz: the negative-zero code is the one NaN
        out[0x80] = np.nan
    return out.astype(np.float32)


def decode(raw: np.ndarray, name: str, out: np.ndarray | None = None, *,
           quiet: bool = True) -> np.ndarray:
    """Raw little-endian bytes (uint8) -> float64 values, into `out` when given.

    Exact: every value of these dtypes is a float64 value. ValueError for a dtype that has no
    numeric decoding (sub-byte, quantized, bit containers). Signalling NaNs become quiet NaNs,
    as in torch; `quiet=False` leaves numpy's floating-point error state to the caller (a loop
    decoding many chunks sets it once: entering `np.errstate` costs microseconds).
    """
    if quiet:
        with np.errstate(invalid="ignore"):
            return decode(raw, name, out, quiet=False)
    vd = value_dtype(name)
    if vd in NUMPY:
        vals = raw.view(NUMPY[vd])
    elif vd == "bfloat16":
        bits = raw.view(np.uint16).astype(np.uint32)
        bits <<= 16
        vals = bits.view(np.float32)
    elif vd in FLOAT8:
        vals = float8_table(vd)[raw]
    else:
        raise ValueError(f"dtype {name!r} has no numeric decoding: not compared")
    if out is None:
        return vals.astype(np.float64)
    out = out[: vals.size]
    np.copyto(out, vals, casting="unsafe")
    return out


def dtype_name(dtype: torch.dtype) -> str:
    """`torch.float32` -> "float32": the name stored in the file."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """Inverse of `dtype_name` (imports torch); ValueError for a dtype this torch lacks. The
    name comes from a file: it is looked up in torch's own table of dtypes, never as an
    attribute of the `torch` module (whose `__getattr__` imports submodules by name)."""
    import torch

    dt = torch_dtypes().get(name) if isinstance(name, str) else None
    if dt is None:
        raise ValueError(f"dtype {str(name)[:40]!r} is not known to torch {torch.__version__}")
    return dt


_TORCH_DTYPES: dict[str, torch.dtype] = {}


def torch_dtypes() -> dict[str, torch.dtype]:
    """Name -> torch dtype, for every dtype the `torch` module defines (`float32`, and the
    aliases `float`, `half`...)."""
    if not _TORCH_DTYPES:
        import torch

        _TORCH_DTYPES.update({k: v for k, v in vars(torch).items()
                              if isinstance(v, torch.dtype)})
    return _TORCH_DTYPES
