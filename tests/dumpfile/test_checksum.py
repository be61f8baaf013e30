"""Stored bytes are checked by a content hash (XXH3-64, schema 3): corruptions a sum cannot
see (two elements swapped, opposite bits flipped in a pair) are caught by `verify` and by every
reader path; dumps of the older schema still read, checked by their sum."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from accuracy import dumper
from accuracy.cli import main
from accuracy.dumpfile import DumpError, load_dump, schema
from tests._support.crafted import as_vlen_op_table, edit_op_texts, stored_op_texts


def _dump(path: Path, scale: float = 1.0) -> Path:
    x = torch.arange(64, dtype=torch.float32).reshape(8, 8) / 7
    with dumper(dump_path=path, overwrite=True):
        ((x * scale) @ x).relu()
    return path


def _mm_out(path: Path):
    with load_dump(path) as d:
        t = next(t for t in d.tensors if t.op == "aten.mm.default" and t.io == schema.OUTPUT)
        return t.offset, t.nbytes, t.address


def _swap(path: Path) -> str:
    """Swap the first two fp32 elements of the matmul's stored output (sum unchanged)."""
    off, _, addr = _mm_out(path)
    with h5py.File(path, "r+") as f:
        b = f[schema.BLOB]
        a = b[off:off + 8].copy()
        assert a[:4].tobytes() != a[4:].tobytes()
        b[off:off + 8] = np.concatenate([a[4:], a[:4]])
    return addr


def _flip_pair(path: Path) -> str:
    """Set a bit in one element and clear the same bit in the next (sum unchanged)."""
    off, _, addr = _mm_out(path)
    with h5py.File(path, "r+") as f:
        b = f[schema.BLOB]
        v = b[off:off + 8].copy().view(np.int32)
        bit = next(k for k in range(23) if not v[0] >> k & 1 and v[1] >> k & 1)
        v[0] += 1 << bit
        v[1] -= 1 << bit
        b[off:off + 8] = v.view(np.uint8)
    return addr


@pytest.mark.parametrize("damage", [_swap, _flip_pair])
def test_sum_preserving_damage_is_caught_everywhere(tmp_path, damage, capsys):
    golden = _dump(tmp_path / "golden.h5")
    my = _dump(tmp_path / "my.h5")
    addr = damage(my)
    with load_dump(my) as d:
        problems = d.verify()
        assert len(problems) == 1 and addr in problems[0], problems
        t = next(t for t in d.tensors if t.address == addr)
        with pytest.raises(DumpError, match="damaged"):
            t.load()
        with pytest.raises(DumpError, match="damaged"):
            d.read_tensor_mapped(t)
    assert main(["verify", str(my)]) == 1
    from accuracy.compare import compare

    with pytest.raises(DumpError, match="damaged"):
        compare(my, golden)
    capsys.readouterr()


def test_server_tensor_view_refuses_swapped_bytes(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from accuracy.server import create_app

    my = _dump(tmp_path / "my.h5")
    addr = _swap(my)
    app = create_app(tmp_path / "data", allowed_roots=[tmp_path])
    with TestClient(base_url="http://127.0.0.1", headers={"X-Accuracy-Request": "1"},
                    app=app) as c:
        run = c.post("/api/runs/register", json={"path": str(my)}).json()["id"]
        r = c.get(f"/api/runs/{run}/tensor/values", params={"address": addr})
    assert r.status_code == 410 and "damaged" in r.json()["error"], r.text


def _as_schema_2(path: Path) -> None:
    """Rewrite a dump as schema 2 wrote it: tensor rows without the content hash, each with
    the bit-pattern sum of its bytes (schema 3's tensor dumps store no sums)."""
    from accuracy.dumpfile import dtypes
    from accuracy.dumpfile.checksum import checksum, part_size

    with h5py.File(path, "r+") as f:
        rows = f[schema.TENSORS][:]
        blob = f[schema.BLOB][:]
        for r in rows:
            if r["offset"] >= 0 and r["nan_count"] >= 0:
                dt = r["dtype"].decode() if isinstance(r["dtype"], bytes) else str(r["dtype"])
                raw = blob[r["offset"]:r["offset"] + r["nbytes"]]
                r["checksum"] = checksum(raw, part_size(dt, dtypes.itemsize(dt)))
        old = np.empty(len(rows), schema.TENSOR_ROW_V2)
        for n in schema.TENSOR_ROW_V2.names:
            old[n] = rows[n]
        del f[schema.TENSORS]
        f.create_dataset(schema.TENSORS, data=old, maxshape=(None,), chunks=True)
        as_vlen_op_table(f, schema.OP_ROW_V3)
        del f[schema.BATCHES]
        del f.attrs["attrs_hash"]
        del f.attrs[schema.SUMS_ATTR]
        f.attrs["schema_version"] = 2


def test_older_dump_reads_and_is_checked_by_its_sum(tmp_path, capsys):
    p = _dump(tmp_path / "old.h5")
    _as_schema_2(p)
    with load_dump(p) as d:
        assert d.verify() == [] and d.checksum_kind == "bit-pattern sum"
        assert all(t.load() is not None for t in d.tensors if t.has_data)
    assert main(["info", str(p)]) == 0
    assert "checked by bit-pattern sum" in capsys.readouterr().out
    off, _, addr = _mm_out(p)
    with h5py.File(p, "r+") as f:
        f[schema.BLOB][off] ^= 1  # a change the sum sees
    with load_dump(p) as d:
        assert addr in " ".join(d.verify())
    # an older file saying its sums were omitted is still checked by them (no hash to use)
    with h5py.File(p, "r+") as f:
        f.attrs[schema.SUMS_ATTR] = schema.SUMS_OMITTED
    with load_dump(p) as d:
        assert addr in " ".join(d.verify())


def test_info_names_the_content_hash(tmp_path, capsys):
    p = _dump(tmp_path / "new.h5")
    assert main(["info", str(p)]) == 0
    assert "checked by xxh3-64" in capsys.readouterr().out


def _flip_source(f: h5py.File) -> None:
    edit_op_texts(f, lambda ops: ops[1].update(source=(ops[1]["source"] or "x.py:1") + "!"))


def _flip_text_in_place(f: h5py.File) -> None:
    """One letter of an op's stored module name changed where it lies (rows untouched)."""
    row = f[schema.OPS][1]
    text = stored_op_texts(f)[1]
    at = int(row["text"]) + text.index(b"aten") + 1  # aten -> auen: still valid text
    f[schema.BLOB][at] ^= 1


def _flip_stat(f: h5py.File) -> None:
    rows = f[schema.TENSORS][:]
    rows[2]["max"] = rows[2]["max"] * 2 + 1
    rows[3]["mean"] = -1.0
    f[schema.TENSORS][:] = rows


def _flip_attr(f: h5py.File) -> None:
    f.attrs["torch_version"] = "0.0.0"


@pytest.mark.parametrize("damage", [_flip_source, _flip_text_in_place, _flip_stat, _flip_attr])
def test_metadata_damage_is_refused_by_every_reader(tmp_path, damage, capsys):
    golden = _dump(tmp_path / "golden.h5")
    my = _dump(tmp_path / "my.h5")
    with h5py.File(my, "r+") as f:
        damage(f)
    with pytest.raises(DumpError, match="damaged"):
        load_dump(my)
    for argv in (["info", str(my)], ["ls", str(my)]):
        assert main(argv) == 2
        assert "damaged" in capsys.readouterr().err
    assert main(["verify", str(my)]) == 1
    from accuracy.compare import compare

    with pytest.raises(DumpError, match="damaged"):
        compare(my, golden)


@pytest.mark.parametrize("nbytes", [0, 1, 7, 240, 4096, 1 << 20, (3 << 20) + 5])
def test_whole_buffer_hash_equals_the_chunked_hash(nbytes):
    """The writer hashes a tensor's bytes in one call; compare and the bounded reads go chunk
    by chunk: both must reach the same stored value, or every dump would read as damaged."""
    from accuracy.dumpfile.checksum import ContentHash, content_hash

    raw = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    for piece in (1 if nbytes <= 4096 else 4093, 32768, max(nbytes, 1)):
        h = ContentHash()
        for s in range(0, nbytes, piece):
            h.update(raw[s:s + piece])
        assert h.value == content_hash(raw)
    assert content_hash(raw[::2]) == content_hash(np.ascontiguousarray(raw[::2]))


def test_a_tensor_dump_stores_no_sums_beside_the_hash(tmp_path):
    """A tensor dump's bytes carry the content hash, so its statistics spend no reduction on
    a bit-pattern sum (numpy, large-float and torch paths alike: the column holds 0 and the
    dump says why); a statistics dump keeps the sum; two equal runs still compare bit-exact."""
    def step() -> None:
        torch.manual_seed(0)
        (torch.randn(8, 8) * 2).relu()  # numpy path
        (torch.randn(200, 100) * 2).relu()  # large fp32 path
        torch.arange(20000) + 1  # large int64: torch path
    for name, mode in (("a", "tensor"), ("b", "tensor"), ("s", "statistics")):
        with dumper(dump_path=tmp_path / f"{name}.h5", mode=mode):
            step()
    with h5py.File(tmp_path / "a.h5") as f:
        assert f.attrs[schema.SUMS_ATTR] == schema.SUMS_OMITTED
        rows = f[schema.TENSORS][:]
    stored = rows[(rows["offset"] >= 0) & (rows["nan_count"] >= 0)]
    assert len(stored) >= 6 and (stored["checksum"] == 0).all(), stored["checksum"]
    with load_dump(tmp_path / "a.h5") as d:
        assert not any("checksum" in t.stats for t in d.tensors)
        assert all(t.content_hash for t in d.tensors if t.has_data and not t.is_link)
    with load_dump(tmp_path / "s.h5") as d:
        assert schema.SUMS_ATTR not in d.attrs
        sums = [t.stats["checksum"] for t in d.tensors if t.stats["nan_count"] >= 0]
        assert len(sums) >= 6 and all(s != 0 for s in sums), sums
    from accuracy.compare import compare

    rep = compare(tmp_path / "a.h5", tmp_path / "b.h5")
    data = [r for r in rep.rows if r.bit_exact is not None]
    assert data and all(r.bit_exact for r in data)
