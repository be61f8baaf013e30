"""Builders of hostile dump files, for the reader, CLI and server tests.

Each builder takes a good dump written by our dumper and writes a variant an attacker (or a
damaged disk) could produce. `SECRET` is what a file "outside" holds: a test asserts it never
comes back from any reader, command or request.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import torch

SECRET = b"TOP-SECRET-TOKEN=hunter2;" * 64  # 1600 bytes, longer than the good dump's data


def good_dump(path: Path) -> Path:
    """A small tensor-mode dump: matmul, relu, sum of an 8x8 fp32 tensor."""
    from accuracy import dumper

    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    with dumper(dump_path=path, overwrite=True):
        (x @ x).relu().sum()
    return path


def _op_rows(f: h5py.File) -> np.ndarray:
    from accuracy.dumpfile import schema

    return f[schema.OPS][:max(0, int(f["_status"][0]))]


def stored_op_texts(f: h5py.File) -> list[bytes]:
    """The committed ops' stored text (schema 4 keeps it in the blob), as bytes."""
    blob = f["_data/blob"]
    return [blob[int(r["text"]): int(r["text"]) + int(r["text_nbytes"])].tobytes()
            for r in _op_rows(f)]


def op_texts(f: h5py.File) -> list[dict[str, str]]:
    """The committed ops' text fields by name (op, phase, module, source, ...)."""
    from accuracy.dumpfile import optext, schema

    return [dict(zip(schema.OP_TEXT_FIELDS, optext.decode(t, "op"), strict=True))
            for t in stored_op_texts(f)]


def edit_op_texts(f: h5py.File, edit: Callable[[list[dict[str, str]]], None]) -> None:
    """Rewrite the ops' text fields as whoever crafts a file can: `edit` changes the dicts of
    `op_texts`; the new texts go to the end of the stored data and the rows point at them.
    The metadata hashes are left as they were (`reseal` recomputes them)."""
    from accuracy.dumpfile import optext, schema

    texts = op_texts(f)
    edit(texts)
    rows = _op_rows(f)
    status = f["_status"][:]
    blob, end = f["_data/blob"], int(status[3])
    for r, t in zip(rows, texts, strict=True):
        raw = np.frombuffer(optext.encode([t[k] for k in schema.OP_TEXT_FIELDS]), np.uint8)
        if blob.shape[0] < end + raw.size:
            blob.resize((end + raw.size,))
        blob[end: end + raw.size] = raw
        r["text"], r["text_nbytes"], end = end, raw.size, end + raw.size
    f[schema.OPS][:len(rows)] = rows
    status[3] = end
    f["_status"][:] = status


def heap_collections(path: Path) -> list[tuple[int, int]]:
    """(address, size) of every HDF5 global heap collection in the file ("GCOL" headers)."""
    raw = path.read_bytes()
    out, at = [], raw.find(b"GCOL")
    while at >= 0:
        out.append((at, int.from_bytes(raw[at + 8: at + 16], "little")))
        at = raw.find(b"GCOL", at + 4)
    return out


def outside_file(folder: Path) -> Path:
    """A plain file outside any dump, holding SECRET."""
    p = folder / "outside.secret"
    p.write_bytes(SECRET)
    return p


def outside_h5(folder: Path) -> Path:
    """An HDF5 file outside the dump whose dataset /secret holds SECRET as uint8."""
    p = folder / "outside.h5"
    with h5py.File(p, "w") as f:
        f["secret"] = np.frombuffer(SECRET, np.uint8)
    return p


def _rebuild(good: Path, dst: Path, make_blob: Callable[[h5py.File, np.ndarray], None],
             edit: Callable[[h5py.File], None] | None = None) -> Path:
    """A copy of `good` with `/_data/blob` made by `make_blob(file, original bytes)`."""
    with h5py.File(good, "r") as src, h5py.File(dst, "w", libver="latest") as f:
        for k, v in src.attrs.items():
            f.attrs[k] = v
        for name in ("_index/ops", "_index/tensors"):
            d = src[name]
            f.create_dataset(name, data=d[:], maxshape=(None,), chunks=d.chunks)
        f["_status"] = src["_status"][:]
        f.create_group("_data")
        make_blob(f, src["_data/blob"][:])
        if edit is not None:
            edit(f)
        reseal(f)
    return dst


def external_storage(good: Path, dst: Path, outside: Path) -> Path:
    """The blob's raw storage is an external file (HDF5 external storage)."""
    def blob(f: h5py.File, data: np.ndarray) -> None:
        f.create_dataset("_data/blob", shape=data.shape, dtype=np.uint8,
                         external=[(str(outside), 0, h5py.h5f.UNLIMITED)])
    return _rebuild(good, dst, blob)


def external_link(good: Path, dst: Path, outside: Path) -> Path:
    """`/_data/blob` is an external link to a dataset in another HDF5 file."""
    def blob(f: h5py.File, data: np.ndarray) -> None:
        f["_data/blob"] = h5py.ExternalLink(str(outside), "/secret")
    return _rebuild(good, dst, blob)


def virtual_blob(good: Path, dst: Path, outside: Path) -> Path:
    """`/_data/blob` is a virtual dataset mapping another file's dataset."""
    def blob(f: h5py.File, data: np.ndarray) -> None:
        layout = h5py.VirtualLayout(shape=(len(SECRET),), dtype=np.uint8)
        layout[:] = h5py.VirtualSource(str(outside), "secret", shape=(len(SECRET),))
        f.create_virtual_dataset("_data/blob", layout)
    return _rebuild(good, dst, blob)


def soft_link(good: Path, dst: Path) -> Path:
    """`/_data/blob` is a soft link to another dataset in the file."""
    def blob(f: h5py.File, data: np.ndarray) -> None:
        f["_data/blob"] = h5py.SoftLink("/_status")
    return _rebuild(good, dst, blob)


def gzip_bomb(good: Path, dst: Path, size: int = 64 << 20) -> Path:
    """The blob is gzip-compressed zeros, `size` bytes uncompressed, and a tensor row claims
    all of it: a few KB on disk that expand into `size` bytes of memory when read."""
    def blob(f: h5py.File, data: np.ndarray) -> None:
        ds = f.create_dataset("_data/blob", shape=(size,), dtype=np.uint8, chunks=(1 << 20,),
                              compression="gzip", compression_opts=9)
        zeros = np.zeros(1 << 20, np.uint8)
        for a in range(0, size, 1 << 20):
            ds[a: a + (1 << 20)] = zeros

    def edit(f: h5py.File) -> None:
        st = f["_status"][:]
        st[3] = size
        f["_status"][:] = st
        t = f["_index/tensors"][:]
        n = (size // 4)
        t[0]["ndim"], t[0]["offset"], t[0]["nbytes"] = 1, 0, size
        t[0]["shape"][:] = 0
        t[0]["shape"][0] = n
        t[0]["nan_count"] = -1  # no checksum to check: the bytes are read in full
        f["_index/tensors"][:] = t
    return _rebuild(good, dst, blob, edit)


def sparse_bomb(good: Path, dst: Path, size: int = 64 << 20) -> Path:
    """No filter: a huge chunked blob with no chunk written, and a row claiming all of it."""
    def blob(f: h5py.File, data: np.ndarray) -> None:
        ds = f.create_dataset("_data/blob", shape=(size,), maxshape=(None,), dtype=np.uint8,
                              chunks=(1 << 20,))
        ds[: data.size] = data

    def edit(f: h5py.File) -> None:
        st = f["_status"][:]
        st[3] = size
        f["_status"][:] = st
        t = f["_index/tensors"][:]
        t[0]["offset"], t[0]["nbytes"], t[0]["ndim"] = 0, size, 1
        t[0]["shape"][:] = 0
        t[0]["shape"][0] = size // 4
        f["_index/tensors"][:] = t
    return _rebuild(good, dst, blob, edit)


def reseal(f: h5py.File) -> None:
    """Recompute the metadata hashes after an edit, as an attacker can (they are not keyed):
    what a crafted file tests is then the reader's own checks, behind the hashes."""
    from accuracy.dumpfile import schema
    from accuracy.dumpfile.checksum import ATTRS_HASH, attrs_hash, rows_hash

    if schema.BATCHES in f:
        n_ops, n_tensors = (max(0, int(n)) for n in f["_status"][:2])
        ops, tensors = f[schema.OPS][:n_ops], f[schema.TENSORS][:n_tensors]
        texts = stored_op_texts(f) if "text" in ops.dtype.names else ()
        b = f[schema.BATCHES]
        b.resize((1,))
        b[0] = (len(ops), len(tensors), rows_hash(ops, tensors, texts))
    if ATTRS_HASH in f.attrs:
        f.attrs[ATTRS_HASH] = np.uint64(attrs_hash(dict(f.attrs.items())))


def _copy_and_edit(good: Path, dst: Path, edit: Callable[[h5py.File], None]) -> Path:
    shutil.copyfile(good, dst)
    with h5py.File(dst, "r+") as f:
        edit(f)
        reseal(f)
    return dst


def deep_json_extra(good: Path, dst: Path, depth: int = 100_000) -> Path:
    """An op's `extra` is JSON nested `depth` levels deep."""
    def edit(f: h5py.File) -> None:
        edit_op_texts(f, lambda ops: ops[0].update(extra="[" * depth + "]" * depth))
    return _copy_and_edit(good, dst, edit)


def deep_json_args(good: Path, dst: Path, depth: int = 100_000) -> Path:
    """An op's recorded call arguments are JSON nested `depth` levels deep."""
    def edit(f: h5py.File) -> None:
        deep = '{"args": ' + "[" * depth + "]" * depth + ', "kwargs": {}}'
        edit_op_texts(f, lambda ops: ops[0].update(args=deep))
    return _copy_and_edit(good, dst, edit)


def deep_json_attr(good: Path, dst: Path, depth: int = 100_000) -> Path:
    """A root attribute holds JSON nested `depth` levels deep."""
    def edit(f: h5py.File) -> None:
        f.attrs["filter"] = "[" * depth + "]" * depth
    return _copy_and_edit(good, dst, edit)


def negative_count(good: Path, dst: Path) -> Path:
    """`/_status` claims -1 committed ops (it used to drop the last op silently)."""
    def edit(f: h5py.File) -> None:
        st = f["_status"][:]
        st[0] = -1
        f["_status"][:] = st
    return _copy_and_edit(good, dst, edit)


def shared_seq(good: Path, dst: Path) -> Path:
    """Two op rows claim one sequence number (the second op would shadow the first)."""
    def edit(f: h5py.File) -> None:
        o = f["_index/ops"][:]
        o[1]["seq"] = o[0]["seq"]
        f["_index/ops"][:] = o
    return _copy_and_edit(good, dst, edit)


def shared_address(good: Path, dst: Path) -> Path:
    """Two tensor rows claim one address (input 0 of op 0): `extract` met it as "name already
    exists", half-way through its output file."""
    def edit(f: h5py.File) -> None:
        t = f["_index/tensors"][:]
        t[1]["seq"], t[1]["io"], t[1]["idx"] = t[0]["seq"], t[0]["io"], t[0]["idx"]
        f["_index/tensors"][:] = t
    return _copy_and_edit(good, dst, edit)


def replay_naming(good: Path, dst: Path, replayed_from: bytes) -> Path:
    """A replay of `good` whose `replayed_from` attribute holds `replayed_from` (raw bytes: an
    HDF5 string attribute can hold a NUL byte no path can)."""
    from accuracy.replay.engine import replay

    replay(good, dst, overwrite=True)

    def edit(f: h5py.File) -> None:
        f.attrs["replayed_from"] = np.bytes_(replayed_from)
    return _copy_and_edit(dst, dst.with_name(dst.stem + ".crafted.h5"), edit)


def unknown_dtype(good: Path, dst: Path) -> Path:
    """A stored tensor's row names a dtype no reader knows how many bytes a value takes."""
    def edit(f: h5py.File) -> None:
        t = f["_index/tensors"][:]
        t[int(np.argmax(t["offset"] >= 0))]["dtype"] = b"float99"
        f["_index/tensors"][:] = t
    return _copy_and_edit(good, dst, edit)


def sim_rule_named(good: Path, dst: Path, op: str) -> Path:
    """The dump says it ran under `sim` with a rounding rule on `op` whose rounding no process
    knows: the replay logs the rule's name, as the file spells it."""
    import json

    def edit(f: h5py.File) -> None:
        f.attrs["sim"] = json.dumps({"rules": [{"op": op, "rounding": "no-such-rounding"}]})
    return _copy_and_edit(good, dst, edit)


def rows_outside(good: Path, dst: Path, offset: int | None = None,
                 nbytes: int | None = None) -> Path:
    """The first stored tensor's row points past the data (or overflows int64 arithmetic)."""
    def edit(f: h5py.File) -> None:
        t = f["_index/tensors"][:]
        blob_len = int(f["_status"][3])
        i = int(np.argmax(t["offset"] >= 0))
        t[i]["offset"] = blob_len - 4 if offset is None else offset
        if nbytes is not None:
            t[i]["nbytes"] = nbytes
        f["_index/tensors"][:] = t
    return _copy_and_edit(good, dst, edit)


def op_text_outside(good: Path, dst: Path, offset: int | None = None,
                    nbytes: int | None = None) -> Path:
    """The first op row's text points past the data (or overflows int64 arithmetic)."""
    def edit(f: h5py.File) -> None:
        ops = f["_index/ops"][:]
        ops[0]["text"] = int(f["_status"][3]) - 4 if offset is None else offset
        if nbytes is not None:
            ops[0]["text_nbytes"] = nbytes
        f["_index/ops"][:] = ops
    return _copy_and_edit(good, dst, edit)


def op_text_not_ours(good: Path, dst: Path, raw: bytes = b'["aten.mm.default"]') -> Path:
    """The first op's stored text is valid JSON, but not the seven strings an op has."""
    def edit(f: h5py.File) -> None:
        status, ops, blob = f["_status"][:], f["_index/ops"][:], f["_data/blob"]
        end = int(status[3])
        blob.resize((max(blob.shape[0], end + len(raw)),))
        blob[end: end + len(raw)] = np.frombuffer(raw, np.uint8)
        ops[0]["text"], ops[0]["text_nbytes"] = end, len(raw)
        f["_index/ops"][:] = ops
        status[3] = end + len(raw)
        f["_status"][:] = status
    return _copy_and_edit(good, dst, edit)


def as_vlen_op_table(f: h5py.File, row_type: np.dtype) -> None:
    """Rewrite the op table as a schema 1-3 file holds it: text in HDF5 strings."""
    from accuracy.dumpfile import schema

    rows, texts = _op_rows(f), op_texts(f)
    old = np.zeros(len(rows), dtype=row_type)
    for n in row_type.names:
        old[n] = [t[n] for t in texts] if n in schema.OP_TEXT_FIELDS else rows[n]
    del f[schema.OPS]
    f.create_dataset(schema.OPS, data=old, maxshape=(None,), chunks=True)


def negative_shape(good: Path, dst: Path) -> Path:
    """A tensor row with a negative dimension."""
    def edit(f: h5py.File) -> None:
        t = f["_index/tensors"][:]
        t[0]["shape"][0] = -8
        f["_index/tensors"][:] = t
    return _copy_and_edit(good, dst, edit)


def _blob_file_offset(path: Path) -> int:
    """Where the blob's first chunk starts in the file."""
    with h5py.File(path, "r") as f:
        ds = f["_data/blob"]
        if ds.chunks is None:
            return int(ds.id.get_offset())
        return int(ds.id.get_chunk_info(0).byte_offset)


def flipped_data(good: Path, dst: Path, at: int = 3) -> Path:
    """One bit flipped in the first tensor's stored bytes (its checksum no longer matches)."""
    shutil.copyfile(good, dst)
    pos = _blob_file_offset(dst) + at
    raw = bytearray(dst.read_bytes())
    raw[pos] ^= 0x10
    dst.write_bytes(bytes(raw))
    return dst


def flipped_chunk_index(good: Path, dst: Path) -> Path:
    """The blob's chunk address in its chunk index has a flipped high bit: reading the data
    makes HDF5 fail deep inside ("Can't synchronously read data")."""
    shutil.copyfile(good, dst)
    addr = _blob_file_offset(dst)
    raw = bytearray(dst.read_bytes())
    needle = addr.to_bytes(8, "little")
    hits = [i for i in range(len(raw) - 8) if raw[i: i + 8] == needle]
    assert hits, "chunk address not found in the file"
    for i in hits:
        raw[i + 5] ^= 0x40  # the address now lies far past the end of the file
    dst.write_bytes(bytes(raw))
    return dst
