"""A dump's stored bytes: ranged reads through HDF5, and views of the file's memory mapping
where the bytes lie contiguously in the file (no copy: the page cache is read once, by
whoever consumes the view)."""

from __future__ import annotations

import mmap
from functools import cached_property
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from accuracy.dumpfile import dtypes, layout
from accuracy.dumpfile.errors import H5_ERRORS, DamagedDataError, DumpError
from accuracy.dumpfile.records import TensorRef


class StoredBytes:
    """The blob dataset of one open dump, `length` committed bytes long."""

    def __init__(self, path: Path, blob: h5py.Dataset, length: int, closed_cleanly: bool
                 ) -> None:
        self.path = path
        self.length = length
        self._blob = blob
        self._closed_cleanly = closed_cleanly

    def read(self, offset: int, nbytes: int, what: str) -> np.ndarray:
        """Bytes [offset, offset + nbytes) of the stored data, as a private uint8 array.

        The range is checked against the committed data, and any HDF5 failure becomes a
        DumpError naming `what` (the tensor's address).
        """
        if offset < 0 or nbytes < 0 or offset + nbytes > self.length:
            raise DumpError(f"{self.path}: {what} points past the end of the data")
        if nbytes == 0:
            return np.empty(0, np.uint8)
        try:
            return self._blob[offset: offset + nbytes]
        except H5_ERRORS as e:
            raise DamagedDataError(f"{self.path}: cannot read {what}: damaged data "
                                   f"({type(e).__name__}: {e})") from None

    def span_bytes(self, offset: int, shape: tuple[int, ...], stride: tuple[int, ...],
                   itemsize: int, what: str) -> np.ndarray:
        """The stored bytes a strided layout reaches from `offset` (its element 0), read-only:
        a view of the mapping where it can be, else read."""
        need = layout.span(shape, stride, itemsize)
        raw = self.view(offset, need)
        if raw is None:
            raw = self.read(offset, need, what)
        raw.flags.writeable = False
        return raw

    def elements(self, offset: int, shape: tuple[int, ...], stride: tuple[int, ...],
                 itemsize: int, what: str) -> np.ndarray:
        """A strided row's elements in row-major order, as a private uint8 array. The
        layout was checked on open (validate.py); `layout` checks the span again."""
        raw = self.span_bytes(offset, shape, stride, itemsize, what)
        return layout.gather(raw, shape, stride, itemsize)

    def read_range(self, ref: TensorRef, start: int, stop: int) -> np.ndarray:
        """Bytes of values [start, stop) of `ref` (in units of its value dtype), read-only: a
        view of the mapping where it can be, else read through HDF5."""
        size = dtypes.itemsize(ref.value_dtype)
        a, b = start * size, min(stop * size, ref.nbytes)
        if ref.layout is not None:
            return self._strided_range(ref, a, b)
        offset, nbytes = ref.offset + a, max(0, b - a)
        view = self.view(offset, nbytes)
        if view is not None:
            view.flags.writeable = False
            return view
        raw = self.read(offset, nbytes, ref.what)
        raw.flags.writeable = False
        return raw

    def _strided_range(self, ref: TensorRef, a: int, b: int) -> np.ndarray:
        """Bytes [a, b) of a strided row's elements in row-major order: only the elements
        holding them are gathered."""
        shape, stride = ref.layout  # type: ignore[misc]
        size = dtypes.itemsize(ref.dtype)
        if b <= a:
            return np.empty(0, np.uint8)
        raw = self.span_bytes(ref.offset, shape, stride, size, ref.what)
        e0, e1 = a // size, -(-b // size)
        out = layout.gather_window(raw, shape, stride, size, e0, e1)[a - e0 * size:b - e0 * size]
        out.flags.writeable = False
        return out

    def view(self, offset: int, nbytes: int, align: int = 1) -> np.ndarray | None:
        """Bytes [offset, offset + nbytes) as a copy-on-write view of the file's mapping
        (writing to it changes a private copy, never the file), or None where they cannot be
        mapped: nothing to map, past the committed data, not contiguous in the file, not at a
        multiple of `align` in it, or the file shrank since it was opened."""
        if not nbytes or offset < 0 or offset + nbytes > self.length:
            return None
        pos = self.file_offset(offset, nbytes)
        if pos is None or pos % align:
            return None
        mm = self._mapping[0]  # type: ignore[index]
        try:
            return np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=pos)
        except ValueError:  # the file shrank since it was opened
            return None

    @property
    def chunk_bytes(self) -> int:
        """Bytes per HDF5 chunk of the stored data (0 when stored contiguously): a ranged
        read costs at least one chunk."""
        return self._blob.chunks[0] * self._blob.dtype.itemsize if self._blob.chunks else 0

    @cached_property
    def _mapping(self) -> tuple[mmap.mmap, int, np.ndarray] | None:
        """(file mapping, chunk size, file offset of each chunk or -1), or None if unmappable."""
        if not self._closed_cleanly or self._blob.compression is not None:
            return None
        try:
            dcpl = self._blob.id.get_create_plist()
            if dcpl.get_nfilters():
                return None
            if self._blob.chunks is None:
                start = self._blob.id.get_offset()
                if start is None:
                    return None
                size, offsets = max(1, self._blob.shape[0]), np.array([start], np.int64)
            else:
                size = self._blob.chunks[0]
                offsets = np.full(-(-self._blob.shape[0] // size), -1, np.int64)

                def note(info: Any) -> None:
                    if info.filter_mask == 0 and info.size == size:
                        offsets[info.chunk_offset[0] // size] = info.byte_offset

                self._blob.id.chunk_iter(note)
            with open(self.path, "rb") as fh:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        except (OSError, ValueError, AttributeError, RuntimeError):
            return None
        return mm, size, offsets

    def file_offset(self, offset: int, nbytes: int) -> int | None:
        """Where blob bytes [offset, offset + nbytes) lie in the file, if contiguously."""
        m = self._mapping
        if m is None:
            return None
        _, size, chunks = m
        c0, c1 = offset // size, (offset + nbytes - 1) // size
        if c1 >= len(chunks):
            return None
        run = chunks[c0:c1 + 1]
        if (run < 0).any() or (c1 > c0 and (np.diff(run) != size).any()):
            return None
        return int(run[0]) + offset - c0 * size

    def close(self) -> None:
        """Unmap the file (tensors still mapping it keep it until they are freed)."""
        m = self.__dict__.pop("_mapping", None)
        if m is not None:
            try:
                m[0].close()
            except BufferError:  # tensors still map it: it closes when they are freed
                pass
