"""The stored checksum, recomputed from a tensor's bytes with numpy (no torch, any size).

The dumper (accuracy/dumpfile/stats.py) sums the raw bit patterns of the elements: a 1-byte
element as uint8, 2/4/8-byte elements as int16/int32/int64, the parts of a complex number
separately; the sum wraps in int32 (int64 for 8-byte parts). Summation with wrap-around is
order-free, so the same value comes from any split of the bytes into pieces.
"""

from __future__ import annotations

import numpy as np

_BITS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}
_WRAP = {4: np.uint32, 8: np.uint64}  # parts whose own width holds the checksum's modulus
_COMPLEX_PART = {"complex32": 2, "complex64": 4, "complex128": 8}


def part_size(dtype: str, itemsize: int) -> int:
    """Bytes per summed part: the element, or half of it for a complex dtype."""
    return _COMPLEX_PART.get(dtype, itemsize)


class Checksum:
    """A running checksum over consecutive pieces of one tensor's bytes."""

    def __init__(self, part: int) -> None:
        self._view = _BITS[part]
        self._wrap = _WRAP.get(part)
        self._bits = 64 if part == 8 else 32
        self._total = 0

    def update(self, raw: np.ndarray) -> None:
        """Add a piece of the bytes (its length must be a multiple of the part size)."""
        if not raw.size:
            return
        wrap = self._wrap
        if wrap is not None:
            # 4- and 8-byte parts: summed in their own width, wrapping (no widening pass);
            # the checksum is the sum modulo 2**32 or 2**64, so the wrapped sum is exact.
            self._total += int(raw.view(wrap).sum(dtype=wrap))
        else:
            # numpy wraps int64 sums mod 2**64, which 2**32 divides: exact for both widths
            self._total += int(raw.view(self._view).sum(dtype=np.int64))

    @property
    def value(self) -> int:
        """The checksum as stored: wrapped to a signed 32- or 64-bit integer."""
        mod = 1 << self._bits
        v = self._total % mod
        return v - mod if v >= mod >> 1 else v


def checksum(raw: np.ndarray, part: int) -> int:
    c = Checksum(part)
    c.update(raw)
    return c.value
