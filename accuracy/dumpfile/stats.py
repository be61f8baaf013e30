"""Per-tensor statistics, computed on the tensor's own device in a handful of reductions.

The result is (floats, checksum): floats = [min, max, mean, l2, nan_count, inf_count] and
checksum = the sum of the raw bit patterns (wrapping in int32, or int64 for 8-byte types).
A tensor dump, whose stored bytes carry a content hash, asks for no sum (`sums=False`: 0 in
its place, one reduction fewer on the training thread; the dump says so, schema.SUMS_ATTR).
On CPU the values are Python numbers; elsewhere they stay device tensors, read by the writer
thread, so the training thread never waits for the device.
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import torch

from accuracy import native
from accuracy.native import fastpath

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


# Below this many elements a CPU tensor's statistics come from numpy: a numpy reduction on a
# small array costs ~1 us, a torch one ~5 us plus an .item() each.
_SMALL = 16384
_NUMPY_BITS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}
_NUMPY_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int64, torch.int32,
                 torch.int16, torch.int8, torch.uint8, torch.bool}
_NUMPY_OF = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
             torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16,
             torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_}


def _small_cpu_stats(t: torch.Tensor, sums: bool = True):
    """The same statistics as tensor_stats, for a small CPU tensor, via numpy."""
    with np.errstate(all="ignore"):  # signalling NaNs and overflow in garbage memory are data
        return _numpy_stats(_numpy_view(t), sums)


def _numpy_view(t: torch.Tensor) -> np.ndarray:
    """The elements of a CPU tensor as a flat numpy array (order not kept where it is dense).

    Not `Tensor.numpy()`: that marks the tensor's storage non-resizable for good, and FSDP2
    frees each unsharded parameter by resizing its storage to 0, which then fails.
    """
    if not t.is_contiguous():
        return t.contiguous().numpy()  # a private copy: its storage is ours
    n = t.numel() * t.element_size()
    buf = (ctypes.c_char * n).from_address(t.data_ptr())
    return np.frombuffer(buf, dtype=np.uint8).view(_NUMPY_OF[t.dtype])


def _numpy_stats(a: np.ndarray, sums: bool = True):
    if a.dtype == np.bool_:
        a = a.view(np.uint8)
    bits = a.view(_NUMPY_BITS[a.itemsize]).sum(
        dtype=np.int64 if a.itemsize == 8 else np.int32) if sums else 0
    if a.dtype.kind == "f":
        w = a.astype(np.float64) if a.itemsize < 8 else a
        total = float(w.sum())
        mn, mx = float(w.min()), float(w.max())
        l2 = math.sqrt(float(np.dot(w.ravel(), w.ravel())))
        if math.isfinite(mn) and math.isfinite(mx):
            nans = infs = 0
        else:
            nans, infs = int(np.isnan(w).sum()), int(np.isinf(w).sum())
    else:
        w = a.astype(np.float64)
        total, mn, mx = float(w.sum()), float(w.min()), float(w.max())
        l2 = math.sqrt(float(np.dot(w.ravel(), w.ravel())))
        nans = infs = 0
    # Same wrap-around as the torch path: int32 accumulation for <8-byte types.
    return (mn, mx, total / a.size, l2, nans, infs), int(bits)


def _dense(t: torch.Tensor) -> bool:
    """Whether `t`'s elements fill one block of memory, in some order of its dimensions."""
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride(), strict=True)
                               if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


_NUMPY_FLOATS = {torch.float32, torch.float64}
_TINY = 2.0 ** -60  # below it an fp32 square is subnormal or 0
_UNSIGNED = {4: np.uint32, 8: np.uint64}


def takes_large_cpu_path(x: torch.Tensor) -> bool:
    """Whether `tensor_stats` reduces `x` (as `flat_view` gives it) with
    `large_cpu_float_stats`: a large contiguous fp32/fp64 CPU tensor."""
    return (x.device.type == "cpu" and x.dtype in _NUMPY_FLOATS and x.numel() > _SMALL
            and x.is_contiguous() and not x.is_neg())


def flat_view(t: torch.Tensor) -> torch.Tensor:
    """`t` detached; a dense non-contiguous tensor as the flat vector of its memory block.

    Every statistic here ignores element order, and a dense tensor's elements fill one block
    of memory: reduce over that block as a flat vector, at contiguous speed (a transposed
    aminmax is ~25x slower).
    """
    t = t.detach()
    if not t.is_contiguous() and _dense(t):
        t = t.as_strided((t.numel(),), (1,), t.storage_offset())
    return t


def large_cpu_float_stats(x: torch.Tensor, sums: bool = True):
    """A large contiguous fp32/fp64 CPU tensor: torch's aminmax and sum, numpy's BLAS dot for
    the L2 norm and its wrapping unsigned sum for the checksum, read in place (no copy):
    each of those a third cheaper than torch's, and one Python number each, no `.item()`."""
    a = _numpy_view(x)
    size = a.itemsize
    mn, mx = torch.aminmax(x)
    mn_f, mx_f = mn.item(), mx.item()
    total = torch.sum(x).item()  # fp32 accumulation for fp32 (torch's cascade), fp64 for fp64
    with np.errstate(all="ignore"):
        l2 = math.sqrt(float(np.dot(a, a)))
    wrap = _UNSIGNED[size]
    # the sum modulo 2**32 (2**64): as stored, signed
    bits = int(a.view(wrap).sum(dtype=wrap)) if sums else 0
    half = 1 << (8 * size - 1)
    checksum = bits - 2 * half if bits >= half else bits
    if math.isfinite(mn_f) and math.isfinite(mx_f):
        nans = infs = 0
        if not (math.isfinite(total) and math.isfinite(l2)):  # fp32 sums of huge values
            total = torch.sum(x, dtype=torch.float64).item()
            l2 = torch.linalg.vector_norm(x, dtype=torch.float64).item()
        elif max(-mn_f, mx_f) < _TINY:  # fp32 squares of such values underflow (l2 0)
            l2 = torch.linalg.vector_norm(x, dtype=torch.float64).item()
    else:
        nans, infs = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
    return (mn_f, mx_f, total / a.size, l2, nans, infs), checksum


def fused_float_stats(x: torch.Tensor, sums: bool = True):
    """The statistics of a contiguous fp32/fp64 CPU tensor in one pass of C (accuracy/native),
    or None: another kind of tensor, no kernels built here, or a non-finite element (the
    other paths count NaN and inf apart)."""
    if x.device.type != "cpu" or x.dtype not in _NUMPY_FLOATS or not x.is_contiguous():
        return None
    n = x.numel()
    got = native.stats_pass(x.data_ptr(), n, x.dtype == torch.float32)
    if got is None:
        return None
    mn, mx, total, sumsq, checksum = got
    return (mn, mx, total / n, math.sqrt(sumsq), 0, 0), checksum if sums else 0


def cpu_float_stats(x: torch.Tensor, sums: bool = True):
    """A contiguous fp32/fp64 CPU tensor's statistics: fused where it can, else torch/numpy."""
    return fused_float_stats(x, sums) or large_cpu_float_stats(x, sums)


def tensor_stats(t: torch.Tensor, sums: bool = True):
    """Statistics of `t`; call with python dispatch disabled so other modes don't see it.
    `sums=False`: no bit-pattern sum (0 in its place). A CPU tensor takes the C++ path
    (accuracy/native/stats.cpp: one call, one pass) once a dump has loaded it; the Python path
    below is its fallback and what it is compared against."""
    ext = fastpath.loaded()
    if ext is not None:
        got = ext.stats(t, sums)
        if got is not None:
            return got
    return python_tensor_stats(t, sums)


def freed(t: torch.Tensor) -> bool:
    """A tensor whose storage was freed by resizing it to 0 (FSDP's unsharded parameters):
    its address is 0, and torch's own reductions read it and crash the process (torch 2.13:
    `vector_norm`, `_foreach_norm`). One attribute read: cheap enough for every tensor."""
    return t.layout is torch.strided and t.numel() > 0 and t.data_ptr() == 0


def holds_its_elements(t: torch.Tensor) -> bool:
    """Whether `t`'s storage reaches its last element: not so once the storage was freed by
    resizing it to 0 (FSDP frees each unsharded parameter so), where a read through its
    address would crash the process, not raise."""
    if t.device.type == "meta" or t.layout is not torch.strided:
        return True
    last = t.storage_offset() + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(),
                                                                      strict=True))
    return t.untyped_storage().nbytes() >= (last + 1) * t.element_size()


def python_tensor_stats(t: torch.Tensor, sums: bool = True):
    """`tensor_stats` by torch, numpy and the C kernels: the path without the C++ module."""
    if t.numel() == 0:
        return EMPTY_STATS
    if not holds_its_elements(t):  # the C++ path's error, for the loop to count
        raise ValueError("the tensor reads past the end of its storage (freed or resized "
                         "to hold fewer bytes): no statistics")
    if t.is_neg() or t.is_conj():  # lazy negation/conjugation: their bits are not the values
        t = t.resolve_conj().resolve_neg()
    t = flat_view(t)
    n = t.numel()
    fused = fused_float_stats(t, sums)
    if fused is not None:
        return fused
    if n <= _SMALL and t.device.type == "cpu" and t.dtype in _NUMPY_DTYPES:
        return _small_cpu_stats(t, sums)
    if takes_large_cpu_path(t):
        return large_cpu_float_stats(t, sums)
    x = _value_view(t)
    mn, mx = torch.aminmax(x)
    if x.is_floating_point():
        # fp32 accumulation (cascade-summed by torch) is 5x faster than fp64 and accurate
        # enough for statistics; fp64 tensors keep fp64.
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        total = torch.sum(x, dtype=acc)
        if x.dtype == acc and x.is_contiguous():
            flat = x.reshape(-1)
            l2 = torch.dot(flat, flat).sqrt()  # BLAS dot: faster than vector_norm
        else:
            l2 = torch.linalg.vector_norm(x, dtype=acc)
    else:
        total = torch.sum(x, dtype=torch.float64)
        l2 = torch.linalg.vector_norm(x.double())
    checksum = _checksum(t) if sums else 0  # no device tensor made for nothing (the writer int()s)
    n = x.numel()
    if t.device.type == "cpu":
        mn_f, mx_f = mn.item(), mx.item()
        if x.is_floating_point() and not (math.isfinite(mn_f) and math.isfinite(mx_f)):
            nans, infs = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
        else:
            nans = infs = 0
        return (mn_f, mx_f, total.item() / n, l2.item(), nans, infs), int(checksum)
    if x.is_floating_point():
        nans = torch.isnan(x).sum(dtype=torch.float64)
        infs = torch.isinf(x).sum(dtype=torch.float64)
    else:
        nans = infs = torch.zeros((), dtype=torch.float64, device=x.device)
    floats = torch.stack([mn.double(), mx.double(), total.double() / n, l2.double(), nans,
                          infs])
    return floats, checksum
