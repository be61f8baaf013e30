"""The one writer of dump files: log-structured, append-only, crash-tolerant.

Tensor bytes are appended to one chunked byte dataset and indexed by rows of two append-only
tables (ops, tensors). Data is always written before the index rows that point at it, and the
file runs in HDF5 SWMR mode, so a process killed at any moment leaves a file whose committed
rows (counted in `_status`) are all readable. A background thread does all HDF5 work; the
training thread only hands it host copies and statistics through a byte-bounded queue.

The tensor bytes themselves bypass HDF5 (see `BlobSpace`): the blob's chunks are allocated
when the dataset grows, and the bytes go to their file addresses with `os.pwrite`, which
releases the GIL, as does the XXH3 hash. So the writer thread holds the GIL only for its
bookkeeping, and the training thread's Python runs while the bytes go to the disk.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import h5py
import numpy as np
import torch

from accuracy import background
from accuracy.dumpfile import dtypes, optext, schema, staging
from accuracy.dumpfile import layout as layout_of
from accuracy.dumpfile.blobspace import BlobSpace, DumpWriteError
from accuracy.dumpfile.checksum import ATTRS_HASH, NO_HASH, attrs_hash, content_hash, rows_hash
from accuracy.dumpfile.reserve import SpaceReserve, give_back
from accuracy.errors import AccuracyError, OutputExistsError
from accuracy.outputs import writable_folder
from accuracy.records import CallSite

log = logging.getLogger(__name__)

STATUS = "_status"  # int64[4]: committed op rows, committed tensor rows, complete flag, blob bytes
_BLOB_CHUNK = 1 << 20
_TEXT_BLOB_CHUNK = 64 << 10  # a dump that stores no tensor bytes holds only the ops' text
_BLOB_GROW = 64 << 20  # blob space allocated at a time (sparse until written)
_NO_DIMS = (0,) * schema.MAX_DIMS
_TABLE_CHUNK = 1024


class HostData(Protocol):
    """Something that yields a private contiguous CPU copy of a tensor (see device_backend)."""

    def wait(self) -> torch.Tensor: ...


@dataclass
class TensorEntry:
    """One tensor use, as the dumper hands it to the writer."""

    row: int
    seq: int
    io: int
    idx: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    device: str
    stats: Any  # (float64 tensor [min,max,mean,l2,nan,inf], int64 checksum tensor) or None
    data: HostData | torch.Tensor | None = None  # bytes to store with this row
    first: int = -1  # row whose bytes this row shares (itself when `data` is set)
    nbytes: int = 0
    # a replay's output whose bytes are the replayed dump's at the same address, with this
    # content hash (`schema.IN_SOURCE`): nothing is written for it (schema-5 files only)
    source_hash: int = NO_HASH
    # a view of bytes stored for row `holder` (schema 6): its element 0 lies `elem_offset`
    # elements into them, its elements are read through `stride`; nothing is copied for it
    holder: int = -1
    elem_offset: int = 0
    strided: bool = False
    layout: tuple[int, ...] = ()  # strided: element strides in the stored bytes (else `stride`)


@dataclass
class OpEntry:
    """One op row, as the dumper (or a replay) hands it to the writer: where it ran
    (`site`; the rank is the file's), its stack and call arguments as text, how many tensor
    rows follow, its `extra` (keys: `schema.EXTRA`) and its collective epoch."""

    site: CallSite
    stack: str
    args: str
    n_in: int
    n_out: int
    extra: dict[str, Any] = field(default_factory=dict)
    epoch: int = schema.UNKNOWN_EPOCH  # collective epoch (see accuracy/dumper/collectives.py)


class DiskFullError(AccuracyError, OSError):
    """Free space fell below the writer's headroom: recording stops while the file is intact."""


# Room kept free for the index rows and HDF5 metadata written at close. Stopping before the
# disk is really full keeps the file consistent; HDF5 cannot recover from a failed write.
# The same room is held past the file's end (see reserve.py) for the next flush and the close.
_HEADROOM = 4 << 20
_CLOSE_ROOM = 1 << 20  # what a commit or the close writes: status, attributes, metadata


def check_dump_path(path: str | os.PathLike[str], overwrite: bool) -> Path:
    """Validate a dump path before any op runs: create missing folders, refuse clobbering."""
    p = Path(path)
    if p.exists() and p.is_dir():
        raise OutputExistsError(f"dump_path {str(p)!r} is a directory; give a file name ending .h5")
    if p.exists() and not overwrite:
        raise OutputExistsError(
            f"dump file {str(p)!r} already exists; pass overwrite=True (CLI: --overwrite) "
            "or choose another path"
        )
    writable_folder(p.parent, "folder for the dump")
    return p


def _as_bytes(t: torch.Tensor) -> np.ndarray:
    """A contiguous CPU tensor's raw bytes as a uint8 array, without copying."""
    if t.numel() == 0:
        return np.empty(0, np.uint8)
    return t.reshape(-1).view(torch.uint8).numpy()


def _attr_value(v: Any) -> str | int | float | bool:
    """HDF5 attributes take plain scalars; containers go in as JSON text."""
    if isinstance(v, bool | int | float):
        return v
    if isinstance(v, str):
        return str(v)  # str subclasses such as torch.__version__ have no HDF5 type
    return json.dumps(v)


def _stats_values(stats: Any) -> tuple[float, float, float, float, int, int, int]:
    if stats is None:
        nan = float("nan")
        return (nan, nan, nan, nan, -1, -1, 0)
    floats, checksum = stats
    mn, mx, mean, l2, nans, infs = floats.tolist() if isinstance(floats, torch.Tensor) else floats
    cs = int(checksum.item()) if isinstance(checksum, torch.Tensor) else int(checksum)
    return (mn, mx, mean, l2, int(nans), int(infs), cs)


def _row(t: TensorEntry, offset: int, nbytes: int, first: int, content: int,
         lay: tuple[int, ...] | None) -> tuple[Any, ...]:
    """One tensor row of the file's table (`schema.TENSOR_ROW`'s fields, in order)."""
    ndim = len(t.shape)
    if ndim > schema.MAX_DIMS:
        ndim, shape, stride = -1, _NO_DIMS, _NO_DIMS
    else:
        shape = t.shape + _NO_DIMS[ndim:]
        stride = t.stride + _NO_DIMS[len(t.stride):]
    return (t.seq, t.io, t.idx, t.dtype, ndim, shape, stride, t.device, offset, nbytes, first,
            *_stats_values(t.stats), content, int(lay is not None and ndim >= 0),
            lay + _NO_DIMS[len(lay):] if lay and ndim >= 0 else _NO_DIMS)


def _discard_writes(f: h5py.File) -> None:
    """Point the file's descriptor at an anonymous memory file (or /dev/null where there is
    none): HDF5's later writes and its truncation succeed, and vanish."""
    fd = f.id.get_vfd_handle()
    try:
        null = os.memfd_create("accuracy-discarded-writes")
    except (AttributeError, OSError):
        null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def _keep_forever(obj: Any) -> None:
    """Never free `obj`, not even at interpreter exit: it holds h5py objects of a file whose
    close failed, and freeing those crashes the process (see DumpWriter._abandon)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


class DumpWriter:
    """Append-only writer running on a background thread.

    `flush_ops` and `flush_seconds` bound what a killed process can lose; `max_pending_bytes`
    bounds the host memory held by tensors waiting for the disk (the training thread blocks
    when it is reached, rather than growing without limit).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        attrs: dict[str, Any],
        *,
        overwrite: bool = False,
        flush_ops: int = 1024,
        flush_seconds: float = 1.0,
        max_pending_bytes: int = 1 << 30,
    ) -> None:
        self.path = check_dump_path(path, overwrite)
        self.flush_ops = flush_ops
        self.flush_seconds = flush_seconds
        self.max_pending_bytes = max_pending_bytes
        self._pending_bytes = 0
        self._cond = threading.Condition()
        self._queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.error: BaseException | None = None
        self._next_row = 0
        # ops handed to the writer thread in batches: waking it per op costs the training
        # thread a GIL hand-over per op (~0.5 ms measured on a busy 2-core machine)
        self._batch: list[tuple[OpEntry, list[TensorEntry], int]] = []
        self._batch_lock = threading.Lock()  # the writer thread takes a batch left waiting
        self._batch_ops = max(1, min(64, flush_ops))
        self._batch_since = time.monotonic()
        self._ring = staging.acquire(max_pending_bytes)
        # rows held by the replayed dump need a reader that knows them (schema 5)
        self._source_rows = attrs.get("schema_version", 0) >= schema.SOURCE_ROWS_SCHEMA
        self._open(attrs)
        self._thread = threading.Thread(target=self._run, name="accuracy-dump-writer", daemon=True)
        self._thread.start()

    # -- training-thread side -------------------------------------------------------------

    def new_row(self) -> int:
        row = self._next_row
        self._next_row += 1
        return row

    def stage(self, t: torch.Tensor) -> staging.StagedCopy | None:
        """The one copy of a CPU tensor's bytes, into this writer's warm staging ring (waits
        while the ring is full of bytes being written); None: make a private copy instead."""
        if self.error is not None or t.device.type != "cpu":
            return None
        return self._ring.stage(t, self._can_wait)

    def _can_wait(self) -> bool:
        return self.error is None and self._thread.is_alive()

    def add_op(self, op: OpEntry, tensors: list[TensorEntry]) -> None:
        """Queue one op; blocks only while more than `max_pending_bytes` wait for the disk."""
        if self.error is not None:
            raise DumpWriteError(f"writing {self.path} failed: {self.error}") from self.error
        for t in tensors:
            if isinstance(t.data, staging.StagedCopy):
                t.data.submit()  # the writer thread frees its slot
            if t.source_hash != NO_HASH and (t.data is not None or not self._source_rows):
                raise ValueError("a row held by the replayed dump needs a schema-5 file "
                                 "and no bytes of its own")
        size = sum(t.nbytes for t in tensors if t.data is not None)
        if size:
            with self._cond:
                while self._pending_bytes and self._pending_bytes + size > self.max_pending_bytes:
                    if self.error is not None or not self._thread.is_alive():
                        break
                    self._cond.wait(0.5)
                self._pending_bytes += size
        with self._batch_lock:
            self._batch.append((op, tensors, size))
            full = len(self._batch) >= self._batch_ops
        if full or size or time.monotonic() - self._batch_since >= self.flush_seconds:
            self._hand_over()

    def _take_batch(self) -> list[tuple[OpEntry, list[TensorEntry], int]]:
        with self._batch_lock:
            batch, self._batch = self._batch, []
        self._batch_since = time.monotonic()
        return batch

    def _hand_over(self) -> None:
        batch = self._take_batch()
        if batch:
            self._queue.put(("ops", batch))

    def close(self, attrs: dict[str, Any], complete: bool) -> None:
        """Write the remaining rows and final attributes, and close the file."""
        self._hand_over()
        self._queue.put(("close", (attrs, complete)))
        self._thread.join()
        staging.give_back(self._ring)
        if self.error is not None:
            raise DumpWriteError(f"writing {self.path} failed: {self.error}") from self.error

    # -- writer-thread side ---------------------------------------------------------------

    def _open(self, attrs: dict[str, Any]) -> None:
        # Built under a temporary name and renamed once in SWMR mode, so a process killed
        # while the file is being set up never leaves a half-made dump (or clobbers an old one
        # that overwrite=True was about to replace) at the user's path.
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.creating")
        f = h5py.File(tmp, "w", libver="latest", rdcc_nbytes=4 << 20)
        self._attrs: dict[str, Any] = {}  # what the root attributes read back as
        self._set_attrs(f, {"format": schema.FORMAT_NAME,
                            "schema_version": schema.SCHEMA_VERSION, "complete": False})
        self._set_attrs(f, {k: _attr_value(v) for k, v in attrs.items()
                            if k != "schema_version"})  # this writer's layout: the newest
        self._space = BlobSpace(f, schema.BLOB, _BLOB_CHUNK if attrs.get("mode") == "tensor"
                                else _TEXT_BLOB_CHUNK)
        self._blob = self._space.dataset
        self._ops = f.create_dataset(
            schema.OPS, shape=(0,), maxshape=(None,), dtype=schema.OP_ROW, chunks=(_TABLE_CHUNK,)
        )
        self._tensors = f.create_dataset(
            schema.TENSORS,
            shape=(0,),
            maxshape=(None,),
            dtype=schema.TENSOR_ROW,
            chunks=(_TABLE_CHUNK,),
        )
        self._batches = f.create_dataset(
            schema.BATCHES, shape=(0,), maxshape=(None,), dtype=schema.BATCH_ROW,
            chunks=(_TABLE_CHUNK,))
        self._n_batches = 0
        self._status = f.create_dataset(STATUS, data=np.zeros(4, np.int64))
        f.swmr_mode = True  # from here on a reader (or a crash) always sees a consistent file
        os.replace(tmp, self.path)
        self._file = f
        self._blob_len = 0
        self._offsets: dict[int, tuple[int, int]] = {}
        # the dumper's row number -> the row's index in the file's table (they part when an
        # op is dropped whole: `first` names file rows, which a strided link's reader follows)
        self._file_rows: dict[int, int] = {}
        self._hashes: dict[int, int] = {}  # row -> content hash of the bytes it points at
        self._layouts: dict[int, tuple[int, ...]] = {}  # strided rows: layout (links: ())
        self._op_rows: list[tuple[Any, ...]] = []
        self._op_texts: list[bytes] = []  # each op's text, stored in the blob at the flush
        self._text_bytes = 0  # their size: blob room kept for them (see _append_bytes)
        self._tensor_rows: list[tuple[Any, ...]] = []
        self._n_ops = 0
        self._n_committed = 0
        self._n_tensors = 0
        self._free_estimate = 0
        self.bytes_written = 0
        self.bytes_linked = 0
        self._reserve = SpaceReserve(self._space.fd)
        try:
            self._hold(_HEADROOM)
        except DiskFullError as e:  # nothing will be recorded: the dump stays empty
            log.error("%s", e)
            self.error = e

    def _run(self) -> None:
        background.lower_this_thread()  # opt-in: the step's threads first (background.py)
        last_flush = time.monotonic()
        while True:
            try:
                kind, payload = self._queue.get(timeout=self.flush_seconds)
            except queue.Empty:  # training is idle: take the ops waiting in the batch
                batch = self._take_batch()
                kind, payload = ("ops", batch) if batch else ("tick", None)
            try:
                if kind == "ops":
                    for i, item in enumerate(payload):
                        try:
                            if self.error is None:
                                self._write_op(*item)
                        except BaseException:
                            for rest in payload[i + 1:]:  # dropped with the failure
                                self._release(rest[2])
                            raise
                        finally:
                            self._release(item[2])
                elif kind == "close":
                    self._finish(*payload)
                    return
                due = time.monotonic() - last_flush >= self.flush_seconds
                if self.error is None and self._op_rows and (
                        len(self._op_rows) >= self.flush_ops or due):
                    self._flush()
                    last_flush = time.monotonic()
                elif kind == "tick":
                    last_flush = time.monotonic()
            except BaseException as e:  # noqa: BLE001 - the training thread must not die with us
                if self.error is None:
                    log.error("dump writer failed on %s: %s; further records are dropped",
                              self.path, e)
                    self.error = e
                if kind == "close":
                    self._abandon()
                    return

    def _release(self, size: int) -> None:
        if size:
            with self._cond:
                self._pending_bytes -= size
                self._cond.notify_all()

    def _ensure_space(self, nbytes: int) -> None:
        """Refuse a write that would leave less than _HEADROOM free on the dump's disk."""
        if nbytes + _HEADROOM <= self._free_estimate:
            self._free_estimate -= nbytes
            return
        st = os.statvfs(self.path.parent)
        free = st.f_bavail * st.f_frsize  # the blob's bytes go straight to the file
        self._free_estimate = free - nbytes
        if nbytes + _HEADROOM > free:
            raise self._disk_full(f"disk almost full ({free / 1e6:.1f} MB free")

    def _hold(self, nbytes: int) -> None:
        """Hold `nbytes` of disk past the file's end for HDF5's next writes (see reserve.py)."""
        try:
            self._reserve.renew(nbytes)
        except OSError as e:
            raise self._disk_full(f"disk full ({e.strerror}") from None

    def _disk_full(self, why: str) -> DiskFullError:
        return DiskFullError(
            f"{why} in {self.path.parent}): recording stopped after "
            f"{self._n_ops + len(self._op_rows)} ops, which the dump keeps ({self._n_committed} "
            "committed so far, the rest when it closes). "
            "Free space, or dump less: mode='statistics', or ops=/modules= filters"
        )

    def _pending_rows_size(self) -> int:
        """An upper bound of the file space the rows waiting for `_flush` take."""
        return (len(self._op_rows) * schema.OP_ROW.itemsize
                + len(self._tensor_rows) * (schema.TENSOR_ROW.itemsize + 64))

    def _append_bytes(self, arr: np.ndarray, *, index: bool = False) -> int:
        """Append to the blob; `index`: the ops' text at a commit, which (like the index rows)
        is written out of the room kept for the index, past the free-space check that stops
        tensor bytes (so the ops recorded before a full disk still commit).

        Tensor bytes never take the blob room the waiting ops' texts need: when a disk
        another program filled stops recording, the commit at close writes those texts into
        space the blob already holds. (Taken by tensor bytes, the texts needed new chunks the
        full disk refused, and the close lost every op since the last commit.)"""
        off = self._blob_len
        end = off + arr.size
        if not index:
            self._ensure_space(arr.size)
            self._make_room(end + self._text_bytes)
        else:  # the texts: their room was kept as their ops came (see _write_op)
            self._make_room(end, exact=True)
        space = self._space
        if arr.size:
            space.write(arr.data.cast("B"), off)
        self._blob_len = end
        return off

    def _make_room(self, need: int, exact: bool = False) -> None:
        """Grow the blob to hold `need` bytes, into disk space held first."""
        space = self._space
        if need <= space.capacity:
            return
        # allocated space is file space: doubling up to 64 MiB steps (never a 2x file)
        size = need if exact else max(
            need, min(2 * space.capacity, space.capacity + _BLOB_GROW), space.chunk)
        self._hold(size - space.capacity + _HEADROOM)  # the new chunks and what follows
        space.grow(size)

    def _write_op(self, op: OpEntry, tensors: list[TensorEntry], _size: int) -> None:
        site = op.site
        text = optext.encode((site.op, site.phase, site.module, site.source, op.stack, op.args,
                              json.dumps(op.extra) if op.extra else ""))
        self._text_bytes += len(text)  # its room is kept before any of its tensors' bytes
        first_row = len(self._tensor_rows)
        try:
            self._make_room(self._blob_len + self._text_bytes)
            self._write_tensors(tensors)
        except BaseException:
            del self._tensor_rows[first_row:]  # an op is recorded whole or not at all
            for t in tensors:
                self._file_rows.pop(t.row, None)
            raise
        self._op_rows.append((site.seq, site.step, op.n_in, op.n_out, op.epoch))
        self._op_texts.append(text)

    def _write_tensors(self, tensors: list[TensorEntry]) -> None:
        rows = self._tensor_rows
        for t in tensors:
            if t.data is None and t.first < 0 and not t.strided and t.source_hash == NO_HASH:
                # no bytes, none shared (every row of a statistics dump): only its row, and
                # no entry in the maps that find bytes (they would grow with every row)
                rows.append(_row(t, -1, 0, -1, NO_HASH, None))
                continue
            if t.data is not None:
                host = t.data if isinstance(t.data, torch.Tensor) else t.data.wait()
                arr = _as_bytes(host)
                off = self._append_bytes(arr)
                self._offsets[t.row] = (off, arr.size)
                if t.strided:  # a storage range in storage order: hashed in element order
                    lay = self._layouts[t.row] = t.layout or t.stride
                    arr = layout_of.gather(arr, t.shape, lay, dtypes.itemsize(t.dtype))
                self._hashes[t.row] = content_hash(arr)  # the one place stored bytes are hashed
                self.bytes_written += arr.size
                offset, nbytes, first = off, arr.size, t.row
                t.data = None
            elif t.source_hash != NO_HASH:  # the replayed dump holds the bytes (add_op checked)
                offset, nbytes, first = schema.IN_SOURCE, t.nbytes, -1
                self._hashes[t.row] = t.source_hash
            elif t.strided and t.holder in self._offsets:  # a view of bytes stored before
                offset, nbytes, first = self._write_view(t)
            elif t.first >= 0 and t.first in self._offsets:
                offset, nbytes = self._offsets[t.first]
                first = t.first
                self._hashes[t.row] = self._hashes[t.first]
                self.bytes_linked += nbytes
                if first in self._layouts:  # reads its first row's elements, as that row does
                    self._layouts[t.row] = ()
            else:
                offset, nbytes, first = -1, 0, -1
            lay = None
            if offset >= 0:  # a row others' `first` may name: its index in the file's table
                lay = self._layouts.get(t.row)
                self._file_rows[t.row] = self._n_tensors + len(rows)
            if first >= 0:
                first = self._file_rows.get(first, -1)
                if first < 0 and lay == ():  # a strided link whose first row was dropped
                    offset, nbytes, lay = -1, 0, None
                elif first < 0:  # its first row was dropped with its op: it holds the bytes
                    first = self._file_rows[t.row]
            rows.append(_row(t, offset, nbytes, first, self._hashes.get(t.row, NO_HASH), lay))

    def _write_view(self, t: TensorEntry) -> tuple[int, int, int]:
        """A strided row over the bytes stored for `t.holder`: its elements read back (from
        the page cache) and hashed in row-major order, as a copy of them would hash."""
        size, lay = dtypes.itemsize(t.dtype), t.layout or t.stride
        offset = self._offsets[t.holder][0] + t.elem_offset * size
        need = layout_of.span(t.shape, lay, size)
        elements = layout_of.gather(self._space.read(offset, need), t.shape, lay, size)
        self._offsets[t.row] = (offset, t.nbytes)
        self._layouts[t.row] = lay
        self._hashes[t.row] = content_hash(elements)
        self.bytes_linked += t.nbytes
        return offset, t.nbytes, t.row

    @staticmethod
    def _append_rows(ds: h5py.Dataset, rows: list[tuple[Any, ...]], start: int
                     ) -> tuple[int, np.ndarray]:
        arr = np.array(rows, dtype=ds.dtype)
        if not rows:
            return start, arr
        ds.resize((start + len(rows),))
        ds[start:] = arr
        return start + len(rows), arr

    def _store_op_texts(self) -> list[tuple[Any, ...]]:
        """Append the waiting ops' texts to the blob, back to back; their complete rows."""
        texts = self._op_texts
        if not texts:
            return []
        off = self._append_bytes(np.frombuffer(b"".join(texts), np.uint8), index=True)
        rows = []
        for row, text in zip(self._op_rows, texts, strict=True):
            rows.append((*row, off, len(text)))
            off += len(text)
        return rows

    def _flush(self) -> None:
        # Bytes first (tensors' and the ops' text), then the tensor rows that point at them,
        # then op rows, then the hash of those rows, then the status counts that make them
        # visible: a crash between any two steps loses no committed row.
        # HDF5 writes only here and at close, into space held first (a DiskFullError leaves
        # the file as the last commit left it); its flush may truncate what was held away.
        op_rows = self._store_op_texts()
        # after a failure (a full disk) only what the rows need: what is still held
        margin = _HEADROOM if self.error is None else _CLOSE_ROOM
        self._hold(self._pending_rows_size() + margin)
        self._n_tensors, trows = self._append_rows(self._tensors, self._tensor_rows,
                                                   self._n_tensors)
        self._n_ops, orows = self._append_rows(self._ops, op_rows, self._n_ops)
        if len(trows) or len(orows):
            self._batches.resize((self._n_batches + 1,))
            self._batches[self._n_batches] = (self._n_ops, self._n_tensors,
                                              rows_hash(orows, trows, self._op_texts))
            self._n_batches += 1
        self._tensor_rows.clear()
        self._op_rows.clear()
        self._op_texts.clear()
        self._text_bytes = 0
        self._file.flush()
        self._hold(_CLOSE_ROOM)  # failing: the rows above are in the file, not committed
        self._status[:] = [self._n_ops, self._n_tensors, 0, self._blob_len]
        self._file.flush()
        self._n_committed = self._n_ops

    def _finish(self, attrs: dict[str, Any], complete: bool) -> None:
        # Still in SWMR mode (HDF5 >= 1.10 lets a SWMR writer add attributes and shrink a
        # chunked dataset), so even a kill during close leaves a consistent file.
        self._flush()
        self._hold(_CLOSE_ROOM)
        f = self._file
        if self._blob_len < self._space.capacity:
            self._space.release_unused(self._blob_len)
            self._space.shrink(self._blob_len)
        ok = bool(complete and self.error is None)
        self._set_attrs(f, {**{k: _attr_value(v) for k, v in attrs.items()},
                            "bytes_written": self.bytes_written,
                            "bytes_linked": self.bytes_linked, "complete": ok})
        f.attrs[ATTRS_HASH] = np.uint64(attrs_hash(self._attrs))
        f.flush()
        self._status[:] = [self._n_ops, self._n_tensors, int(ok), self._blob_len]
        f.close()  # HDF5 truncates the file to its end: what was held is given back
        self._release_handles()

    def _set_attrs(self, f: h5py.File, values: dict[str, Any]) -> None:
        """Write root attributes, keeping what each reads back as (a numpy scalar as its
        Python value, as `attrs_hash` takes it): the hash written at close is taken from
        these, not from reading every attribute back out of HDF5 (~1.2 ms a dump); the
        reader still hashes what the file holds."""
        for k, v in values.items():
            f.attrs[k] = v
            self._attrs[k] = v.item() if isinstance(v, np.generic) else v

    def _abandon(self) -> None:
        """Close after the close failed, keeping whatever was committed, exactly once.

        The close failed in HDF5 (ENOSPC on a disk another program filled) or was refused for
        want of held disk space. HDF5 cannot close such a file: its close retries the failed
        writes, fails half-way, and HDF5 then segfaulted the training process at exit,
        closing the file again. So the file's descriptor is pointed at /dev/null first: the
        close then succeeds without touching the disk, and the file keeps what was committed
        before (SWMR ordering: it reads like the file of a killed process, `complete` false
        since it was created). Should a close still fail, its h5py objects are never freed
        (see `_keep_forever`).
        """
        try:
            _discard_writes(self._file)
            self._file.close()
        except Exception as e:  # noqa: BLE001
            log.error("could not close %s cleanly after an error: %s", self.path, e)
            _keep_forever({k: v for k, v in self.__dict__.items() if k.startswith("_")})
        self._release_handles()
        give_back(self.path)  # the close above did not reach the disk

    def _release_handles(self) -> None:
        for name in ("_file", "_blob", "_space", "_ops", "_tensors", "_status"):
            self.__dict__.pop(name, None)
