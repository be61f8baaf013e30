"""Strided rows (schema 6): a view's elements read out of bytes another row stored.

A tensor dump stores each storage version's bytes once; a view of them (`t`, `transpose`,
`select`, `squeeze` of a stored tensor) is a row that names where its element 0 lies
(`offset`) and its strides, instead of its own copy. A row read from a file is untrusted:
`check_rows` refuses, before any byte is read, a strided row whose elements reach past the
committed data, or share bytes (an overlapping layout would let a few stored bytes claim any
number of elements: numpy's `as_strided` checks nothing), and only then does `gather` apply
the strides, to a buffer holding exactly the row's span.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np

# numpy dtypes of each item size, to move raw elements (bfloat16, float8... are bytes to us)
_MOVERS = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
           8: np.dtype(np.uint64)}


def span(shape: Sequence[int], stride: Sequence[int], itemsize: int) -> int:
    """Bytes from element 0 to the end of the last element a layout reaches (0 when empty)."""
    if any(n == 0 for n in shape):
        return 0
    return itemsize * (1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)))


def problem(shape: Sequence[int], stride: Sequence[int], itemsize: int, offset: int,
            blob_len: int) -> str:
    """Why a strided row cannot be read from `blob_len` committed bytes, or ''. Python ints:
    no overflow whatever a file holds."""
    if len(stride) != len(shape):
        return "strides do not match its dimensions"
    dims = sorted((s, n) for n, s in zip(shape, stride, strict=True) if n > 1)
    if any(s < 0 for s, _ in dims):
        return "negative stride"
    reach = 0  # elements the dimensions sorted so far span, less one
    for s, n in dims:
        if s <= reach:
            return "overlapping strides (two elements in the same bytes)"
        reach += (n - 1) * s
    if offset < 0 or offset + span(shape, stride, itemsize) > blob_len:
        return "strided elements run past the end of the data"
    return ""


def check_rows(shapes: list[list[int]], strides: list[list[int]], ndims: list[int],
               itemsizes: list[int], offsets: list[int], blob_len: int,
               rows: list[int]) -> tuple[int, str] | None:
    """(row, why) of the first strided row that cannot be read, or None."""
    for row, shape, stride, ndim, size, off in zip(rows, shapes, strides, ndims, itemsizes,
                                                   offsets, strict=True):
        if ndim < 0:
            return row, "strided without a shape"
        why = problem(shape[:ndim], stride[:ndim], size, off, blob_len)
        if why:
            return row, why
    return None


def mover(itemsize: int) -> np.dtype:
    """A numpy dtype of `itemsize` bytes to move raw elements with."""
    return _MOVERS.get(itemsize) or np.dtype(f"V{itemsize}")


def strided_view(raw: np.ndarray, shape: Sequence[int], stride: Sequence[int],
                 itemsize: int) -> np.ndarray:
    """The elements of a layout over `raw` (uint8, starting at element 0, at least
    `span(...)` bytes: checked here too), as a read-only strided array; no copy."""
    need = span(shape, stride, itemsize)
    if raw.size < need or any(s < 0 for s in stride):
        raise ValueError(f"strided view needs {need} bytes, has {raw.size}")
    if any(n == 0 for n in shape):
        return np.empty(tuple(shape), mover(itemsize))
    base = np.ascontiguousarray(raw[:need]).view(mover(itemsize))
    return np.lib.stride_tricks.as_strided(
        base, tuple(shape), tuple(s * itemsize for s in stride), writeable=False)


def gather(raw: np.ndarray, shape: Sequence[int], stride: Sequence[int],
           itemsize: int) -> np.ndarray:
    """A strided layout's elements in row-major order, as a new uint8 array."""
    out = np.ascontiguousarray(strided_view(raw, shape, stride, itemsize))
    return out.reshape(-1).view(np.uint8)


def gather_window(raw: np.ndarray, shape: Sequence[int], stride: Sequence[int],
                  itemsize: int, start: int, stop: int) -> np.ndarray:
    """Row-major elements [start, stop) of a strided layout over `raw`, as uint8 bytes:
    only that window is copied (compare reads big tensors in windows)."""
    view = strided_view(raw, shape, stride, itemsize)
    if view.ndim == 0:
        return np.ascontiguousarray(view).reshape(-1)[start:stop].view(np.uint8)
    return np.ascontiguousarray(view.flat[start:stop]).view(np.uint8)


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= max(n, 1)
    return tuple(reversed(out))


def row_major(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether `stride` walks `shape` in row-major order (asked for each row a reader or a
    replay meets, twice or more: the answer per distinct pair is kept)."""
    return _row_major(tuple(shape), tuple(stride))


@functools.lru_cache(maxsize=4096)
def _row_major(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    return all(n == 1 or s == r for n, s, r in zip(shape, stride, row_major_strides(shape),
                                                   strict=True))
