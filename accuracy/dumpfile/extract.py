"""Write selected ops of a dump as real HDF5 groups, the layout Ascend's guide describes.

The result is a plain HDF5 file where `/aten.add.Tensor/17/input/0` is a dataset, so
`h5copy -s "/aten.add.Tensor/17/" ...` and any HDF5 viewer work on it. Repeated uses of the
same tensor become hard links. bfloat16 and float8 are stored as raw bits with a `dtype`
attribute, since HDF5 has no such types.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import torch

from accuracy.dumpfile.reader import Dump
from accuracy.dumpfile.writer import check_dump_path

_RAW_BITS = {2: torch.int16, 1: torch.uint8}
_NUMPY_OK = {torch.float64, torch.float32, torch.float16, torch.int64, torch.int32, torch.int16,
             torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128}


def _as_numpy(t: torch.Tensor):
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
    """Copy the matching ops into `out_path`; returns how many ops were written."""
    out = check_dump_path(out_path, overwrite)
    records = list(dump.select(op=op, module=module, seq=seq))
    if not records:
        raise LookupError(f"no op in {dump.path} matches op={op!r} seq={seq} module={module!r}")
    written: dict[int, str] = {}  # first row -> dataset path, for hard links
    with h5py.File(Path(out), "w") as f:
        f.attrs.update({"source_dump": str(dump.path), "format": "accuracy-extract"})
        for rec in records:
            g = f.create_group(f"{rec.op}/{rec.seq}")
            g.attrs.update({"phase": rec.phase, "module": rec.module, "source": rec.source,
                            "args": rec.args_json})
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
    return len(records)
