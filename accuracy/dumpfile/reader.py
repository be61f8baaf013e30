"""The one reader of dump files: opens lazily, validates, and names tensors by address.

Only the two small index tables are read at open; tensor bytes are read on demand, so a
multi-GB dump opens in milliseconds. `Dump` puts the parts together: what a file must be
(`opening`), its index as records (`index`, `records`), its stored bytes (`blob`) and their
checks (`verify`).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from accuracy.dumpfile import index, layout, optext, schema, validate, verify
from accuracy.dumpfile.blob import StoredBytes
from accuracy.dumpfile.checksum import Checksum, ContentHash
from accuracy.dumpfile.errors import H5_ERRORS, DamagedDataError, DumpError
from accuracy.dumpfile.opening import (
    STATUS,
    check_format,
    check_metadata_hashes,
    open_h5,
    read_attrs,
    require_regular_file,
)
from accuracy.dumpfile.records import OpRecord, TensorRecord, TensorRef
from accuracy.errors import NoMatchError
from accuracy.patterns import module_matches, no_op_message, op_matches, unmatched_ops

if TYPE_CHECKING:  # torch is imported only by the calls that return tensors
    import torch

# Where these names were before the reader was split: `from accuracy.dumpfile.reader import
# OpRecord` keeps working (the package's own face is `accuracy.dumpfile`).
__all__ = ["DamagedDataError", "Dump", "DumpError", "OpRecord", "TensorRecord", "TensorRef",
           "load_dump", "require_regular_file"]


class Dump:
    """A dump opened read-only. Use `load_dump(path)`; close it or use it in a `with`."""

    def __init__(self, path: str | os.PathLike[str], *, sources: bool = True) -> None:
        """sources: a replay's rows whose bytes are the replayed dump's (`schema.IN_SOURCE`)
        are read from that dump, found beside this file; False leaves them without data (the
        source itself is opened so: a chain of replays never opens files in a loop)."""
        self.path = require_regular_file(path)
        self._sources = sources
        self._source: Dump | None = None
        self.source_problem = ""  # why rows held by the replayed dump cannot be read
        self.schema_version = -1
        self._f, self.closed_cleanly = open_h5(self.path)
        try:
            self.schema_version = check_format(self._f, self.path)
            validate.check_layout(self._f)
            self.attrs = read_attrs(self._f)
            self._load_index()
        except DumpError:
            self._f.close()
            raise
        except validate.LayoutError as e:
            self._f.close()
            raise DumpError(f"{self.path}: refused: {e}") from None
        except H5_ERRORS as e:
            self._f.close()
            raise DumpError(f"{self.path}: damaged dump ({type(e).__name__}: {e})") from None
        except BaseException:
            self._f.close()
            raise

    def _load_index(self) -> None:
        blob, ops, tensors, status = (validate.open_dataset(self._f, p) for p in (
            schema.BLOB, schema.OPS, schema.TENSORS, STATUS))
        counts = status[:]
        if not self.closed_cleanly:
            # A live file (SWMR): the writer grows the tables before it commits their counts,
            # so tables seen after the counts hold every committed row (seen before, they
            # could lag the counts: "/_status says 16384 ops, the table has 16128 rows").
            for ds in (blob, ops, tensors):
                ds.refresh()
        n_ops, n_tensors, self.blob_len = validate.check_index(
            counts, ops, tensors, blob, self.path.stat().st_size)
        rows = ops[:n_ops]
        self._tensors = tensors[:n_tensors]
        validate.check_op_rows(rows, self.blob_len)
        validate.check_tensor_rows(self._tensors, self.blob_len,
                                   in_source=self.schema_version >= schema.SOURCE_ROWS_SCHEMA)
        self._bytes = StoredBytes(self.path, blob, self.blob_len, self.closed_cleanly)
        self._checksum_kind = verify.checksum_kind(self._tensors)
        texts = self._op_texts(rows) if "text" in (rows.dtype.names or ()) else None
        check_metadata_hashes(self._f, self.path, rows, self._tensors, texts,
                              live=not self.closed_cleanly, complete=self.attrs["complete"])
        self._ops = rows
        self._text_columns = (optext.columns(texts) if texts is not None else
                              {k: index.text(rows[k]) for k in schema.OP_TEXT_FIELDS})

    def _op_texts(self, rows: np.ndarray) -> list[bytes]:
        """Schema 4: each op's stored text, read a run of neighbouring texts at a time."""
        out: list[bytes] = []
        for a, b, offset, nbytes in optext.text_runs(rows["text"], rows["text_nbytes"]):
            run = self.read_bytes(offset, nbytes, f"the text of op rows {a}-{b - 1}").tobytes()
            for off, n in zip(rows["text"][a:b].tolist(), rows["text_nbytes"][a:b].tolist(),
                              strict=True):
                out.append(run[off - offset: off - offset + n])
        return out

    # -- records ---------------------------------------------------------------------------

    @cached_property
    def tensors(self) -> list[TensorRecord]:
        """Every tensor row, in file order."""
        try:
            return self._parse_tensors()
        except (ValueError, TypeError, KeyError, IndexError, UnicodeError) as e:
            raise DumpError(f"{self.path}: damaged tensor index ({e})") from None

    def _parse_tensors(self) -> list[TensorRecord]:
        if len(self._tensors) == 0:
            return []
        rows = index.tensor_records(self, self._tensors, self._op_names_by_seq, self.attrs)
        if any(t.offset == schema.IN_SOURCE for t in rows):
            src = self._open_source()
            if src is not None:
                self.source_problem = index.resolve_in_source(rows, src) or self.source_problem
        return rows

    def _open_source(self) -> Dump | None:
        """The replayed dump, looked for only beside this file, under the name its
        `replayed_from` attribute gives (a file names no other folder to open); None, with
        `source_problem` set, when it is not there or not readable."""
        name = self.attrs.get("replayed_from")
        if not self._sources:
            self.source_problem = ("rows held by the replayed dump are not followed from "
                                   "this file (opened as the replayed dump of another, or "
                                   "uploaded to a server, whose runs are not kept beside "
                                   "their dumps)")
            return None
        if not isinstance(name, str) or not Path(name).name:
            self.source_problem = "the file names no replayed dump (no replayed_from)"
            return None
        path = self.path.parent / Path(name).name
        try:
            if path.resolve() == self.path.resolve():
                raise DumpError(f"{path}: names itself as the replayed dump")
            self._source = Dump(path, sources=False)
        except (DumpError, OSError, ValueError, RuntimeError) as e:  # NUL bytes, link loops
            self.source_problem = (f"their bytes are in the replayed dump {Path(name).name}, "
                                   f"expected beside this file: {e}")
            return None
        return self._source

    @cached_property
    def _op_names_by_seq(self) -> dict[int, str]:
        return dict(zip(self._ops["seq"].tolist(), self._text_columns["op"], strict=True))

    @cached_property
    def records(self) -> list[OpRecord]:
        """Every op, in execution order."""
        try:
            return index.op_records(self._ops, self._text_columns, self.tensors)
        except DumpError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, UnicodeError) as e:
            raise DumpError(f"{self.path}: damaged op index ({e})") from None

    @cached_property
    def _by_seq(self) -> dict[int, OpRecord]:
        return {r.seq: r for r in self.records}

    def record(self, seq: int) -> OpRecord:
        try:
            return self._by_seq[seq]
        except KeyError:
            raise KeyError(f"{self.path}: no op with sequence number {seq}") from None

    def tensor_record(self, addr: str) -> TensorRecord:
        """The record at an address such as `/aten.add.Tensor/17/output/0`."""
        op, seq, io, idx = schema.parse_address(addr)
        rec = self.record(seq)
        if rec.op != op:
            raise KeyError(f"{self.path}: op {seq} is {rec.op}, not {op}")
        items = rec.inputs if io == schema.INPUT else rec.outputs
        for t in items:
            if t.idx == idx:
                return t
        raise KeyError(f"{self.path}: no tensor at {addr}")

    def tensor(self, addr: str) -> torch.Tensor:
        return self.tensor_record(addr).load()

    def require_op(self, op: str | None) -> None:
        """Refuse an op pattern that names no op of this dump (a misspelling: the command
        would list, extract or convert nothing), listing its op names closest first."""
        if not op:
            return
        names = {r.op for r in self.records}
        if unmatched_ops([op], names):
            raise NoMatchError(no_op_message(op, names, str(self.path)))

    def select(
        self,
        op: str | None = None,
        module: str | None = None,
        phase: str | None = None,
        seq: int | None = None,
    ) -> Iterator[OpRecord]:
        """Records matching all given filters (op and module accept glob patterns)."""
        for r in self.records:
            if op and not op_matches(op, r.op):
                continue
            if module and not module_matches(module, r.module):
                continue
            if phase and r.phase != phase:
                continue
            if seq is not None and r.seq != seq:
                continue
            yield r

    # -- tensor values ---------------------------------------------------------------------

    def read_tensor(self, t: TensorRecord) -> torch.Tensor:
        """The tensor's values, after checking its bytes against the stored checksum."""
        import torch

        if t.dump is not self:  # a replay's row held by the replayed dump
            return t.dump.read_tensor(t)
        dtype = self._dtype_with_data(t)
        lay = t.byte_layout
        if lay is not None:  # a storage's bytes read through a layout: its elements gathered
            raw = self._bytes.elements(t.offset, *lay, dtype.itemsize, t.address)
        else:
            raw = self.read_bytes(t.offset, t.nbytes, t.address)
        self.check_bytes(t, raw)
        if t.nbytes == 0:
            return torch.empty(t.shape, dtype=dtype)
        return torch.from_numpy(raw).view(dtype).reshape(t.shape)

    def _dtype_with_data(self, t: TensorRecord) -> torch.dtype:
        if t.offset == schema.IN_SOURCE:
            raise DumpError(f"{self.path}: {t.address}: the reference output equals the "
                            f"device output, whose bytes it does not repeat: "
                            f"{self.source_problem}")
        if not t.has_data:
            raise DumpError(
                f"{self.path}: {t.address} has statistics only (dumped in statistics mode, or "
                "filtered); dump in tensor mode to get its values"
            )
        try:
            return schema.torch_dtype(t.dtype)
        except ValueError as e:
            raise DumpError(f"{self.path}: cannot read {t.address}: {e}") from None

    def read_tensor_mapped(self, t: TensorRecord) -> torch.Tensor:
        """Like `read_tensor`, but the bytes are mapped from the file instead of read.

        The mapping is copy-on-write: writing to the tensor changes a private copy, never the
        file. Falls back to `read_tensor` where the bytes can't be mapped (a file still being
        written, compressed or scattered storage, unaligned offsets). The checksum is checked
        either way.
        """
        if t.dump is not self:  # a replay's row held by the replayed dump
            return t.dump.read_tensor_mapped(t)  # type: ignore[attr-defined]
        if not t.has_data or t.nbytes == 0 or t.byte_layout is not None:
            return self.read_tensor(t)  # a strided row is gathered: a copy either way
        import torch

        dtype = self._dtype_with_data(t)
        raw = self._bytes.view(t.offset, t.nbytes, align=dtype.itemsize)
        if raw is None:
            return self.read_tensor(t)
        self.check_bytes(t, raw)
        return torch.from_numpy(raw).view(dtype).reshape(t.shape)

    # -- stored bytes ----------------------------------------------------------------------

    def read_bytes(self, offset: int, nbytes: int, what: str) -> np.ndarray:
        """Bytes [offset, offset + nbytes) of the stored data, as a private uint8 array.

        The public ranged read (compare reads big tensors in windows through it): the range is
        checked against the committed data, and any HDF5 failure becomes a DumpError naming
        `what` (the tensor's address).
        """
        return self._bytes.read(offset, nbytes, what)

    def read_range(self, ref: TensorRef, start: int, stop: int) -> np.ndarray:
        """Bytes of values [start, stop) of `ref` (in units of its value dtype: a complex
        tensor's parts), as a read-only uint8 array, for reading a big tensor in windows.
        Verify what was read with `ref.new_checksum()` and `check_checksum`.

        Where the bytes lie contiguously in a cleanly closed, unfiltered file they are a view
        of the file's memory mapping (no copy: the OS page cache is read once, by whoever
        consumes the view); elsewhere they are read through HDF5.
        """
        return self._bytes.read_range(ref, start, stop)

    def file_offset(self, offset: int, nbytes: int) -> int | None:
        """Where stored bytes [offset, offset + nbytes) lie in the file, if contiguously and
        the file can be mapped; None otherwise."""
        return self._bytes.file_offset(offset, nbytes)

    @property
    def chunk_bytes(self) -> int:
        """Bytes per HDF5 chunk of the stored data (0 when stored contiguously): a ranged
        read costs at least one chunk."""
        return self._bytes.chunk_bytes

    # -- checks of stored bytes ------------------------------------------------------------

    @property
    def checksum_kind(self) -> str:
        """What stored bytes are checked against: the content hash (schema 3) or the sum."""
        return self._checksum_kind

    def new_check(self, t: TensorRecord) -> tuple[Checksum | ContentHash, int] | None:
        """(running check, value it must reach) for `t`'s bytes read in order, or None when
        nothing was stored to check against. ValueError for an unknown dtype."""
        return verify.new_check(t)

    def check_bytes(self, t: TensorRecord, raw: np.ndarray) -> None:
        """Raise DumpError when `raw` (all of `t`'s bytes) does not match the stored check."""
        verify.check_bytes(self.path, self._checksum_kind, t, raw)

    def check_checksum(self, what: str, computed: int, stored: float | int) -> None:
        verify.check_checksum(self.path, self._checksum_kind, what, computed, stored)

    def verify(self) -> list[str]:
        """Every stored tensor's bytes against its checksum; one line per problem found.

        Reads each stored byte range once (links share it), in pieces of bounded size.
        """
        return verify.verify(self.path, self.tensors, self.source_problem)

    # -- summary ---------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """What `accuracy info` shows: counts by op, phase, module and dtype, and bytes."""
        recs = self.records
        tensors = self.tensors
        written = _stored_bytes([t for t in tensors if t.has_data and not t.is_link
                                 and t.dump is self])
        # links, and views of stored bytes (schema 6)
        linked = sum(t.nbytes for t in tensors if t.has_data and t.dump is self) - written
        in_source = sum(t.nbytes for t in tensors if t.dump is not self
                        or t.offset == schema.IN_SOURCE)
        return {
            "path": str(self.path),
            "file_bytes": self.path.stat().st_size,
            "complete": self.attrs.get("complete", False) and self.closed_cleanly,
            "closed_cleanly": self.closed_cleanly,
            "attrs": {k: v for k, v in self.attrs.items() if k not in ("format",)},
            "ops": len(recs),
            "tensors": len(tensors),
            "tensors_with_data": sum(1 for t in tensors if t.has_data),
            "bytes_written": written,
            "bytes_saved_by_links": linked,
            "bytes_in_replayed_dump": in_source,
            "by_op": dict(Counter(r.op for r in recs).most_common()),
            "by_phase": dict(Counter(r.phase for r in recs)),
            "modules": len({r.module for r in recs if r.module}),
            "by_dtype": dict(Counter(t.dtype for t in tensors).most_common()),
            "tensor_devices": sorted({t.device for t in tensors}),
            "steps": sorted({r.step for r in recs}),
            "checksum_kind": self.checksum_kind,
        }

    # -- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
        self._bytes.close()
        self._f.close()

    def __enter__(self) -> Dump:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self._ops)

    def __repr__(self) -> str:
        return f"Dump({str(self.path)!r}, ops={len(self)}, complete={self.attrs['complete']})"


def _stored_bytes(rows: list[TensorRecord]) -> int:
    """Bytes of the data these rows read, each byte once (a view's lie in another's)."""
    spans = sorted((t.offset, t.offset + (t.nbytes if t.byte_layout is None else layout.span(
        *t.byte_layout, t.nbytes // max(t.numel, 1)))) for t in rows if t.nbytes)
    total, reach = 0, 0
    for a, b in spans:
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def load_dump(path: str | os.PathLike[str], *, sources: bool = True) -> Dump:
    """Open a dump lazily. Raises DumpError with the file and the reason when it can't.
    `sources=False`: a replay's rows held by its replayed dump are not read from the dump
    beside it (see `Dump`)."""
    return Dump(path, sources=sources)
