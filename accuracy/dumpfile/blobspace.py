"""The blob dataset's file space, written (and read back) directly, bypassing HDF5."""

from __future__ import annotations

import os

import h5py
import numpy as np

from accuracy.dumpfile.reserve import punch_hole
from accuracy.errors import AccuracyError, RaisedForTheUser


class DumpWriteError(AccuracyError, RaisedForTheUser, RuntimeError):
    """Writing the dump failed (disk full, permissions...); the training step is not affected."""


class BlobSpace:
    """The blob dataset's file space, written directly.

    The dataset is chunked and growable (the format readers know), but its chunks are
    allocated when it grows (H5D_ALLOC_TIME_EARLY, never filled), their file addresses read
    once, and the file extended (sparsely) to cover them at once, so an index that names a
    chunk never points past the end of the file, even after a kill. HDF5 never caches or writes
    these chunks itself: each byte is written once, by `write`, with `os.pwrite` (no GIL).
    """

    def __init__(self, f: h5py.File, name: str, chunk: int) -> None:
        group, _, leaf = name.rpartition("/")
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((chunk,))
        dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
        dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)  # no zeros written before the data
        space = h5py.h5s.create_simple((0,), (h5py.h5s.UNLIMITED,))
        dsid = h5py.h5d.create(f.require_group(group).id, leaf.encode(), h5py.h5t.STD_U8LE,
                               space, dcpl=dcpl)
        self.dataset = h5py.Dataset(dsid)
        self.chunk = chunk
        self.capacity = 0
        self._name = f.filename
        self.fd = f.id.get_vfd_handle()  # the sec2 driver's descriptor (see _discard_writes)
        self._addr: list[int] = []  # file offset of each chunk

    def grow(self, size: int) -> None:
        """Allocate chunks up to `size` bytes and extend the file over them."""
        self.dataset.resize((size,))
        dsid, chunk = self.dataset.id, self.chunk
        for c in range(len(self._addr), -(-size // chunk)):
            addr = dsid.get_chunk_info_by_coord((c * chunk,)).byte_offset
            if addr is None:
                raise DumpWriteError(f"HDF5 did not allocate chunk {c} of the blob")
            self._addr.append(addr)
        end = max(self._addr) + chunk if self._addr else 0
        if os.fstat(self.fd).st_size < end:
            os.ftruncate(self.fd, end)
        self.capacity = size

    def release_unused(self, size: int) -> None:
        """Give back the disk blocks of whole chunks past the first `size` bytes, allocated
        ahead (the blob grows by up to 64 MiB at a time) and never written: a closed dump
        holds its data, not its last growth. Done before `shrink`, while the chunks are
        still the blob's and nothing else can have been written there."""
        chunk, addr = self.chunk, self._addr
        for c in range(-(-size // chunk), len(addr)):
            punch_hole(self.fd, addr[c], chunk)

    def shrink(self, size: int) -> None:
        self.dataset.resize((size,))
        del self._addr[-(-size // self.chunk):]
        self.capacity = size

    def read(self, offset: int, n: int) -> np.ndarray:
        """Bytes [offset, offset + n) written before (from the page cache, no GIL held)."""
        out = np.empty(n, np.uint8)
        view, fd, chunk, addr, pos = memoryview(out), self.fd, self.chunk, self._addr, 0
        while pos < n:
            c, within = divmod(offset + pos, chunk)
            length = min(chunk - within, n - pos)
            got = os.preadv(fd, [view[pos:pos + length]], addr[c] + within)
            if got <= 0:
                raise OSError(f"short read from {self._name}")
            pos += got
        return out

    def write(self, data: memoryview, offset: int) -> None:
        """Write bytes at blob offset `offset` (inside the capacity), chunk run by chunk run."""
        fd, chunk, addr = self.fd, self.chunk, self._addr
        pos, n = 0, len(data)
        while pos < n:
            c, within = divmod(offset + pos, chunk)
            start = addr[c] + within
            length = min(chunk - within, n - pos)
            # chunks allocated one after the other in the file: one write for the whole run
            while pos + length < n and addr[c + 1] == addr[c] + chunk:
                c += 1
                length = min(length + chunk, n - pos)
            while length:
                done = os.pwrite(fd, data[pos:pos + length], start)
                if done <= 0:
                    raise OSError(f"short write to {self._name}")
                pos, start, length = pos + done, start + done, length - done
