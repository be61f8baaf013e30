"""Stored bytes against the checks the dump recorded for them: the XXH3-64 content hash
(schema 3) or the older sum. A mismatch is a `DamagedDataError` naming the tensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from accuracy.dumpfile import dtypes, schema
from accuracy.dumpfile.checksum import (
    CONTENT_HASH_KIND,
    NO_HASH,
    SUM_KIND,
    Checksum,
    ContentHash,
    content_hash,
    running_check,
)
from accuracy.dumpfile.errors import DamagedDataError, DumpError
from accuracy.dumpfile.records import TensorRecord

PIECE = 64 << 20  # bytes read at a time by `verify`


def checksum_kind(tensor_table: np.ndarray) -> str:
    """What a dump's stored bytes are checked against: the content hash (schema 3, a `hash`
    column in the tensor table) or the sum."""
    return CONTENT_HASH_KIND if "hash" in (tensor_table.dtype.names or ()) else SUM_KIND


def new_check(t: TensorRecord) -> tuple[Checksum | ContentHash, int] | None:
    """(running check, value it must reach) for `t`'s bytes read in order, or None when
    nothing was stored to check against. ValueError for an unknown dtype."""
    return running_check(t.stats, t.dtype, dtypes.itemsize(t.dtype), t.content_hash)


def check_checksum(path: Path, kind: str, what: str, computed: int, stored: float | int
                   ) -> None:
    """DamagedDataError when `computed` is not the `stored` check of `what` in `path`."""
    if computed != int(stored):
        raise DamagedDataError(
            f"{path}: {what}: data damaged ({kind} {computed} does not match the stored "
            f"{int(stored)}); the file was altered or corrupted after it was written")


def check_bytes(path: Path, kind: str, t: TensorRecord, raw: np.ndarray) -> None:
    """DamagedDataError when `raw` (all of `t`'s bytes) does not match the stored check."""
    if t.content_hash != NO_HASH:  # all the bytes at hand: one call, not a running state
        check_checksum(path, kind, t.address, content_hash(raw), t.content_hash)
        return
    c = new_check(t)
    if c is None:
        return
    c[0].update(raw)
    check_checksum(path, kind, t.address, c[0].value, c[1])


def verify(path: Path, tensors: list[TensorRecord], source_problem: str) -> list[str]:
    """Every stored tensor's bytes against its check; one line per problem found.

    Reads each stored byte range once (links share it), in pieces of bounded size, from the
    dump holding them (this file, or the replayed dump holding a replay's row).
    """
    problems: list[str] = []
    seen: set[tuple] = set()
    held = [t for t in tensors if t.offset == schema.IN_SOURCE]
    if held:
        problems.append(f"{path}: {len(held)} reference outputs cannot be read: "
                        f"{source_problem}")
    for t in tensors:
        if not t.has_data:
            continue
        try:
            check = new_check(t)
        except ValueError as e:
            problems.append(f"{path}: {t.address}: {e}")
            continue
        if check is None:
            continue
        c, stored = check
        key = (id(t.dump), t.offset, t.nbytes, dtypes.itemsize(t.dtype), stored,
               t.byte_layout)
        if key in seen:
            continue
        seen.add(key)
        d = t.dump  # this file, or the replayed dump holding a replay's row
        try:
            step = PIECE - PIECE % 16  # whole parts of any element size
            if t.byte_layout is not None:  # a view of stored bytes: in row-major order
                ref, size = t.ref(), dtypes.itemsize(t.ref().value_dtype)
                for a in range(0, t.nbytes // size, step // size):
                    c.update(d.read_range(ref, a, a + step // size))
            else:
                for a in range(0, t.nbytes, step):
                    c.update(d.read_bytes(t.offset + a, min(step, t.nbytes - a), t.address))
            d.check_checksum(t.address, c.value, stored)
        except DumpError as e:
            problems.append(str(e))
    return problems
