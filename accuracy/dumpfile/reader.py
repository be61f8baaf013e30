"""The one reader of dump files: opens lazily, validates, and names tensors by address.

Only the two small index tables are read at open; tensor bytes are read on demand, so a
multi-GB dump opens in milliseconds.
"""

from __future__ import annotations

import math
import mmap
import os
import stat
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import h5py
import numpy as np

from accuracy.dumpfile import dtypes, optext, schema, validate
from accuracy.dumpfile.checksum import (
    ATTRS_HASH,
    CONTENT_HASH_KIND,
    NO_HASH,
    SUM_KIND,
    Checksum,
    ContentHash,
    attrs_hash,
    content_hash,
    rows_hash,
    running_check,
)
from accuracy.errors import AccuracyError
from accuracy.patterns import module_matches, op_matches

if TYPE_CHECKING:  # torch is imported only by the calls that return tensors
    import torch

STATUS = "_status"
_VERIFY_PIECE = 64 << 20  # bytes read at a time by `Dump.verify`

# h5py reports damaged metadata or data as any of these (HDF5 errors, bad values decoded)
_H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError, UnicodeError,
              RecursionError, OverflowError)


class DumpError(AccuracyError, ValueError):
    """A file that cannot be read as a dump; the message names the file and the problem."""


class DamagedDataError(DumpError):
    """A tensor's stored bytes are damaged (checksum mismatch, unreadable HDF5 chunks)."""


@dataclass(eq=False)
class TensorRecord:
    """One tensor use: an input or output of one op, with its statistics."""

    dump: Dump = field(repr=False)
    row: int
    op: str
    seq: int
    io: int
    idx: int
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    device: str
    offset: int
    nbytes: int
    first: int
    stats: dict[str, float]
    content_hash: int = NO_HASH  # XXH3-64 of the stored bytes (schema 3), else NO_HASH

    @property
    def address(self) -> str:
        return schema.address(self.op, self.seq, self.io, self.idx)

    @property
    def has_data(self) -> bool:
        return self.offset >= 0

    @property
    def is_link(self) -> bool:
        """True when the bytes were written for an earlier use of the same tensor."""
        return self.has_data and self.first != self.row

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape else 1  # plain ints: 10x cheaper than np.prod

    @property
    def values_key(self) -> tuple:
        """Which values this tensor holds, to match uses of one tensor across ops: the row
        that first held its bytes (tensor dumps), else its dtype and statistics (statistics
        dumps record no bytes; a view's shape differs, its values do not)."""
        if self.first >= 0:
            return ("row", self.first)
        return ("stats", self.dtype, tuple(sorted(self.stats.items())))

    def load(self) -> torch.Tensor:
        """The tensor with its original dtype and shape (contiguous, on CPU)."""
        return self.dump.read_tensor(self)

    def ref(self) -> TensorRef:
        """Where this tensor's bytes live, as a picklable descriptor (see `Dump.read_range`)."""
        return TensorRef.of(self)


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor's bytes live and what they must sum to: enough for any process (a
    worker, a cluster node) to open the dump and read them with `Dump.read_range`."""

    path: str
    offset: int
    nbytes: int
    dtype: str
    numel: int
    stats: tuple[tuple[str, float], ...]
    address: str = ""
    content_hash: int = NO_HASH

    @classmethod
    def of(cls, t: TensorRecord) -> TensorRef:
        return cls(str(t.dump.path), t.offset, t.nbytes, t.dtype, t.numel,
                   tuple(sorted(t.stats.items())), t.address, t.content_hash)

    @property
    def what(self) -> str:
        return self.address or f"tensor at offset {self.offset}"

    @property
    def checksum(self) -> int | None:
        """The stored checksum, or None when the dump recorded no statistics for it."""
        s = dict(self.stats)
        if s.get("nan_count", -1) < 0 or "checksum" not in s:
            return None
        return int(s["checksum"])

    def new_checksum(self) -> Checksum | ContentHash | None:
        """A running check of this tensor's bytes as they are read, in order (the content
        hash where the dump has one); compare its value with `stored_check`."""
        c = running_check(dict(self.stats), self.dtype, dtypes.itemsize(self.dtype),
                          self.content_hash)
        return c[0] if c else None

    @property
    def stored_check(self) -> int | None:
        """The value `new_checksum()` must reach (content hash, else the sum), or None."""
        c = running_check(dict(self.stats), self.dtype, dtypes.itemsize(self.dtype),
                          self.content_hash)
        return c[1] if c else None

    @property
    def value_dtype(self) -> str:
        """Complex tensors are compared as their real view (real, imag interleaved)."""
        return dtypes.value_dtype(self.dtype)

    @property
    def n_values(self) -> int:
        return self.numel * (2 if self.dtype in dtypes.COMPLEX_PART else 1)

    @property
    def finite(self) -> bool:
        s = dict(self.stats)
        return not (s.get("nan_count", 0) or s.get("inf_count", 0))

    def minmax(self) -> tuple[float, float]:
        s = dict(self.stats)
        return s.get("min", math.nan), s.get("max", math.nan)


@dataclass(eq=False)
class OpRecord:
    """One recorded ATen op call."""

    seq: int
    op: str
    phase: str
    module: str
    source: str
    stack: str
    args_json: str
    step: int
    extra: dict[str, Any]
    inputs: list[TensorRecord]
    outputs: list[TensorRecord]
    epoch: int = schema.UNKNOWN_EPOCH  # collectives its rank issued before it; -1: unknown

    def call(self, tensors: list[Any]) -> tuple[list[Any], dict[str, Any]]:
        """Rebuild (args, kwargs) of the call with `tensors` in the input placeholders."""
        from accuracy.dumpfile.argcodec import decode_call  # imports torch

        return decode_call(self.args_json, tensors)

    @property
    def tensors(self) -> list[TensorRecord]:
        return self.inputs + self.outputs


def require_regular_file(path: str | os.PathLike[str]) -> Path:
    """The path, if it names a regular file; else one DumpError line, before any open.

    Opening a FIFO blocks until a writer appears and a device may never end, so every reader
    entry point (load_dump, extract files, the server's registration and uploads) calls this
    first: it only stats the path (following links), it never opens it.
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise DumpError(f"{p}: no such file") from None
    except OSError as e:
        raise DumpError(f"{p}: cannot be read ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise DumpError(f"{p}: is a directory, not a dump file")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise DumpError(f"{p}: is {kind}, not a dump file; give the path of a regular file")
    return p


def _open_h5(path: Path) -> tuple[h5py.File, bool]:
    """Open read-only; a file left open by a killed writer is opened through SWMR.

    Locking is best-effort: a shared lock where the file system has locks (a non-SWMR writer
    can't open the file meanwhile), and still readable on one without (NFS, Lustre).
    """
    try:
        return h5py.File(path, "r", locking="best-effort"), True
    except OSError as e:
        msg = str(e)
        if "already open for write" in msg or "consistency flags" in msg:
            try:
                return h5py.File(path, "r", swmr=True, locking="best-effort"), False
            except OSError as e2:
                msg = str(e2)
        if "signature" in msg:
            raise DumpError(f"{path}: not an HDF5 file (no HDF5 signature)") from None
        if "truncated" in msg or "eof" in msg.lower():
            raise DumpError(f"{path}: truncated HDF5 file ({msg})") from None
        raise DumpError(f"{path}: cannot be opened as HDF5: {msg}") from None


def _text(col: np.ndarray) -> list[str]:
    return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in col]


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
        self._f, self.closed_cleanly = _open_h5(self.path)
        try:
            self._validate()
            validate.check_layout(self._f)
            self.attrs = self._read_attrs()
            self._load_index()
        except DumpError:
            self._f.close()
            raise
        except validate.LayoutError as e:
            self._f.close()
            raise DumpError(f"{self.path}: refused: {e}") from None
        except _H5_ERRORS as e:
            self._f.close()
            raise DumpError(f"{self.path}: damaged dump ({type(e).__name__}: {e})") from None
        except BaseException:
            self._f.close()
            raise

    # -- opening ---------------------------------------------------------------------------

    def _extract_file(self, fmt: Any) -> DumpError | None:
        """An `accuracy extract` file (or groups h5copy'd out of one: `/aten.*` at the root)
        is not a dump: say what it is and what reads it."""
        if fmt != schema.EXTRACT_FORMAT_NAME and not (
                fmt is None and any(k.startswith("aten.") for k in list(self._f.keys())[:64])):
            return None
        src = self._f.attrs.get("source_dump")
        src = src.decode() if isinstance(src, bytes) else src
        came = f" (from {src})" if isinstance(src, str) and len(src) < 500 else ""
        return DumpError(
            f"{self.path}: ops written by `accuracy extract`{came} as plain HDF5 groups, not a "
            "dump: browse it with `h5ls -r`, load it with dumper(load_file_path=...), or run "
            "this command on the dump it came from")

    def _validate(self) -> None:
        if "format" not in self._f.attrs or self._f.attrs.get_id("format").get_storage_size(
                ) > validate.MAX_ATTR_BYTES:
            if (err := self._extract_file(None)) is not None:
                raise err
            raise DumpError(f"{self.path}: HDF5 file but not an accuracy dump (no format "
                            "attribute); was it written by another program?")
        fmt = self._f.attrs.get("format")
        if isinstance(fmt, bytes):
            fmt = fmt.decode()
        if (err := self._extract_file(fmt)) is not None:
            raise err
        if fmt != schema.FORMAT_NAME:
            raise DumpError(
                f"{self.path}: HDF5 file but not an accuracy dump (format attribute is "
                f"{fmt!r}); was it written by another program?"
            )
        try:
            version = int(self._f.attrs.get("schema_version", -1))
        except (TypeError, ValueError):
            version = -1
        if version > schema.NEWEST_READABLE:
            raise DumpError(
                f"{self.path}: written with dump schema {version}, newer than this accuracy "
                f"reads ({schema.NEWEST_READABLE}); upgrade accuracy"
            )
        self.schema_version = version
        if version < schema.OLDEST_READABLE:
            raise DumpError(f"{self.path}: invalid schema_version {version}")
        for name in (schema.BLOB, schema.OPS, schema.TENSORS, STATUS):
            if name not in self._f:
                raise DumpError(f"{self.path}: damaged dump, missing {name!r}")

    def _read_attrs(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in self._f.attrs.items():
            if isinstance(v, bytes):
                v = v.decode()
            elif isinstance(v, np.generic):
                v = v.item()
            if isinstance(v, str) and len(v) > validate.MAX_ATTR_BYTES:
                raise validate.LayoutError(f"attribute {k!r} is {len(v)} characters long")
            if isinstance(v, str) and v[:1] in "[{":
                try:
                    v = validate.parse_json(v, f"attribute {k!r}")
                except validate.LayoutError as e:
                    if "nested deeper" in str(e):
                        raise
            if k in schema.PATH_ATTRS:
                validate.check_path_text(v, f"attribute {k!r}")
            out[k] = v
        out["complete"] = bool(out.get("complete", False))
        return out

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
        self._blob = blob
        texts = self._op_texts(rows) if "text" in (rows.dtype.names or ()) else None
        self._check_metadata_hashes(rows, texts)
        self._ops = rows
        self._text_columns = (optext.columns(texts) if texts is not None else
                              {k: _text(rows[k]) for k in schema.OP_TEXT_FIELDS})

    def _op_texts(self, rows: np.ndarray) -> list[bytes]:
        """Schema 4: each op's stored text, read a run of neighbouring texts at a time."""
        out: list[bytes] = []
        for a, b, offset, nbytes in optext.text_runs(rows["text"], rows["text_nbytes"]):
            run = self.read_bytes(offset, nbytes, f"the text of op rows {a}-{b - 1}").tobytes()
            for off, n in zip(rows["text"][a:b].tolist(), rows["text_nbytes"][a:b].tolist(),
                              strict=True):
                out.append(run[off - offset: off - offset + n])
        return out

    def _check_metadata_hashes(self, ops: np.ndarray, texts: list[bytes] | None) -> None:
        """Schema 3: each flushed batch of index rows (schema 4: and the ops' stored text) and
        the root attributes against their hashes (a flipped byte in a source path or a min/max
        is refused on open, like damaged bytes). Older files have neither and are read as
        before."""
        n_ops, n_tensors = len(ops), len(self._tensors)
        if schema.BATCHES in self._f:
            batches = validate.open_dataset(self._f, schema.BATCHES)
            if not self.closed_cleanly:
                batches.refresh()
            if batches.dtype != schema.BATCH_ROW or batches.ndim != 1:
                raise DumpError(f"{self.path}: damaged dump (unknown batch-hash table)")
            o = t = 0
            for oe, te, h in batches[:].tolist():
                if oe > n_ops or te > n_tensors or (oe, te, h) == (0, 0, 0):
                    break  # a flush the status counts never made visible, or lost (disk full)
                if oe < o or te < t or rows_hash(ops[o:oe], self._tensors[t:te],
                                                 texts[o:oe] if texts else ()) != h:
                    raise DamagedDataError(
                        f"{self.path}: index rows {o}-{oe} (ops) / {t}-{te} (tensors) damaged: "
                        "their hash does not match; the file was altered or corrupted")
                o, t = oe, te
            if (o, t) != (n_ops, n_tensors) and bool(self.attrs.get("complete", False)):
                raise DamagedDataError(f"{self.path}: index rows past op {o} are not covered "
                                       "by a batch hash; the file was altered or corrupted")
        stored = self._f.attrs.get(ATTRS_HASH)
        if stored is not None and int(stored) != attrs_hash(dict(self._f.attrs.items())):
            raise DamagedDataError(f"{self.path}: root attributes damaged (their hash does not "
                                   "match); the file was altered or corrupted")

    # -- records ---------------------------------------------------------------------------

    @cached_property
    def tensors(self) -> list[TensorRecord]:
        """Every tensor row, in file order."""
        try:
            return self._parse_tensors()
        except (ValueError, TypeError, KeyError, IndexError, UnicodeError) as e:
            raise DumpError(f"{self.path}: damaged tensor index ({e})") from None

    def _parse_tensors(self) -> list[TensorRecord]:
        t = self._tensors
        if len(t) == 0:
            return []
        ops = self._op_names_by_seq
        dtypes, devices = _text(t["dtype"]), _text(t["device"])
        ndims = t["ndim"].tolist()
        shapes, strides = t["shape"].tolist(), t["stride"].tolist()
        # sums are omitted only beside a content hash: an older file claiming otherwise (its
        # attributes carry no hash of their own) must not turn its only byte check off
        sums = self.attrs.get(schema.SUMS_ATTR) != schema.SUMS_OMITTED \
            or "hash" not in (t.dtype.names or ())
        stats_cols = {k: t[k].tolist() for k in schema.STAT_FIELDS if k != "checksum" or sums}
        hashes = (t["hash"].tolist() if "hash" in (t.dtype.names or ())
                  else [NO_HASH] * len(t))
        out = []
        for i, (seq, io, idx, off, nb, first) in enumerate(
            zip(t["seq"].tolist(), t["io"].tolist(), t["idx"].tolist(), t["offset"].tolist(),
                t["nbytes"].tolist(), t["first"].tolist(), strict=True)
        ):
            out.append(TensorRecord(
                dump=self, row=i, op=ops.get(seq, "?"), seq=seq, io=io, idx=idx,
                dtype=dtypes[i], shape=tuple(shapes[i][:max(ndims[i], 0)]),
                stride=tuple(strides[i][:max(ndims[i], 0)]), device=devices[i],
                offset=off if ndims[i] >= 0 else -1,
                nbytes=nb, first=first, stats={k: v[i] for k, v in stats_cols.items()},
                content_hash=hashes[i] if ndims[i] >= 0 else NO_HASH,
            ))
        return self._resolve_in_source(out)

    def _resolve_in_source(self, rows: list[TensorRecord]) -> list[TensorRecord]:
        """Point each row whose bytes are the replayed dump's (`schema.IN_SOURCE`) at them:
        the row there at the same address, holding its own bytes with the same dtype, size
        and content hash (so reading it checks the bytes against this file's hash too). Rows
        that cannot be pointed stay without data; `source_problem` says why."""
        held = [i for i, t in enumerate(rows) if t.offset == schema.IN_SOURCE]
        if not held:
            return rows
        src = self._open_source()
        if src is None:
            return rows
        there = {(t.seq, t.io, t.idx): t for t in src.tensors}
        wrong = 0
        for i in held:
            t = rows[i]
            s = there.get((t.seq, t.io, t.idx))
            if s is None or not s.has_data or s.dump is not src or s.op != t.op \
                    or s.dtype != t.dtype or s.nbytes != t.nbytes \
                    or s.content_hash != t.content_hash:
                wrong += 1
                continue
            rows[i] = TensorRecord(
                dump=src, row=t.row, op=t.op, seq=t.seq, io=t.io, idx=t.idx, dtype=t.dtype,
                shape=t.shape, stride=t.stride, device=t.device, offset=s.offset,
                nbytes=s.nbytes, first=t.row, stats=t.stats, content_hash=t.content_hash)
        if wrong:
            self.source_problem = (
                f"{wrong} of the {len(held)} rows held by the replayed dump {src.path} do not "
                "match it (another dump of that name?)")
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
            return self._parse_records()
        except DumpError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, UnicodeError) as e:
            raise DumpError(f"{self.path}: damaged op index ({e})") from None

    def _extra(self, seq: int, text: str) -> dict[str, Any]:
        if not text:
            return {}
        value = validate.parse_json(text, f"op {seq}: extra")
        if not isinstance(value, dict):
            raise validate.LayoutError(f"op {seq}: extra is not a JSON object")
        return value

    def _parse_records(self) -> list[OpRecord]:
        o = self._ops
        by_seq: dict[int, tuple[list[TensorRecord], list[TensorRecord]]] = {
            s: ([], []) for s in o["seq"].tolist()
        }
        for t in self.tensors:
            if t.seq in by_seq:
                by_seq[t.seq][t.io].append(t)
        cols = self._text_columns
        validate.check_json_column(cols["args"], "call arguments")
        epochs = (o["epoch"].tolist() if "epoch" in (o.dtype.names or ())
                  else [schema.UNKNOWN_EPOCH] * len(o))  # schema 1 rows have no epoch
        out = []
        for i, (seq, step) in enumerate(zip(o["seq"].tolist(), o["step"].tolist(), strict=True)):
            ins, outs = by_seq[seq]
            extra = cols["extra"][i]
            out.append(OpRecord(
                seq=seq, op=cols["op"][i], phase=cols["phase"][i], module=cols["module"][i],
                source=cols["source"][i], stack=cols["stack"][i], args_json=cols["args"][i],
                step=step, extra=self._extra(seq, extra),
                inputs=sorted(ins, key=lambda r: r.idx), outputs=sorted(outs, key=lambda r: r.idx),
                epoch=epochs[i],
            ))
        return out

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

    def read_tensor(self, t: TensorRecord) -> torch.Tensor:
        """The tensor's values, after checking its bytes against the stored checksum."""
        import torch

        if t.dump is not self:  # a replay's row held by the replayed dump
            return t.dump.read_tensor(t)
        dtype = self._dtype_with_data(t)
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

    def read_bytes(self, offset: int, nbytes: int, what: str) -> np.ndarray:
        """Bytes [offset, offset + nbytes) of the stored data, as a private uint8 array.

        The public ranged read (compare reads big tensors in windows through it): the range is
        checked against the committed data, and any HDF5 failure becomes a DumpError naming
        `what` (the tensor's address).
        """
        if offset < 0 or nbytes < 0 or offset + nbytes > self.blob_len:
            raise DumpError(f"{self.path}: {what} points past the end of the data")
        if nbytes == 0:
            return np.empty(0, np.uint8)
        try:
            return self._blob[offset: offset + nbytes]
        except _H5_ERRORS as e:
            raise DamagedDataError(f"{self.path}: cannot read {what}: damaged data "
                            f"({type(e).__name__}: {e})") from None

    def read_range(self, ref: TensorRef, start: int, stop: int) -> np.ndarray:
        """Bytes of values [start, stop) of `ref` (in units of its value dtype: a complex
        tensor's parts), as a read-only uint8 array, for reading a big tensor in windows.
        Verify what was read with `ref.new_checksum()` and `check_checksum`.

        Where the bytes lie contiguously in a cleanly closed, unfiltered file they are a view
        of the file's memory mapping (no copy: the OS page cache is read once, by whoever
        consumes the view); elsewhere they are read through HDF5.
        """
        size = dtypes.itemsize(ref.value_dtype)
        a, b = start * size, min(stop * size, ref.nbytes)
        offset, nbytes = ref.offset + a, max(0, b - a)
        if nbytes and 0 <= offset and offset + nbytes <= self.blob_len:
            pos = self._file_offset(offset, nbytes)
            if pos is not None:
                mm = self._mapping[0]  # type: ignore[index]
                try:
                    view = np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=pos)
                except ValueError:  # the file shrank since it was opened
                    view = None
                if view is not None:
                    view.flags.writeable = False
                    return view
        raw = self.read_bytes(offset, nbytes, ref.what)
        raw.flags.writeable = False
        return raw

    @property
    def chunk_bytes(self) -> int:
        """Bytes per HDF5 chunk of the stored data (0 when stored contiguously): a ranged
        read costs at least one chunk."""
        return self._blob.chunks[0] * self._blob.dtype.itemsize if self._blob.chunks else 0

    @property
    def checksum_kind(self) -> str:
        """What stored bytes are checked against: the content hash (schema 3) or the sum."""
        return CONTENT_HASH_KIND if "hash" in (self._tensors.dtype.names or ()) else SUM_KIND

    def new_check(self, t: TensorRecord) -> tuple[Checksum | ContentHash, int] | None:
        """(running check, value it must reach) for `t`'s bytes read in order, or None when
        nothing was stored to check against. ValueError for an unknown dtype."""
        return running_check(t.stats, t.dtype, dtypes.itemsize(t.dtype), t.content_hash)

    def check_bytes(self, t: TensorRecord, raw: np.ndarray) -> None:
        """Raise DumpError when `raw` (all of `t`'s bytes) does not match the stored check."""
        if t.content_hash != NO_HASH:  # all the bytes at hand: one call, not a running state
            self.check_checksum(t.address, content_hash(raw), t.content_hash)
            return
        c = self.new_check(t)
        if c is None:
            return
        c[0].update(raw)
        self.check_checksum(t.address, c[0].value, c[1])

    def check_checksum(self, what: str, computed: int, stored: float | int) -> None:
        if computed != int(stored):
            raise DamagedDataError(
                f"{self.path}: {what}: data damaged ({self.checksum_kind} {computed} does not "
                f"match the stored {int(stored)}); the file was altered or corrupted after it "
                "was written")

    def read_tensor_mapped(self, t: TensorRecord) -> torch.Tensor:
        """Like `read_tensor`, but the bytes are mapped from the file instead of read.

        The mapping is copy-on-write: writing to the tensor changes a private copy, never the
        file. Falls back to `read_tensor` where the bytes can't be mapped (a file still being
        written, compressed or scattered storage, unaligned offsets). The checksum is checked
        either way.
        """
        if t.dump is not self:  # a replay's row held by the replayed dump
            return t.dump.read_tensor_mapped(t)
        if not t.has_data or t.nbytes == 0:
            return self.read_tensor(t)
        import torch

        dtype = self._dtype_with_data(t)
        pos = self._file_offset(t.offset, t.nbytes)
        if pos is None or pos % dtype.itemsize or t.offset + t.nbytes > self.blob_len:
            return self.read_tensor(t)
        mm, _, _ = self._mapping  # type: ignore[misc]
        try:
            raw = np.frombuffer(mm, dtype=np.uint8, count=t.nbytes, offset=pos)
        except ValueError:  # the file shrank since it was opened
            return self.read_tensor(t)
        self.check_bytes(t, raw)
        return torch.from_numpy(raw).view(dtype).reshape(t.shape)

    def verify(self) -> list[str]:
        """Every stored tensor's bytes against its checksum; one line per problem found.

        Reads each stored byte range once (links share it), in pieces of bounded size.
        """
        problems: list[str] = []
        seen: set[tuple[int, int, int, int, int]] = set()
        held = [t for t in self.tensors if t.offset == schema.IN_SOURCE]
        if held:
            problems.append(f"{self.path}: {len(held)} reference outputs cannot be read: "
                            f"{self.source_problem}")
        for t in self.tensors:
            if not t.has_data:
                continue
            try:
                check = self.new_check(t)
            except ValueError as e:
                problems.append(f"{self.path}: {t.address}: {e}")
                continue
            if check is None:
                continue
            c, stored = check
            key = (id(t.dump), t.offset, t.nbytes, dtypes.itemsize(t.dtype), stored)
            if key in seen:
                continue
            seen.add(key)
            d = t.dump  # this file, or the replayed dump holding a replay's row
            try:
                step = _VERIFY_PIECE - _VERIFY_PIECE % 16  # whole parts of any element size
                for a in range(0, t.nbytes, step):
                    c.update(d.read_bytes(t.offset + a, min(step, t.nbytes - a), t.address))
                d.check_checksum(t.address, c.value, stored)
            except DumpError as e:
                problems.append(str(e))
        return problems

    @cached_property
    def _mapping(self) -> tuple[mmap.mmap, int, np.ndarray] | None:
        """(file mapping, chunk size, file offset of each chunk or -1), or None if unmappable."""
        if not self.closed_cleanly or self._blob.compression is not None:
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

    def _file_offset(self, offset: int, nbytes: int) -> int | None:
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

    # -- summary ---------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """What `accuracy info` shows: counts by op, phase, module and dtype, and bytes."""
        recs = self.records
        tensors = self.tensors
        written = sum(t.nbytes for t in tensors if t.has_data and not t.is_link
                      and t.dump is self)
        linked = sum(t.nbytes for t in tensors if t.is_link)
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
        m = self.__dict__.pop("_mapping", None)
        if m is not None:
            try:
                m[0].close()
            except BufferError:  # tensors still map it: it closes when they are freed
                pass
        self._f.close()

    def __enter__(self) -> Dump:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self._ops)

    def __repr__(self) -> str:
        return f"Dump({str(self.path)!r}, ops={len(self)}, complete={self.attrs['complete']})"


def load_dump(path: str | os.PathLike[str], *, sources: bool = True) -> Dump:
    """Open a dump lazily. Raises DumpError with the file and the reason when it can't.
    `sources=False`: a replay's rows held by its replayed dump are not read from the dump
    beside it (see `Dump`)."""
    return Dump(path, sources=sources)
