"""Compare one pair of dumped tensors: read each tensor's bytes once, in chunks, into float64.

Works from (path, offset, nbytes, dtype) descriptors so worker processes can open the dumps
themselves (h5py handles cannot cross processes).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from accuracy.compare.metrics import StreamingMetrics
from accuracy.dumpfile import Dump, TensorRef, dtypes
from accuracy.dumpfile.checksum import NO_HASH, Checksum, ContentHash
from accuracy.numformats import FORMATS

__all__ = ["BlobReader", "TensorRef", "compare_data", "compare_refs", "worker_run"]

CHUNK_ELEMS = 1 << 15  # 32 Ki elements: 256 KiB of float64 per array, stays in L2 cache


def _decode(raw: np.ndarray, dtype: str, out: np.ndarray | None = None) -> np.ndarray:
    """Bytes -> float64 values; the caller holds np.errstate(invalid="ignore")."""
    return dtypes.decode(raw, dtype, out, quiet=False)


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
        return self.dump(ref.path).read_range(ref, start, stop)

    def verify(self, ref: TensorRef, checksum: Checksum | ContentHash | None) -> None:
        """Raise DumpError when the bytes fed to `checksum` do not match `ref`'s stored check
        (its content hash, or its sum in an older dump)."""
        stored = ref.stored_check
        if checksum is not None and stored is not None:
            self.dump(ref.path).check_checksum(ref.what, checksum.value, stored)

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
        v = dtypes.decode(reader.read(ref, s, min(ref.n_values, s + CHUNK_ELEMS)), ref.dtype)
        v = v[np.isfinite(v)]
        if v.size:
            lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
    return (lo, hi) if lo <= hi else (0.0, 0.0)


def mask_threshold(my: TensorRef, golden: TensorRef) -> float | None:
    """Half the narrower side's largest value, when both sides' recorded extremes reach it
    (an attention mask's finfo.min fills); else None, and no pass looks for masks."""
    fm, fg = FORMATS.get(dtypes.value_dtype(my.dtype)), FORMATS.get(
        dtypes.value_dtype(golden.dtype))
    if fm is None or fg is None:
        return None
    at = 0.5 * min(fm.max, fg.max)

    def reaches(ref: TensorRef) -> bool:
        lo, hi = ref.minmax()
        return abs(lo) >= at or abs(hi) >= at  # NaN compares False: not known to reach

    return at if reaches(my) and reaches(golden) else None


def compare_data(reader: BlobReader, my: TensorRef, golden: TensorRef,
                 algorithms: tuple[str, ...]) -> dict[str, Any]:
    """Metrics of a pair with data and equal element counts, in one pass over each side."""
    from accuracy.compare.metrics import ALL_ALGORITHMS

    kl = None
    if "kl_div" in algorithms:
        kl = (_nan_minmax(reader, my), _nan_minmax(reader, golden))
    acc = StreamingMetrics(rel_eps=dtypes.eps(golden.dtype), kl_range=kl,
                           keep_values=any(a not in ALL_ALGORITHMS for a in algorithms),
                           mask_at=mask_threshold(my, golden))
    finite = my.finite and golden.finite
    same_dtype = my.dtype == golden.dtype
    # Different stored checksums or content hashes: the bytes differ somewhere, so no chunk
    # is tested for equality (an equal chunk gives the same sums through either path of
    # `update`). A tensor dump stores hashes but no checksums: testing every chunk of every
    # differing pair was a pass over both sides for nothing.
    hashes_differ = NO_HASH not in (my.content_hash, golden.content_hash) and (
        my.content_hash != golden.content_hash)
    identical = same_dtype and not hashes_differ and (
        my.checksum is None or golden.checksum is None or my.checksum == golden.checksum)
    maybe_same = identical
    # Equal content hashes (XXH3-64 of the stored bytes), each side's bytes verified against
    # its own on the way: the pair is bit-identical, so its metrics come from the golden side
    # alone (no chunk compared, nothing of `my` decoded). A sum, which collides easily, or a
    # missing hash keeps the chunk-by-chunk test.
    same_hash = (same_dtype and my.content_hash != NO_HASH
                 and my.content_hash == golden.content_hash and my.nbytes == golden.nbytes)
    identical = identical or same_hash
    n = my.n_values
    bx, by = np.empty(min(n, CHUNK_ELEMS)), np.empty(min(n, CHUNK_ELEMS))
    # Both tensors are read whole, so their stored checksums are verified on the way.
    cx, cy = my.new_checksum(), golden.new_checksum()
    # One ranged read per side per window of chunks (a view of the mapped file where it can
    # be). Each chunk is hashed just before it is decoded: the hash brings its bytes into the
    # cache and the decode finds them there (hashing the whole window first read it twice
    # from memory).
    window = CHUNK_ELEMS * 64
    with np.errstate(invalid="ignore"):  # decoding a signalling NaN: quietly a NaN
        for w in range(0, n, window):
            we = min(n, w + window)
            wx, wy = reader.read(my, w, we), reader.read(golden, w, we)
            sx, sy = wx.size // (we - w), wy.size // (we - w)  # bytes per value
            for s in range(0, we - w, CHUNK_ELEMS):
                e = min(we - w, s + CHUNK_ELEMS)
                rx, ry = wx[s * sx: e * sx], wy[s * sy: e * sy]
                if cx is not None:
                    cx.update(rx)
                if cy is not None:
                    cy.update(ry)
                if same_hash:
                    y = _decode(ry, golden.dtype, by)
                    acc.update(y, y, finite=finite, identical=True)
                    continue
                same = maybe_same and np.array_equal(rx, ry)
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
    out["mask_values"] = acc.masked
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
