"""Selected ops of a dump as real HDF5 groups, the layout Ascend's guide describes, and back.

`extract` writes a plain HDF5 file where `/aten.add.Tensor/17/input/0` is a dataset, so
`h5copy -s "/aten.add.Tensor/17/" ...` and any HDF5 viewer work on it. Repeated uses of the
same tensor become hard links. bfloat16 and float8 are stored as raw bits with a `dtype`
attribute, since HDF5 has no such types. Everything an op needs is on its own group and
datasets (h5copy copies an object's attributes, not the file's), so a file assembled with
h5copy from such groups is still readable.

`ExtractedOps` reads such a file back for load mode (`dumper(load_file_path=...)`): the file is
untrusted, so only the layout `extract` writes is accepted (hard links, plain datasets whose
bytes are all in the file, bounded counts).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch

from accuracy.dumpfile import schema
from accuracy.dumpfile.errors import DumpError
from accuracy.dumpfile.opening import require_regular_file
from accuracy.dumpfile.reader import Dump, load_dump
from accuracy.dumpfile.records import OpRecord
from accuracy.dumpfile.writer import check_dump_path
from accuracy.errors import NoMatchError, OutputExistsError

FORMAT_NAME = schema.EXTRACT_FORMAT_NAME
_RAW_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_NUMPY_OK = {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
             torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128}
MAX_OPS = 1_000_000
MAX_TENSORS_PER_OP = 4096


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype in _NUMPY_OK:
        return t.numpy()
    return t.view(_RAW_BITS.get(t.element_size(), torch.uint8)).numpy()


def extract(
    dump: Dump,
    out_path: str | os.PathLike[str],
    *,
    op: str | None = None,
    seq: int | None = None,
    module: str | None = None,
    overwrite: bool = False,
) -> int:
    """Copy the matching ops into `out_path`; returns how many ops were written.

    The file is written under a temporary name beside `out_path` and renamed when whole, so a
    failure half-way (a damaged tensor, a full disk, Ctrl-C) leaves no partial file and the
    file it would have replaced untouched."""
    out = check_dump_path(out_path, overwrite)
    dump.require_op(op)
    records = list(dump.select(op=op, module=module, seq=seq))
    if not records:
        raise NoMatchError(f"no op in {dump.path} matches op={op!r} seq={seq} module={module!r}")
    tmp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        with h5py.File(tmp, "w") as f:
            _write_ops(dump, f, records)
        _publish(tmp, out, overwrite)
    finally:
        tmp.unlink(missing_ok=True)
    return len(records)


def _write_ops(dump: Dump, f: h5py.File, records: list[OpRecord]) -> None:
    written: dict[int, str] = {}  # first row -> dataset path, for hard links
    f.attrs.update({"source_dump": str(dump.path), "format": FORMAT_NAME})
    for rec in records:
        if "/" in rec.op or rec.op in ("", ".", ".."):  # would land at another op's address
            raise DumpError(f"{dump.path}: op {rec.seq} is named {rec.op!r}, which cannot be "
                            "an HDF5 group name; extract the other ops with --op or --seq")
        g = f.create_group(f"{rec.op}/{rec.seq}")
        g.attrs.update({"phase": rec.phase, "module": rec.module, "source": rec.source,
                        "args": rec.args_json, "n_in": len(rec.inputs),
                        "n_out": len(rec.outputs)})
        for t in rec.tensors:
            if not t.has_data:
                continue
            name = t.address
            if t.first in written:
                f[name] = f[written[t.first]]  # hard link: same bytes, stored once
                continue
            ds = f.create_dataset(name, data=_as_numpy(t.load()))
            ds.attrs["dtype"] = t.dtype
            for k, v in t.stats.items():
                ds.attrs[k] = v
            written[t.first] = name


def _publish(tmp: Path, out: Path, overwrite: bool) -> None:
    """Move the finished file to `out`; without `overwrite`, never over a file that appeared
    there meanwhile (a hard link fails if the name exists; file systems without hard links
    get the check and the rename)."""
    if overwrite:
        os.replace(tmp, out)
        return
    try:
        os.link(tmp, out)
    except FileExistsError:
        raise OutputExistsError(f"{out} appeared while the ops were written; pass "
                                "overwrite=True (CLI: --overwrite) or choose another path"
                                ) from None
    except OSError:
        if out.exists():
            raise OutputExistsError(f"{out} appeared while the ops were written; pass "
                                    "overwrite=True (CLI: --overwrite) or choose another "
                                    "path") from None
        os.replace(tmp, out)


@dataclass
class ExtractResult:
    """How many ops `extract_file` wrote, and where."""

    ops: int
    path: Path

    def format(self) -> str:
        return f"wrote {self.ops} ops to {self.path}"


def extract_file(dump_path: str | os.PathLike[str], out_path: str | os.PathLike[str],
                 **select: Any) -> ExtractResult:
    """`extract` from the dump at `dump_path` (`op`, `seq`, `module`, `overwrite` as there)."""
    with load_dump(dump_path) as d:
        return ExtractResult(extract(d, out_path, **select), Path(out_path))


# -- reading an extracted file back (load mode) ----------------------------------------------


@dataclass(eq=False)
class ExtractedTensor:
    """One stored input or output of an extracted op (`has_data` False where it was not
    stored: statistics mode or filtered in the source dump)."""

    file: ExtractedOps = field(repr=False)
    address: str
    dtype: str
    shape: tuple[int, ...]
    has_data: bool = True

    def load(self) -> torch.Tensor:
        return self.file.read(self)


@dataclass(eq=False)
class ExtractedOp:
    seq: int
    op: str
    inputs: list[ExtractedTensor]
    outputs: list[ExtractedTensor]
    attrs: dict[str, Any]


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


class ExtractedOps:
    """An `accuracy extract` file (or groups h5copy'd out of one), opened read-only."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = require_regular_file(path)
        try:
            self._f = h5py.File(self.path, "r")
        except OSError as e:
            raise DumpError(f"{self.path}: cannot be opened as HDF5: {e}") from None
        try:
            self.attrs = {k: _text(v) for k, v in self._f.attrs.items()}
            self._ops = self._scan()
        except DumpError:
            self._f.close()
            raise
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
            self._f.close()
            raise DumpError(f"{self.path}: damaged extract file ({type(e).__name__}: {e})"
                            ) from None
        if not self._ops:
            self._f.close()
            raise DumpError(f"{self.path}: no /<op>/<seq>/input/<i> tensors in this file; "
                            "make it with `accuracy extract` (or h5copy groups out of one)")

    def _link_ok(self, group: h5py.Group, name: str) -> bool:
        link = group.get(name, getlink=True)
        if not isinstance(link, h5py.HardLink):
            raise DumpError(f"{self.path}: {group.name}/{name} is a {type(link).__name__}; "
                            "extract files hold only hard links")
        return True

    def _scan(self) -> dict[int, ExtractedOp]:
        ops: dict[int, ExtractedOp] = {}
        for op_name in self._f:
            self._link_ok(self._f, op_name)
            g_op = self._f[op_name]
            if not isinstance(g_op, h5py.Group):
                continue
            for seq_name in g_op:
                self._link_ok(g_op, seq_name)
                g = g_op[seq_name]
                if not isinstance(g, h5py.Group) or not seq_name.isdigit():
                    continue
                seq = int(seq_name)
                if seq in ops:
                    raise DumpError(f"{self.path}: seq {seq} appears under two ops")
                if len(ops) >= MAX_OPS:
                    raise DumpError(f"{self.path}: more than {MAX_OPS} ops")
                attrs = {k: _text(v) for k, v in g.attrs.items()}
                ops[seq] = ExtractedOp(seq, op_name, self._tensors(g, "input", attrs),
                                       self._tensors(g, "output", attrs), attrs)
        return ops

    def _tensors(self, g: h5py.Group, io: str, attrs: dict[str, Any]) -> list[ExtractedTensor]:
        if io not in g:
            stored: dict[int, h5py.Dataset] = {}
        else:
            self._link_ok(g, io)
            sub = g[io]
            stored = {}
            for name in sub:
                self._link_ok(sub, name)
                if name.isdigit() and isinstance(sub[name], h5py.Dataset):
                    stored[int(name)] = sub[name]
        declared = attrs.get("n_in" if io == "input" else "n_out")
        n = int(declared) if declared is not None else (max(stored) + 1 if stored else 0)
        if n > MAX_TENSORS_PER_OP or (stored and max(stored) >= n):
            raise DumpError(f"{self.path}: {g.name}/{io} has a bad tensor count")
        out = []
        for i in range(n):
            addr = f"{g.name}/{io}/{i}"
            ds = stored.get(i)
            if ds is None:
                out.append(ExtractedTensor(self, addr, "", (), has_data=False))
                continue
            self._check_dataset(ds)
            dtype = _text(ds.attrs.get("dtype", "")) or _torch_name(ds.dtype)
            out.append(ExtractedTensor(self, addr, dtype, tuple(ds.shape)))
        return out

    def _check_dataset(self, ds: h5py.Dataset) -> None:
        """Only what `extract` writes: plain storage, in this file, no filters, all allocated."""
        dcpl = ds.id.get_create_plist()
        if ds.is_virtual or dcpl.get_external_count() or dcpl.get_nfilters():
            raise DumpError(f"{self.path}: {ds.name} uses virtual, external or filtered "
                            "storage, which extract files never do")
        if ds.dtype.kind not in "biufc" or ds.id.get_storage_size() != ds.nbytes:
            raise DumpError(f"{self.path}: {ds.name} is not a plain numeric dataset stored "
                            "in full")

    def record(self, seq: int) -> ExtractedOp:
        try:
            return self._ops[seq]
        except KeyError:
            raise KeyError(f"{self.path}: no op with sequence number {seq}") from None

    @property
    def records(self) -> list[ExtractedOp]:
        return [self._ops[s] for s in sorted(self._ops)]

    def read(self, t: ExtractedTensor) -> torch.Tensor:
        if not t.has_data:
            raise DumpError(f"{self.path}: {t.address} was not stored")
        try:
            arr = self._f[t.address][()]
            dtype = schema.torch_dtype(t.dtype)
        except (OSError, RuntimeError, KeyError, ValueError, TypeError) as e:
            raise DumpError(f"{self.path}: cannot read {t.address} ({type(e).__name__}: {e})"
                            ) from None
        value = torch.from_numpy(np.ascontiguousarray(arr))
        if value.dtype != dtype:  # raw bits of a dtype HDF5 lacks (bfloat16, float8)
            if value.element_size() != dtype.itemsize:
                raise DumpError(f"{self.path}: {t.address} holds {value.dtype} data, which "
                                f"cannot be {dtype}")
            value = value.view(dtype)
        return value.reshape(t.shape)

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> ExtractedOps:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _torch_name(dt: np.dtype) -> str:
    return schema.dtype_name(torch.from_numpy(np.zeros(0, dtype=dt)).dtype)


def is_extract_file(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is an HDF5 file that is not an accuracy dump (an extract, or h5copy
    output made from one, which carries no file attributes)."""
    try:
        require_regular_file(path)
        with h5py.File(path, "r") as f:
            fmt = _text(f.attrs.get("format", ""))
    except (OSError, DumpError):
        return False
    return fmt != schema.FORMAT_NAME

