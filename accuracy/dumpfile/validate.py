"""The dump layout the reader accepts, checked on every open: a dump file is untrusted input.

HDF5 can make a file read bytes from elsewhere (external raw storage, external links, virtual
datasets), inflate a few KB into GBs (compression filters on an all-fill dataset) or hold index
values that no writer of ours produces. `check_layout` refuses all of that before any data is
read, from metadata and the two index tables only (vectorised numpy, never the blob), so it
costs milliseconds on a dump of any size. Each refusal is a `LayoutError` with the reason; the
reader turns it into a `DumpError` naming the file. The rules are listed in docs/dump-format.md.
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np

from accuracy import jsonsafe
from accuracy.dumpfile import dtypes, layout, schema
from accuracy.errors import AccuracyError

STATUS = "_status"

# What our writer makes, and nothing else: group -> {member: "group" | "dataset"}.
LAYOUT: dict[str, dict[str, str]] = {
    "/": {"_data": "group", "_index": "group", STATUS: "dataset"},
    "/_data": {"blob": "dataset"},
    "/_index": {"ops": "dataset", "tensors": "dataset"},
}
# Objects a dump may hold (schema 3 adds them; older files lack them), checked like the rest.
OPTIONAL: dict[str, dict[str, str]] = {"/_index": {"batches": "dataset"}}
_LAYOUTS_OK = {h5py.h5d.COMPACT, h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED}

MAX_ATTRS = 256  # attributes on one object
MAX_ATTR_BYTES = 4 << 20  # one attribute's stored size, and a string attribute's length
MAX_JSON_DEPTH = 64  # nesting of any JSON text in a dump (ours is at most ~6 deep)
MAX_JSON_CHARS = 64 << 20
MAX_CHUNK_BYTES = 64 << 20  # one chunk of any dataset (the writer uses 1 MiB)
MAX_ROWS = 1 << 40
MAX_NUMEL = 1 << 53  # elements of one tensor: more than any device holds
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux: a longer name is no file's


class LayoutError(AccuracyError, ValueError):
    """The file is HDF5 but not laid out as our writer lays out a dump."""


class NestingError(LayoutError):
    """JSON text nested deeper than any writer of ours nests it (not merely invalid text)."""


# -- JSON ------------------------------------------------------------------------------------

def parse_json(text: str, what: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads` that refuses text nested deeper than `max_depth` (NestingError) or longer
    than MAX_JSON_CHARS (LayoutError), naming `what` (jsonsafe.loads_bounded)."""
    try:
        return jsonsafe.loads_bounded(text, what, max_depth, MAX_JSON_CHARS)
    except jsonsafe.NestingError as e:
        raise NestingError(str(e)) from None
    except ValueError as e:
        raise LayoutError(str(e)) from None


def check_json_column(texts: list[str], what: str) -> None:
    """Refuse over-deep JSON in a column of texts parsed later (op call arguments)."""
    for i, text in enumerate(texts):
        if text.count("[") + text.count("{") > MAX_JSON_DEPTH or len(text) > MAX_JSON_CHARS:
            parse_json(text, f"{what} of op row {i}")


def check_path_text(value: Any, what: str) -> str:
    """A value read from a file that some code uses as a file name: text a path can hold
    (no NUL byte, which every OS call refuses with a ValueError, and no longer than a path
    can be). Returns it; raises LayoutError naming `what`."""
    if not isinstance(value, str) or not value:
        raise LayoutError(f"{what} is not a file name ({type(value).__name__})")
    if "\x00" in value or len(value) > MAX_PATH_CHARS:
        why = "holds a NUL byte" if "\x00" in value else f"is {len(value)} characters long"
        raise LayoutError(f"{what} is not a file name (it {why}); the file was altered or "
                          "damaged")
    return value


# -- structure -------------------------------------------------------------------------------

def check_attrs(obj: h5py.Group | h5py.Dataset, where: str) -> None:
    """At most MAX_ATTRS attributes, each a plain scalar of bounded size (read from metadata:
    no attribute's value is read)."""
    names = list(obj.attrs)
    if len(names) > MAX_ATTRS:
        raise LayoutError(f"{where} has {len(names)} attributes (limit {MAX_ATTRS})")
    for name in names:
        aid = obj.attrs.get_id(name)
        if aid.get_storage_size() > MAX_ATTR_BYTES:
            raise LayoutError(f"attribute {name!r} of {where} is too large")
        kind = aid.dtype.kind
        if aid.shape != () or kind not in "biufSOU":
            raise LayoutError(f"attribute {name!r} of {where} is not a plain scalar")


def check_storage(ds: h5py.Dataset, where: str) -> None:
    """The dataset's bytes are plain and in this file: no virtual dataset, no external raw
    storage, no filter (a compressed dataset can expand without bound), a known layout. Read
    from its creation properties, before any of its data."""
    dcpl = ds.id.get_create_plist()
    layout = dcpl.get_layout()
    if layout == h5py.h5d.VIRTUAL or ds.is_virtual:
        raise LayoutError(f"{where} is a virtual dataset (data from other files)")
    if dcpl.get_external_count():
        raise LayoutError(f"{where} stores its data in external files")
    if layout not in _LAYOUTS_OK:
        raise LayoutError(f"{where} has an unknown storage layout ({layout})")
    if dcpl.get_nfilters():
        names = []
        for i in range(dcpl.get_nfilters()):
            names.append(dcpl.get_filter(i)[3].decode("ascii", "replace") or "?")
        raise LayoutError(f"{where} uses filters the writer never uses ({', '.join(names)}): "
                          "a compressed dataset can expand without bound")


def check_link(group: h5py.Group, name: str, where: str) -> None:
    """`group[name]` is reached by a hard link: an external link would open another file and
    a soft link another object, on the first access. Read from the link itself, without
    following it."""
    link = group.get(name, getlink=True)
    if isinstance(link, h5py.ExternalLink):
        raise LayoutError(f"{where} is an external link to {link.filename!r}")
    if not isinstance(link, h5py.HardLink):
        raise LayoutError(f"{where} is a {type(link).__name__}, not a plain object")


def _check_dataset(ds: h5py.Dataset, where: str) -> None:
    check_storage(ds, where)
    if ds.ndim != 1:
        raise LayoutError(f"{where} has {ds.ndim} dimensions, expected 1")
    if ds.chunks is not None and ds.chunks[0] * ds.dtype.itemsize > MAX_CHUNK_BYTES:
        raise LayoutError(f"{where} has {ds.chunks[0] * ds.dtype.itemsize}-byte chunks "
                          f"(limit {MAX_CHUNK_BYTES})")
    check_attrs(ds, where)


def _walk(f: h5py.File) -> None:
    """Every object is one of ours, reached by a hard link (soft and external links refused)."""
    for group, members in LAYOUT.items():
        g = f[group]
        check_attrs(g, group)
        names = set(g.keys())
        optional = OPTIONAL.get(group, {})
        unknown = sorted(names - set(members) - set(optional))
        if unknown:
            raise LayoutError(f"unexpected object {group.rstrip('/')}/{unknown[0]} (a dump "
                              "holds only what the writer makes)")
        present = {k: v for k, v in optional.items() if k in names}
        for name, kind in {**members, **present}.items():
            path = f"{group.rstrip('/')}/{name}"
            if name not in names:
                raise LayoutError(f"missing {path.lstrip('/')!r}")
            check_link(g, name, path)
            # by name, without opening it
            otype = h5py.h5o.get_info(g.id, name.encode()).type
            expected = h5py.h5o.TYPE_GROUP if kind == "group" else h5py.h5o.TYPE_DATASET
            if otype != expected:
                raise LayoutError(f"{path} is not a {kind}")
            if kind == "dataset":
                _check_dataset(open_dataset(f, path), path)


def _check_dtypes(f: h5py.File) -> None:
    blob, ops, tensors, status = (open_dataset(f, p) for p in (schema.BLOB, schema.OPS,
                                                                 schema.TENSORS, STATUS))
    if blob.dtype != np.uint8:
        raise LayoutError(f"/{schema.BLOB} has dtype {blob.dtype}, expected uint8")
    if ops.dtype not in schema.OP_ROWS:
        raise LayoutError(f"/{schema.OPS} has an unknown row type")
    if tensors.dtype not in schema.TENSOR_ROWS:
        raise LayoutError(f"/{schema.TENSORS} has an unknown row type")
    if status.dtype != np.int64 or status.shape != (4,):
        raise LayoutError(f"/{STATUS} is not int64[4]")


def _check_storage(blob: h5py.Dataset, blob_len: int, file_size: int) -> None:
    """The committed data is really stored, inside the file, unfiltered.

    Reading unallocated chunks costs no disk but any amount of memory; a chunk outside the
    file is a damaged chunk index (HDF5 would fail mid-read). Only chunks under the committed
    bytes are judged: a running writer allocates chunks past them at any moment, and extends
    the file over them just after (a reader that measured the file a moment before saw them
    "outside the file" about one open in 30).
    """
    if blob.chunks is None:
        off = blob.id.get_offset()
        if blob_len and (off is None or off + blob_len > file_size):
            raise LayoutError(f"/{schema.BLOB}: its {blob_len} bytes are not in the file")
        return
    size = blob.chunks[0]
    need = -(-blob_len // size)  # chunks covering the committed bytes
    have = np.zeros(need, bool)
    bad: list[str] = []

    def note(info: Any) -> None:
        c = info.chunk_offset[0] // size
        if c >= need:
            return  # past the committed bytes: never read
        if info.filter_mask != 0 or info.byte_offset is None or (
                info.byte_offset + info.size > file_size):
            bad.append(f"chunk {c} lies outside the file (damaged chunk index)")
        else:
            have[c] = True

    blob.id.chunk_iter(note)
    if bad:
        raise LayoutError(f"/{schema.BLOB} {bad[0]}")
    if not have.all():
        raise LayoutError(f"/{schema.BLOB}: chunk {int(np.argmin(have))} of the committed "
                          "data was never written")


def check_index(status: np.ndarray, ops: h5py.Dataset, tensors: h5py.Dataset,
                blob: h5py.Dataset, file_size: int) -> tuple[int, int, int]:
    """Validate the committed counts; returns (ops, tensors, blob bytes) to read."""
    n_ops, n_tensors, complete, blob_len = (int(x) for x in status)
    if not 0 <= n_ops <= ops.shape[0]:
        raise LayoutError(f"/{STATUS} says {n_ops} ops, the table has {ops.shape[0]} rows")
    if not 0 <= n_tensors <= tensors.shape[0]:
        raise LayoutError(f"/{STATUS} says {n_tensors} tensors, the table has "
                          f"{tensors.shape[0]} rows")
    if complete not in (0, 1):
        raise LayoutError(f"/{STATUS} has complete flag {complete}")
    if not 0 <= blob_len <= blob.shape[0]:
        raise LayoutError(f"/{STATUS} says {blob_len} data bytes, the data holds "
                          f"{blob.shape[0]}")
    _check_storage(blob, blob_len, file_size)
    return n_ops, n_tensors, blob_len


def check_tensor_rows(t: np.ndarray, blob_len: int, in_source: bool = False) -> None:
    """Vectorised checks of the tensor table: ranges, shapes, byte counts, dtypes.
    in_source: rows may say their bytes are the replayed dump's (`schema.IN_SOURCE`, schema
    5 replays): such a row names their count and content hash, checked like stored ones."""
    if len(t) == 0:
        return
    rows = np.arange(len(t))

    def refuse(mask: np.ndarray, why: str) -> None:
        if mask.any():
            i = int(rows[mask][0])
            raise LayoutError(f"tensor row {i}: {why}")

    refuse(t["seq"] < 0, "negative sequence number")
    refuse(t["io"] > 1, "io is neither input nor output")
    refuse(t["idx"] < 0, "negative tensor index")
    ndim = t["ndim"].astype(np.int64)
    refuse((ndim < -1) | (ndim > schema.MAX_DIMS), "impossible number of dimensions")
    used = np.arange(schema.MAX_DIMS)[None, :] < ndim[:, None]
    shape = np.where(used, t["shape"], 1)
    refuse((shape < 0).any(axis=1), "negative dimension")
    refuse((shape > MAX_NUMEL).any(axis=1), "dimension too large")
    # float64 products are exact far beyond MAX_NUMEL's neighbourhood, and cannot wrap
    numel = np.prod(shape.astype(np.float64), axis=1)
    refuse(numel > MAX_NUMEL, "shape holds too many elements")
    off, nb = t["offset"], t["nbytes"]
    refuse(t["first"] < -1, "negative link")
    refuse(t["nan_count"] < -1, "negative nan count")
    refuse(t["inf_count"] < -1, "negative inf count")
    data = (off >= 0) & (ndim >= 0)
    elsewhere = off == schema.IN_SOURCE
    if in_source and "hash" in (t.dtype.names or ()):
        refuse(elsewhere & (ndim < 0), "bytes in the replayed dump without a shape")
        refuse(elsewhere & (t["hash"] == 0), "bytes in the replayed dump without a content hash")
        refuse(elsewhere & (t["first"] != -1), "bytes in the replayed dump shared as a link")
        refuse(off < schema.IN_SOURCE, "negative data offset")
        refuse((off == schema.IN_SOURCE) & (t["io"] != schema.OUTPUT),
               "an input's bytes in the replayed dump")
    else:
        refuse(off < -1, "negative data offset")
    sized = data | (elsewhere & in_source)
    refuse(nb < 0, "negative byte count")
    refuse(data & (off > blob_len), "data offset past the end of the data")
    refuse(data & (nb > blob_len - np.minimum(off, blob_len)), "data runs past the end of the data")
    sizes = {}
    for name in sorted(set(t["dtype"][sized].tolist())):  # np.unique imports numpy.ma: 6 ms
        text = name.decode("ascii", "replace")
        try:
            sizes[name] = dtypes.itemsize(text)
        except (ValueError, TypeError):
            raise LayoutError(f"unknown tensor dtype {text!r}") from None
    if sizes:
        itemsize = np.zeros(len(t), np.float64)
        for name, size in sizes.items():
            itemsize[t["dtype"] == name] = size
        refuse(sized & (numel * itemsize != nb), "byte count does not match dtype and shape")
    if "strided" in (t.dtype.names or ()):
        _check_strided(t, data, blob_len, sizes)
    _check_unique_addresses(t)


def _check_strided(t: np.ndarray, data: np.ndarray, blob_len: int,
                   sizes: dict[bytes, int]) -> None:
    """Schema 6: a strided row's elements lie inside the committed data, in distinct bytes
    (see layout.py), checked before any `as_strided` reads them; a strided link names an
    earlier strided row of its own values with the same bytes."""
    flag = t["strided"]
    bad = (flag != 0) & (flag != 1)
    if bad.any():
        raise LayoutError(f"tensor row {int(np.argmax(bad))}: strided is neither 0 nor 1")
    strided = flag == 1
    bad = strided & ~data
    if bad.any():
        raise LayoutError(f"tensor row {int(np.argmax(bad))}: strided without stored bytes")
    first = t["first"]
    link = strided & (first != np.arange(len(t)))
    if link.any():
        rows = np.flatnonzero(link)
        f = first[rows]
        bad = (f < 0) | (f >= rows)
        if bad.any():
            raise LayoutError(f"tensor row {int(rows[np.argmax(bad)])}: strided link to no "
                              "earlier row")
        same = ((t["strided"][f] == 1) & (first[f] == f) & (t["offset"][f] == t["offset"][rows])
                & (t["nbytes"][f] == t["nbytes"][rows]) & (t["dtype"][f] == t["dtype"][rows]))
        if not same.all():
            raise LayoutError(f"tensor row {int(rows[np.argmin(same)])}: strided link to a row "
                              "of other bytes")
    rows = np.flatnonzero(strided & ~link)
    if not len(rows):
        return
    sub = t[rows]
    found = layout.check_rows(sub["shape"].tolist(), sub["layout"].tolist(),
                              sub["ndim"].astype(np.int64).tolist(),
                              [sizes[d] for d in sub["dtype"].tolist()],
                              sub["offset"].tolist(), blob_len, rows.tolist())
    if found is not None:
        raise LayoutError(f"tensor row {found[0]}: {found[1]}")


def _check_unique_addresses(t: np.ndarray) -> None:
    """Each (seq, io, idx) names one tensor: the writer gives each one row. Two rows at one
    address would each be read by some reader and shadowed in others (and `extract` cannot
    write both at the Ascend address), so such a file is refused as damaged, not renamed."""
    seq, io, idx = t["seq"], t["io"], t["idx"]
    later = (seq[1:] > seq[:-1]) | ((seq[1:] == seq[:-1]) & (
        (io[1:] > io[:-1]) | ((io[1:] == io[:-1]) & (idx[1:] > idx[:-1]))))
    if later.all():  # the writer's order: strictly increasing, so no two rows share one
        return
    order = np.lexsort((idx, io, seq))
    s, i, x = seq[order], io[order], idx[order]
    same = (s[1:] == s[:-1]) & (i[1:] == i[:-1]) & (x[1:] == x[:-1])
    if same.any():
        k = int(np.argmax(same))
        a, b = sorted((int(order[k]), int(order[k + 1])))
        raise LayoutError(f"tensor rows {a} and {b} are both {schema.IO_NAMES[int(i[k])]} "
                          f"{int(x[k])} of op {int(s[k])}: the file was altered or damaged")


def check_op_rows(o: np.ndarray, blob_len: int) -> None:
    if len(o) == 0:
        return
    seq = o["seq"]
    if (seq < 0).any():
        raise LayoutError(f"op row {int(np.argmax(seq < 0))}: negative sequence number")
    if ((o["n_in"] < 0) | (o["n_out"] < 0)).any():
        raise LayoutError("op row with a negative tensor count")
    if "text" in (o.dtype.names or ()):  # schema 4: the text's range lies in the stored data
        off, nb = o["text"], o["text_nbytes"]
        bad = (off < 0) | (nb <= 0) | (nb > MAX_JSON_CHARS) | (off > blob_len) | (
            nb > blob_len - np.minimum(off, blob_len))
        if bad.any():
            raise LayoutError(f"op row {int(np.argmax(bad))}: its text lies outside the data")
    ordered = np.sort(seq)
    if (ordered[1:] == ordered[:-1]).any():
        raise LayoutError("two op rows share a sequence number")


def check_layout(f: h5py.File) -> None:
    """Structure, links, storage, filters and attributes; raises LayoutError."""
    _walk(f)
    _check_dtypes(f)


def open_dataset(f: h5py.File, path: str) -> h5py.Dataset:
    """Open one of the dump's datasets (after `check_layout` has accepted the file).

    No external or virtual source can be reached: `check_layout` refused those from their
    creation properties. (HDF5's efile/virtual prefix access properties were tried as a second
    guard, but they only apply to relative names, and HDF5 then refuses any later open of the
    same dataset in the process with other properties, so a user's own h5py open would fail.)
    """
    return f[path]
