"""What a file must be before a reader believes its index: a regular file, HDF5, an accuracy
dump of a schema this version reads, with sound root attributes and index hashes.

Each check raises a `DumpError` (or `validate.LayoutError`, which the reader words) naming the
file and the problem; `reader.Dump` runs them in order on every open.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from accuracy.dumpfile import schema, validate
from accuracy.dumpfile.checksum import ATTRS_HASH, attrs_hash, rows_hash
from accuracy.dumpfile.errors import DamagedDataError, DumpError

STATUS = "_status"  # the committed row counts


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


def open_h5(path: Path) -> tuple[h5py.File, bool]:
    """Open read-only; a file left open by a killed writer is opened through SWMR. Returns
    (file, closed cleanly).

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


def _extract_file(f: h5py.File, path: Path, fmt: Any) -> DumpError | None:
    """An `accuracy extract` file (or groups h5copy'd out of one: `/aten.*` at the root)
    is not a dump: say what it is and what reads it."""
    if fmt != schema.EXTRACT_FORMAT_NAME and not (
            fmt is None and any(k.startswith("aten.") for k in list(f.keys())[:64])):
        return None
    src = f.attrs.get("source_dump")
    src = src.decode() if isinstance(src, bytes) else src
    came = f" (from {src})" if isinstance(src, str) and len(src) < 500 else ""
    return DumpError(
        f"{path}: ops written by `accuracy extract`{came} as plain HDF5 groups, not a "
        "dump: browse it with `h5ls -r`, load it with dumper(load_file_path=...), or run "
        "this command on the dump it came from")


def check_format(f: h5py.File, path: Path) -> int:
    """The dump's schema version, once the file is known to be an accuracy dump this version
    reads, with its four tables."""
    if "format" not in f.attrs or f.attrs.get_id("format").get_storage_size(
            ) > validate.MAX_ATTR_BYTES:
        if (err := _extract_file(f, path, None)) is not None:
            raise err
        raise DumpError(f"{path}: HDF5 file but not an accuracy dump (no format "
                        "attribute); was it written by another program?")
    fmt = f.attrs.get("format")
    if isinstance(fmt, bytes):
        fmt = fmt.decode()
    if (err := _extract_file(f, path, fmt)) is not None:
        raise err
    if fmt != schema.FORMAT_NAME:
        raise DumpError(
            f"{path}: HDF5 file but not an accuracy dump (format attribute is "
            f"{fmt!r}); was it written by another program?"
        )
    try:
        version = int(f.attrs.get("schema_version", -1))
    except (TypeError, ValueError):
        version = -1
    if version > schema.NEWEST_READABLE:
        raise DumpError(
            f"{path}: written with dump schema {version}, newer than this accuracy "
            f"reads ({schema.NEWEST_READABLE}); upgrade accuracy"
        )
    if version < schema.OLDEST_READABLE:
        raise DumpError(f"{path}: invalid schema_version {version}")
    for name in (schema.BLOB, schema.OPS, schema.TENSORS, STATUS):
        if name not in f:
            raise DumpError(f"{path}: damaged dump, missing {name!r}")
    return version


def read_attrs(f: h5py.File) -> dict[str, Any]:
    """The root attributes as Python values: JSON text parsed (bounded), paths checked."""
    out: dict[str, Any] = {}
    for k, v in f.attrs.items():
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


def check_metadata_hashes(f: h5py.File, path: Path, ops: np.ndarray, tensors: np.ndarray,
                          texts: list[bytes] | None, *, live: bool, complete: bool) -> None:
    """Schema 3: each flushed batch of index rows (schema 4: and the ops' stored text) and
    the root attributes against their hashes (a flipped byte in a source path or a min/max
    is refused on open, like damaged bytes). Older files have neither and are read as
    before. `live`: the file is still being written (its batch table is refreshed first)."""
    n_ops, n_tensors = len(ops), len(tensors)
    if schema.BATCHES in f:
        batches = validate.open_dataset(f, schema.BATCHES)
        if live:
            batches.refresh()
        if batches.dtype != schema.BATCH_ROW or batches.ndim != 1:
            raise DumpError(f"{path}: damaged dump (unknown batch-hash table)")
        o = t = 0
        for oe, te, h in batches[:].tolist():
            if oe > n_ops or te > n_tensors or (oe, te, h) == (0, 0, 0):
                break  # a flush the status counts never made visible, or lost (disk full)
            if oe < o or te < t or rows_hash(ops[o:oe], tensors[t:te],
                                             texts[o:oe] if texts else ()) != h:
                raise DamagedDataError(
                    f"{path}: index rows {o}-{oe} (ops) / {t}-{te} (tensors) damaged: "
                    "their hash does not match; the file was altered or corrupted")
            o, t = oe, te
        if (o, t) != (n_ops, n_tensors) and complete:
            raise DamagedDataError(f"{path}: index rows past op {o} are not covered "
                                   "by a batch hash; the file was altered or corrupted")
    stored = f.attrs.get(ATTRS_HASH)
    if stored is not None and int(stored) != attrs_hash(dict(f.attrs.items())):
        raise DamagedDataError(f"{path}: root attributes damaged (their hash does not "
                               "match); the file was altered or corrupted")
