"""The on-disk layout of a dump: names, table row types and dtype encoding.

One writer and one reader share these definitions, so the format lives in exactly one place.
See docs/dump-format.md for the prose description.
"""

from __future__ import annotations

import h5py
import numpy as np

# Dtype by name lives in dtypes.py (numpy decoding, torch only on request); kept here for callers.
from accuracy.dumpfile.dtypes import dtype_name, torch_dtype  # noqa: F401

FORMAT_NAME = "accuracy-dump"
EXTRACT_FORMAT_NAME = "accuracy-extract"  # `accuracy extract` output: plain HDF5 groups
# 2: op rows gained `epoch`; version-1 files read with epoch unknown.
# 3: tensor rows gained `hash` (XXH3-64 of the stored bytes); older files are checked by sum.
# 4: op rows are fixed-size; their text lies in the blob (see optext.py): no HDF5 heap.
# 5: a replay's output row may hold no bytes of its own but the replayed dump's (`IN_SOURCE`);
#    written only by replays that have such rows, every other file stays schema 4.
SCHEMA_VERSION = 4
SOURCE_ROWS_SCHEMA = 5
NEWEST_READABLE = SOURCE_ROWS_SCHEMA
OLDEST_READABLE = 1
# Tensor row offset of a replay output proven bit-identical to the device output it replays:
# its bytes are those the replayed dump (root attribute `replayed_from`, found beside the
# replay) stores at the same address, with the same content hash (see docs/dump-format.md).
IN_SOURCE = -2
# Root attributes that name a file, which some reader opens or stats (`replayed_from`: beside
# the replay; `load_file_path`: shown): checked as path text on open, like any file's data.
PATH_ATTRS = ("replayed_from", "load_file_path")
UNKNOWN_EPOCH = -1  # an op row of a version-1 dump, or one written outside a dumper
# The two-tier flow's selection file (written by `accuracy suspects`, read by dumper(select=))
SELECTION_FORMAT = "accuracy-selection/1"

BLOB = "_data/blob"  # every tensor's bytes, appended (log-structured)
OPS = "_index/ops"  # one row per recorded op
TENSORS = "_index/tensors"  # one row per tensor use (input or output of an op)
BATCHES = "_index/batches"  # schema 3: one row per flush: the rows it made visible, their hash
BATCH_ROW = np.dtype([("ops_end", np.int64), ("tensors_end", np.int64), ("hash", np.uint64)])

INPUT, OUTPUT = 0, 1
IO_NAMES = ("input", "output")

_str = h5py.string_dtype("utf-8")

# The op row since schema 4: numbers only. Its text (op, phase, module, source, stack, call
# arguments, extra: `OP_TEXT_FIELDS`) is one JSON array in the blob at [text, text + text_nbytes).
OP_ROW = np.dtype(
    [
        ("seq", np.int64),
        ("step", np.int32),
        ("n_in", np.int32),
        ("n_out", np.int32),
        ("epoch", np.int32),  # collectives this rank issued before the op (-1 unknown)
        ("text", np.int64),  # blob offset of the op's text
        ("text_nbytes", np.int64),
    ]
)
OP_TEXT_FIELDS = ("op", "phase", "module", "source", "stack", "args", "extra")

# The op row of schema 2-3 files, text in HDF5 variable-length strings; still readable, and the
# shape the reader gives every file's op table once the text is read.
OP_ROW_V3 = np.dtype(
    [
        ("seq", np.int64),
        ("op", _str),
        ("phase", _str),
        ("module", _str),
        ("source", _str),
        ("stack", _str),
        ("args", _str),  # JSON: {"args": [...], "kwargs": {...}} with tensor placeholders
        ("step", np.int32),
        ("n_in", np.int32),
        ("n_out", np.int32),
        ("extra", _str),  # JSON: per-op notes (mutated inputs, injected faults, replay hints)
        ("epoch", np.int32),  # collectives this rank issued before the op (schema 2; -1 unknown)
    ]
)

# The op row of schema-1 files (written before the collective epoch existed): still readable.
OP_ROW_V1 = np.dtype([(n, OP_ROW_V3.fields[n][0]) for n in OP_ROW_V3.names if n != "epoch"])
OP_ROWS = (OP_ROW, OP_ROW_V3, OP_ROW_V1)

MAX_DIMS = 16  # shape and stride are fixed-size: no variable-length strings per tensor row

TENSOR_ROW = np.dtype(
    [
        ("seq", np.int64),
        ("io", np.uint8),
        ("idx", np.int32),
        ("dtype", "S24"),
        ("ndim", np.int8),  # -1: more than MAX_DIMS dims (shape not recorded, no data)
        ("shape", np.int64, (MAX_DIMS,)),
        ("stride", np.int64, (MAX_DIMS,)),
        ("device", "S24"),
        ("offset", np.int64),  # byte offset into BLOB, -1 when the bytes were not stored
        ("nbytes", np.int64),
        ("first", np.int64),  # row holding the bytes: itself, or an earlier row (deduplicated)
        ("min", np.float64),
        ("max", np.float64),
        ("mean", np.float64),
        ("l2", np.float64),
        ("nan_count", np.int64),
        ("inf_count", np.int64),
        ("checksum", np.int64),
        ("hash", np.uint64),  # XXH3-64 of the stored bytes (schema 3); 0: none stored
    ]
)
# The tensor row of schema 1-2 files (no content hash): still readable, checked by the sum.
TENSOR_ROW_V2 = np.dtype([(n, TENSOR_ROW.fields[n][0]) for n in TENSOR_ROW.names if n != "hash"])
TENSOR_ROWS = (TENSOR_ROW, TENSOR_ROW_V2)

STAT_FIELDS = ("min", "max", "mean", "l2", "nan_count", "inf_count", "checksum")
# Root attribute of a dump whose statistics hold no bit-pattern sum ("omitted"): the dumper's
# tensor dumps, whose stored bytes carry a content hash (the "checksum" column is 0 there and
# the reader leaves it out of each row's statistics).
SUMS_ATTR = "stat_sums"
SUMS_OMITTED = "omitted"


def address(op: str, seq: int, io: int, idx: int) -> str:
    """The Ascend-style address of a tensor: /{op}/{seq}/input/{i}."""
    return f"/{op}/{seq}/{IO_NAMES[io]}/{idx}"


def parse_address(addr: str) -> tuple[str, int, int, int]:
    """Split '/aten.add.Tensor/17/output/0' into (op, seq, io, idx)."""
    parts = addr.strip("/").split("/")
    if len(parts) != 4 or parts[2] not in IO_NAMES:
        raise ValueError(
            f"bad tensor address {addr!r}: expected /<op>/<seq>/input|output/<index>"
        )
    try:
        return parts[0], int(parts[1]), IO_NAMES.index(parts[2]), int(parts[3])
    except ValueError:
        raise ValueError(f"bad tensor address {addr!r}: seq and index must be integers") from None
