"""Compare one pair of dumped tensors: read each tensor's bytes once, in chunks, into float64.

Works from (path, offset, nbytes, dtype) descriptors so worker processes can open the dumps
themselves (h5py handles cannot cross processes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from accuracy.compare.metrics import StreamingMetrics
from accuracy.dumpfile import schema
from accuracy.dumpfile.checksum import Checksum, part_size
from accuracy.dumpfile.reader import Dump, TensorRecord

CHUNK_ELEMS = 1 << 15  # 32 Ki elements: 256 KiB of float64 per array, stays in L2 cache

_NUMPY = {
    "float16": np.float16, "float32": np.float32, "float64": np.float64,
    "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32,
    "int64": np.int64, "bool": np.bool_, "uint16": np.uint16, "uint32": np.uint32,
    "uint64": np.uint64,
}
_COMPLEX = {"complex64": "float32", "complex128": "float64", "complex32": "float16"}


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor's bytes live: enough for any process to read them."""

    path: str
    offset: int
    nbytes: int
    dtype: str
    numel: int
    stats: tuple[tuple[str, float], ...]
    address: str = ""

    @classmethod
    def of(cls, t: TensorRecord) -> TensorRef:
        return cls(str(t.dump.path), t.offset, t.nbytes, t.dtype, t.numel,
                   tuple(sorted(t.stats.items())), t.address)

    @property
    def checksum(self) -> int | None:
        """The stored checksum, or None when the dump recorded no statistics for it."""
        s = dict(self.stats)
        if s.get("nan_count", -1) < 0 or "checksum" not in s:
            return None
        return int(s["checksum"])

    def new_checksum(self) -> Checksum | None:
        """A running checksum to verify this tensor's bytes as they are read."""
        if self.checksum is None:
            return None
        return Checksum(part_size(self.dtype, schema.torch_dtype(self.dtype).itemsize))

    @property
    def value_dtype(self) -> str:
        """Complex tensors are compared as their real view (real, imag interleaved)."""
        return _COMPLEX.get(self.dtype, self.dtype)

    @property
    def n_values(self) -> int:
        return self.numel * (2 if self.dtype in _COMPLEX else 1)

    @property
    def finite(self) -> bool:
        s = dict(self.stats)
        return not (s.get("nan_count", 0) or s.get("inf_count", 0))

    def minmax(self) -> tuple[float, float]:
        s = dict(self.stats)
        return s.get("min", math.nan), s.get("max", math.nan)


def is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat", "complex"))


def eps_of(dtype: str) -> float:
    """Machine epsilon of a dtype name; float32's for integers (used as a denominator floor)."""
    try:
        dt = schema.torch_dtype(_COMPLEX.get(dtype, dtype))
        if dt.is_floating_point:
            return float(torch.finfo(dt).eps)
    except ValueError:
        pass
    return float(np.finfo(np.float32).eps)


def _decode(raw: np.ndarray, dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Raw little-endian bytes -> float64 values (into `out` when given, to skip allocation)."""
    vd = _COMPLEX.get(dtype, dtype)
    if vd in _NUMPY:
        vals = raw.view(_NUMPY[vd])
        if out is None:
            return vals.astype(np.float64)
        out = out[: vals.size]
        np.copyto(out, vals, casting="unsafe")
        return out
    if vd == "bfloat16":
        bits = raw.view(np.uint16).astype(np.uint32)
        bits <<= 16
        return bits.view(np.float32).astype(np.float64)
    return torch.from_numpy(raw).view(schema.torch_dtype(vd)).to(torch.float64).numpy()


class BlobReader:
    """Reads byte ranges of the dumps' data, one open file per path, through the dump reader.

    Every failure (range outside the data, damaged HDF5 chunks) is a DumpError naming the file
    and the tensor address.
    """

    def __init__(self, dumps: dict[str, Dump] | None = None) -> None:
        self._dumps: dict[str, Dump] = dict(dumps or {})
        self._own: list[Dump] = []

    def dump(self, path: str) -> Dump:
        if path not in self._dumps:
            d = Dump(path)
            self._own.append(d)
            self._dumps[path] = d
        return self._dumps[path]

    def read(self, ref: TensorRef, start: int, stop: int) -> np.ndarray:
        """Bytes of values [start, stop) of `ref` (in value units of its value dtype)."""
        size = schema.torch_dtype(ref.value_dtype).itemsize
        a, b = start * size, min(stop * size, ref.nbytes)
        return self.dump(ref.path).read_bytes(ref.offset + a, max(0, b - a),
                                              ref.address or f"tensor at offset {ref.offset}")

    def verify(self, ref: TensorRef, checksum: Checksum | None) -> None:
        """Raise DumpError when the bytes summed into `checksum` do not match `ref`'s."""
        if checksum is not None and ref.checksum is not None:
            self.dump(ref.path).check_checksum(ref.address or f"tensor at offset {ref.offset}",
                                               checksum.value, ref.checksum)

    def close(self) -> None:
        for d in self._own:
            d.close()
        self._own.clear()
        self._dumps.clear()


def _nan_minmax(reader: BlobReader, ref: TensorRef) -> tuple[float, float]:
    lo, hi = ref.minmax()
    if math.isfinite(lo) and math.isfinite(hi):
        return lo, hi
    lo, hi = math.inf, -math.inf
    for s in range(0, ref.n_values, CHUNK_ELEMS):
        v = _decode(reader.read(ref, s, min(ref.n_values, s + CHUNK_ELEMS)), ref.dtype)
        v = v[np.isfinite(v)]
        if v.size:
            lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
    return (lo, hi) if lo <= hi else (0.0, 0.0)


def compare_data(reader: BlobReader, my: TensorRef, golden: TensorRef,
                 algorithms: tuple[str, ...]) -> dict[str, Any]:
    """Metrics of a pair with data and equal element counts, in one pass over each side."""
    from accuracy.compare.metrics import ALL_ALGORITHMS

    kl = None
    if "kl_div" in algorithms:
        kl = (_nan_minmax(reader, my), _nan_minmax(reader, golden))
    acc = StreamingMetrics(rel_eps=eps_of(golden.dtype), kl_range=kl,
                           keep_values=any(a not in ALL_ALGORITHMS for a in algorithms))
    finite = my.finite and golden.finite
    same_dtype = my.dtype == golden.dtype
    identical = same_dtype
    n = my.n_values
    bx, by = np.empty(min(n, CHUNK_ELEMS)), np.empty(min(n, CHUNK_ELEMS))
    # Both tensors are read whole, so their stored checksums are verified on the way.
    cx, cy = my.new_checksum(), golden.new_checksum()
    # One h5py read per side per window of chunks: fewer, larger reads, bounded memory.
    window = CHUNK_ELEMS * 64
    for w in range(0, n, window):
        we = min(n, w + window)
        wx, wy = reader.read(my, w, we), reader.read(golden, w, we)
        if cx is not None:
            cx.update(wx)
        if cy is not None:
            cy.update(wy)
        sx, sy = wx.size // (we - w), wy.size // (we - w)  # bytes per value
        for s in range(0, we - w, CHUNK_ELEMS):
            e = min(we - w, s + CHUNK_ELEMS)
            rx, ry = wx[s * sx: e * sx], wy[s * sy: e * sy]
            same = same_dtype and np.array_equal(rx, ry)
            identical = identical and same
            if same and finite:
                y = _decode(ry, golden.dtype, by)
                acc.update(y, y, finite=True, identical=True)
            else:
                acc.update(_decode(rx, my.dtype, bx), _decode(ry, golden.dtype, by),
                           finite=finite)
    reader.verify(my, cx)
    reader.verify(golden, cy)
    out: dict[str, Any] = acc.result(algorithms)
    out["nan_mismatch"] = acc.nan_mismatch
    out["inf_mismatch"] = acc.inf_mismatch
    out["compared_elements"] = acc.n_cmp
    out["bit_exact"] = bool(identical)
    out["bytes_read"] = my.nbytes + golden.nbytes
    return out


def compare_refs(reader: BlobReader, pairs: list[tuple[TensorRef, TensorRef]],
                 algorithms: tuple[str, ...]) -> list[dict[str, Any]]:
    return [compare_data(reader, m, g, algorithms) for m, g in pairs]


_WORKER: BlobReader | None = None


def worker_run(pairs: list[tuple[TensorRef, TensorRef]], algorithms: tuple[str, ...]
               ) -> list[dict[str, Any]]:
    """Entry point of a worker process: keeps its files open across tasks."""
    from accuracy.compare.blas import single_threaded_blas

    global _WORKER
    if _WORKER is None:
        _WORKER = BlobReader()
    with single_threaded_blas():
        return compare_refs(_WORKER, pairs, algorithms)
