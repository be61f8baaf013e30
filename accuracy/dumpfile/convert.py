"""`accuracy convert`: each tensor of a dump as one `.npy` file, like `msaccucmp.py convert`.

Files are named by the tensor's address (`/aten.add.Tensor/17/input/0` ->
`aten.add.Tensor.17.input.0.npy`), made safe: the op name comes from an untrusted file, so
anything but letters, digits, `.`, `_`, `-` becomes `_`, and a name never leaves the output
folder (no separators, never opened through a symlink). numpy has no bfloat16 or float8:
those are written as float32 (exact), and `index.json` keeps each file's address and original
dtype, shape and statistics.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from accuracy.dumpfile.reader import Dump, load_dump
from accuracy.errors import NoMatchError, OutputExistsError, OutputNotWritableError
from accuracy.outputs import writable_folder

INDEX = "index.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_MAX_NAME = 200
# torch dtypes numpy lacks, and what they are written as (exactly representable)
_WIDEN = {torch.bfloat16: torch.float32, torch.complex32: torch.complex64,
          torch.uint16: torch.int32, torch.uint32: torch.int64}


@dataclass
class ConvertResult:
    written: int
    skipped: int  # tensors with statistics only
    index: Path

    def format(self) -> str:
        return (f"wrote {self.written} .npy files to {self.index.parent} (index: {self.index})"
                + (f"; {self.skipped} tensors have statistics only (no values to write)"
                   if self.skipped else ""))


def npy_name(address: str) -> str:
    """A safe file name for an address: one path component, no leading dot, bounded length."""
    name = _UNSAFE.sub("_", address.strip("/").replace("/", "."))
    if len(name) > _MAX_NAME:  # keep it unique: the tail (seq, io, idx) plus a hash
        digest = hashlib.sha1(address.encode()).hexdigest()[:12]
        name = f"{name[: _MAX_NAME - 60]}~{digest}~{name[-40:]}"
    if name.startswith("."):
        name = "_" + name[1:]
    return name + ".npy"


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """The tensor as numpy; dtypes numpy lacks widened exactly (float8, bfloat16 -> float32)."""
    target = _WIDEN.get(t.dtype)
    if target is None and t.dtype.is_floating_point and t.element_size() == 1:
        target = torch.float32  # the float8 family
    return (t.to(target) if target is not None else t).numpy()


def _json_number(v: float) -> float | str:
    """Strict JSON has no NaN or inf: those become the strings 'nan', 'inf', '-inf'."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _prepare(out_dir: Path, overwrite: bool) -> Path:
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputExistsError(f"{out_dir} is a file; -o names the folder for the .npy files")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise OutputExistsError(f"{out_dir} is not empty; pass --overwrite to write into it "
                              "(files of the same names are replaced) or choose another -o")
    return writable_folder(out_dir, "-o").resolve()


def _save(folder: Path, name: str, arr: np.ndarray) -> None:
    """Write `folder/name`, refusing a symlink planted at that name."""
    if os.sep in name or name in (".", ".."):
        raise ValueError(f"unsafe file name {name!r}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(folder / name, flags, 0o644)
    except OSError as e:
        raise OutputNotWritableError(f"{folder / name}: cannot write {name} ({e.strerror}); "
                                     "is it a symlink?") from None
    with os.fdopen(fd, "wb") as f:
        np.save(f, arr, allow_pickle=False)


def convert(
    dump: Dump,
    out_dir: str | os.PathLike[str],
    *,
    op: str | None = None,
    seq: int | None = None,
    module: str | None = None,
    overwrite: bool = False,
) -> ConvertResult:
    """Write the matching ops' tensors as `.npy` files plus `index.json` into `out_dir`."""
    dump.require_op(op)
    records = list(dump.select(op=op, module=module, seq=seq))
    if not records:
        raise NoMatchError(f"no op in {dump.path} matches op={op!r} seq={seq} module={module!r}")
    folder = _prepare(Path(out_dir), overwrite)
    index: dict[str, dict] = {}
    written = skipped = 0
    for rec in records:
        for t in rec.tensors:
            if not t.has_data:
                skipped += 1
                continue
            arr = as_numpy(t.load())
            name = npy_name(t.address)
            _save(folder, name, arr)
            index[t.address] = {"file": name, "dtype": t.dtype, "npy_dtype": str(arr.dtype),
                                "shape": list(t.shape), "phase": rec.phase,
                                "module": rec.module,
                                "stats": {k: _json_number(v) for k, v in t.stats.items()}}
            written += 1
    index_path = folder / INDEX
    if index_path.is_symlink():
        raise OutputNotWritableError(f"{index_path} is a symlink; refusing to write through it")
    index_path.write_text(json.dumps({"source_dump": str(dump.path), "tensors": index},
                                     indent=1, default=str))
    return ConvertResult(written, skipped, index_path)


def convert_file(dump_path: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                 **select: Any) -> ConvertResult:
    """`convert` from the dump at `dump_path` (`op`, `seq`, `module`, `overwrite` as there)."""
    with load_dump(dump_path) as d:
        return convert(d, out_dir, **select)


@dataclass
class FolderConvertResult:
    """`convert_folder`: one result per converted dump, and the files that were passed over."""

    results: dict[str, ConvertResult]
    passed_over: dict[str, str]  # file name -> why (not a dump, no matching op)

    def format(self) -> str:
        lines = [f"{name}: {r.format()}" for name, r in self.results.items()]
        lines += [f"{name}: skipped ({why})" for name, why in self.passed_over.items()]
        return "\n".join(lines)


def convert_folder(dump_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str],
                   **select: Any) -> FolderConvertResult:
    """`convert` every dump (`*.h5`, `*.hdf5`) in `dump_dir`, each into `out_dir/<its stem>/`
    (msaccucmp's `convert -d DIR`). Files that are not accuracy dumps, or hold no matching op,
    are passed over and named; none converted at all is a NoMatchError."""
    from accuracy.dumpfile.errors import DumpError

    src = Path(dump_dir)
    files = sorted(p for p in src.iterdir() if p.suffix in (".h5", ".hdf5") and p.is_file())
    if not files:
        raise NoMatchError(f"{src}: no .h5 dump files in this folder")
    out = Path(out_dir)
    results: dict[str, ConvertResult] = {}
    passed: dict[str, str] = {}
    for f in files:
        try:
            with load_dump(f) as d:
                results[f.name] = convert(d, out / npy_name(f.stem).removesuffix(".npy"),
                                          **select)
        except NoMatchError:
            passed[f.name] = "no op matches the selection"
        except DumpError as e:
            passed[f.name] = str(e).removeprefix(f"{f}: ")
    if not results:
        raise NoMatchError(f"{src}: no dump converted ("
                           + "; ".join(f"{k}: {v}" for k, v in passed.items()) + ")")
    return FolderConvertResult(results, passed)
