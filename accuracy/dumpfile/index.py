"""The index tables of an open dump turned into records: one `TensorRecord` per tensor row,
one `OpRecord` per op row, and a replay's rows held by the replayed dump pointed at it."""

from __future__ import annotations

from typing import Any

import numpy as np

from accuracy.dumpfile import schema, validate
from accuracy.dumpfile.checksum import NO_HASH
from accuracy.dumpfile.records import OpRecord, TensorRecord, TensorSource


def text(col: np.ndarray) -> list[str]:
    """A column of stored strings as text (bytes decoded, damaged UTF-8 replaced)."""
    return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in col]


def tensor_records(dump: TensorSource, t: np.ndarray, op_names: dict[int, str],
                   attrs: dict[str, Any]) -> list[TensorRecord]:
    """Every row of the tensor table `t`, in file order, as records of `dump`."""
    if len(t) == 0:
        return []
    dtypes, devices = text(t["dtype"]), text(t["device"])
    ndims = t["ndim"].tolist()
    shapes, strides = t["shape"].tolist(), t["stride"].tolist()
    # sums are omitted only beside a content hash: an older file claiming otherwise (its
    # attributes carry no hash of their own) must not turn its only byte check off
    sums = attrs.get(schema.SUMS_ATTR) != schema.SUMS_OMITTED \
        or "hash" not in (t.dtype.names or ())
    stats_cols = {k: t[k].tolist() for k in schema.STAT_FIELDS if k != "checksum" or sums}
    hashes = (t["hash"].tolist() if "hash" in (t.dtype.names or ())
              else [NO_HASH] * len(t))
    layouts = _layouts(t, ndims, shapes)
    out = []
    for i, (seq, io, idx, off, nb, first) in enumerate(
        zip(t["seq"].tolist(), t["io"].tolist(), t["idx"].tolist(), t["offset"].tolist(),
            t["nbytes"].tolist(), t["first"].tolist(), strict=True)
    ):
        out.append(TensorRecord(
            dump=dump, row=i, op=op_names.get(seq, "?"), seq=seq, io=io, idx=idx,
            dtype=dtypes[i], shape=tuple(shapes[i][:max(ndims[i], 0)]),
            stride=tuple(strides[i][:max(ndims[i], 0)]), device=devices[i],
            offset=off if ndims[i] >= 0 else -1,
            nbytes=nb, first=first, stats={k: v[i] for k, v in stats_cols.items()},
            content_hash=hashes[i] if ndims[i] >= 0 else NO_HASH,
            layout=layouts[i],
        ))
    return out


def _layouts(t: np.ndarray, ndims: list[int], shapes: list[list[int]]
             ) -> list[tuple[tuple[int, ...], tuple[int, ...]] | None]:
    """Schema 6: each row's (shape, strides) to read its elements through, or None (row-major).
    A strided link reads its first row's elements (checked on open: an earlier strided row
    with the same bytes), in that row's shape."""
    if "strided" not in (t.dtype.names or ()):
        return [None] * len(t)
    out: list[tuple[tuple[int, ...], tuple[int, ...]] | None] = [None] * len(t)
    rows = np.flatnonzero(t["strided"] == 1).tolist()
    if not rows:
        return out
    firsts, lay = t["first"].tolist(), t["layout"].tolist()
    for i in rows:
        if ndims[i] < 0:
            continue
        f = firsts[i]
        if f == i:
            out[i] = (tuple(shapes[i][:ndims[i]]), tuple(lay[i][:ndims[i]]))
        else:
            out[i] = out[f]
    return out


def resolve_in_source(rows: list[TensorRecord], src: Any) -> str:
    """Point each row whose bytes are the replayed dump's (`schema.IN_SOURCE`) at them, in
    place: the row there at the same address, holding its own bytes with the same dtype, size
    and content hash (so reading it checks the bytes against this file's hash too). `src`:
    the replayed dump, opened (a `reader.Dump`). Rows that cannot be pointed stay without
    data; returns why, or ""."""
    held = [i for i, t in enumerate(rows) if t.offset == schema.IN_SOURCE]
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
            nbytes=s.nbytes, first=t.row, stats=t.stats, content_hash=t.content_hash,
            layout=s.layout)
    if wrong:
        return (f"{wrong} of the {len(held)} rows held by the replayed dump {src.path} do not "
                "match it (another dump of that name?)")
    return ""


def _extra(seq: int, text: str) -> dict[str, Any]:
    if not text:
        return {}
    value = validate.parse_json(text, f"op {seq}: extra")
    if not isinstance(value, dict):
        raise validate.LayoutError(f"op {seq}: extra is not a JSON object")
    return value


def op_records(o: np.ndarray, cols: dict[str, list[str]], tensors: list[TensorRecord]
               ) -> list[OpRecord]:
    """Every row of the op table `o` (its text columns `cols`), in execution order, with its
    input and output records from `tensors`."""
    by_seq: dict[int, tuple[list[TensorRecord], list[TensorRecord]]] = {
        s: ([], []) for s in o["seq"].tolist()
    }
    for t in tensors:
        if t.seq in by_seq:
            by_seq[t.seq][t.io].append(t)
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
            step=step, extra=_extra(seq, extra),
            inputs=sorted(ins, key=lambda r: r.idx), outputs=sorted(outs, key=lambda r: r.idx),
            epoch=epochs[i],
        ))
    return out
