"""An op's text (name, phase, module, source, stack, call arguments, notes) as stored bytes.

Up to schema 3 the op table held these in HDF5 variable-length strings, which live in HDF5's
global heap. HDF5 grows a heap collection in place, and SWMR does not order that write: a
process killed while a collection grew left the collection's new size on disk but not the new
end of the file in the superblock, so HDF5 refused to read the collection ("actual len exceeds
EOA") and every op whose text lay in it was lost, committed or not. Since schema 4 an op row is
numbers only and names the range of the blob that holds its text: one JSON array of strings,
written like tensor bytes, before the row that points at it, and covered by the batch hash.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from accuracy.dumpfile import schema
from accuracy.dumpfile.validate import LayoutError, parse_json

_N_FIELDS = len(schema.OP_TEXT_FIELDS)


def encode(values: Sequence[str]) -> bytes:
    """The stored form of one op's text fields, in `schema.OP_TEXT_FIELDS` order."""
    return json.dumps(list(values)).encode("ascii")  # ASCII: any str, lone surrogates too


def decode(raw: bytes, what: str) -> list[str]:
    """The text fields of one op from their stored bytes; LayoutError when they are not ours."""
    try:
        value = parse_json(raw.decode("utf-8"), what)
    except UnicodeDecodeError:
        raise LayoutError(f"{what}: text is not UTF-8") from None
    if type(value) is not list or len(value) != _N_FIELDS or not all(
            type(v) is str for v in value):
        raise LayoutError(f"{what}: text is not {_N_FIELDS} strings")
    return value


def _ours(value: object, n: int) -> bool:
    return type(value) is list and len(value) == n and all(
        type(f) is list and len(f) == _N_FIELDS and all(type(v) is str for v in f)
        for f in value)


def columns(texts: list[bytes]) -> dict[str, list[str]]:
    """The ops' text fields by name (`schema.OP_TEXT_FIELDS`), a list per field.

    All texts are parsed at once, as one JSON array (a quarter of the time of one parse per
    op); where that is not `len(texts)` arrays of strings, each is parsed alone, which names
    the op row at fault.
    """
    try:
        fields = json.loads(b"[" + b",".join(texts) + b"]")
    except (ValueError, RecursionError):
        fields = None
    if not _ours(fields, len(texts)):
        fields = [decode(t, f"op row {i}") for i, t in enumerate(texts)]
    cols = list(zip(*fields, strict=True)) if fields else [()] * _N_FIELDS
    return {name: list(col) for name, col in zip(schema.OP_TEXT_FIELDS, cols, strict=True)}


def text_runs(offsets: np.ndarray, nbytes: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Split op rows into runs whose texts lie back to back: (first row, end row, blob offset,
    bytes), so that a reader reads each run at once (the writer stores a flush's texts
    together)."""
    if len(offsets) == 0:
        return []
    ends = offsets + nbytes
    starts = np.flatnonzero(np.r_[True, offsets[1:] != ends[:-1]]).tolist()
    bounds = [*starts, len(offsets)]
    return [(a, b, int(offsets[a]), int(ends[b - 1] - offsets[a]))
            for a, b in zip(bounds, bounds[1:], strict=False)]
