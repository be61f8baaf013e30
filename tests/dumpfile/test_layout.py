"""Schema 6: each storage version's bytes stored once, views read through their strides.

What a user relies on: every view reads back with the values it had when its op ran (also
after the storage changed in place), the stored bytes shrink, content hashes stay the hashes
of the elements in order (compare and replay match tensors by them), dumps of the old layout
still read, and a crafted stride or offset is refused in one line before any byte is read.
"""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest
import torch

from accuracy import dumper, load_dump
from accuracy.cli import main
from accuracy.dumpfile import DumpError, layout, schema
from accuracy.dumpfile.checksum import content_hash
from tests._support.crafted import reseal


def _step(w: torch.Tensor, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Views of every kind over two storages, one of them written in place between views."""
    out = {}
    wt = w.t()  # strided view of a stored weight
    out["mm"] = x @ wt
    out["row"] = w[1]  # a contiguous part of it
    out["col"] = w[:, 2]  # a strided part
    out["perm"] = out["mm"].unsqueeze(0).permute(2, 0, 1)
    out["flat"] = (w.t().contiguous().view(-1) * 1.5)  # a clone of a view, reshaped
    w.add_(1.0)  # a new version of w's storage: its views read the new values
    out["after"] = w.t() * 2
    out["after_col"] = w[:, 1].sum()
    return out


@pytest.fixture()
def views_dump(tmp_path):
    torch.manual_seed(0)
    w, x = torch.randn(6, 4), torch.randn(3, 4)
    w0 = w.clone()
    path = tmp_path / "views.h5"
    with dumper(dump_path=path, mode="tensor"):
        _step(w, x)
    return path, w0, x


def _outputs(d, op):
    return [t for r in d.records if r.op == op for t in r.outputs]


def test_views_read_back_their_values_from_the_storage_stored_once(views_dump):
    path, w0, x = views_dump
    w1 = w0 + 1.0
    with load_dump(path) as d:
        assert d.schema_version == schema.SCHEMA_VERSION == 6
        ts = _outputs(d, "aten.t.default")
        assert len(ts) == 3 and all(t.strided for t in ts)
        assert [torch.equal(t.load(), v) for t, v in zip(ts, (w0.t(), w0.t(), w1.t()),
                                                         strict=True)] == [True] * 3
        sel = _outputs(d, "aten.select.int")
        assert [torch.equal(t.load(), v) for t, v in zip(sel, (w0[1], w0[:, 2], w1[:, 1]),
                                                         strict=True)] == [True] * 3
        perm = _outputs(d, "aten.permute.default")[0]
        assert perm.strided and torch.equal(perm.load(), (x @ w0.t()).unsqueeze(0)
                                            .permute(2, 0, 1))
        mm = next(r for r in d.records if r.op == "aten.mm.default")
        assert mm.inputs[1].is_link and torch.equal(mm.inputs[1].load(), w0.t())
        clone = _outputs(d, "aten.clone.default")[0]  # .contiguous(): its input's values
        assert clone.strided and clone.stride == (6, 1) and torch.equal(clone.load(), w0.t())
        flat = next(r for r in d.records if r.op == "aten.view.default").outputs[0]
        assert flat.is_link and flat.strided and torch.equal(flat.load(), w0.t().reshape(-1))
        # each view's content hash is the hash of its elements in order, as a copy's was
        for t in ts + sel + [perm, clone, flat]:
            v = t.load().contiguous()
            assert t.content_hash == content_hash(v.reshape(-1).view(torch.uint8).numpy())
        # no view holds bytes of its own: each lies in its input's
        for r in d.records:
            if r.op in ("aten.t.default", "aten.select.int", "aten.permute.default"):
                src, out = r.inputs[0], r.outputs[0]
                assert src.offset <= out.offset < src.offset + src.nbytes, r.seq
        copies = sum(t.nbytes for t in d.tensors if t.has_data and not t.is_link)
        assert d.summary()["bytes_written"] == copies - sum(
            t.nbytes for t in ts + sel + [perm, clone])
        assert d.verify() == []


def test_compare_and_windowed_reads_apply_the_layout(views_dump):
    path, w0, _ = views_dump
    with load_dump(path) as d:
        t = _outputs(d, "aten.t.default")[0]
        ref = t.ref()
        assert ref.layout == (t.shape, t.stride)
        want = w0.t().contiguous().reshape(-1).view(torch.uint8).numpy()
        got = np.concatenate([d.read_range(ref, a, a + 5) for a in range(0, t.numel, 5)])
        assert np.array_equal(got, want)
        assert torch.equal(d.read_tensor_mapped(t), w0.t())


def test_a_dump_of_the_old_layout_still_reads(views_dump, tmp_path):
    """Schema 4 (the layout before 6): every row row-major, no `strided` column; the views'
    elements stored again, as schema 4 stored them."""
    path, _, _ = views_dump
    old = tmp_path / "old.h5"
    shutil.copyfile(path, old)
    with load_dump(path) as d:
        values = {t.row: t.load() for t in d.tensors if t.has_data}
        gathered = [t.row for t in d.tensors if t.has_data and t.byte_layout is not None]
    with h5py.File(old, "r+") as f:
        rows = f[schema.TENSORS][:]
        n_ops, n_tensors, complete, blob_len = (int(v) for v in f["_status"][:])
        extra = []
        for i in gathered:
            raw = values[i].contiguous().reshape(-1).view(torch.uint8).numpy()
            rows[i]["offset"] = blob_len + sum(len(e) for e in extra)
            rows[i]["first"] = i
            extra.append(raw)
        new = np.concatenate(extra)
        f[schema.BLOB].resize((blob_len + len(new),))
        f[schema.BLOB][blob_len:] = new
        v5 = np.empty(len(rows), schema.TENSOR_ROW_V5)
        for n in schema.TENSOR_ROW_V5.names:
            v5[n] = rows[n]
        del f[schema.TENSORS]
        f.create_dataset(schema.TENSORS, data=v5, maxshape=(None,), chunks=True)
        f["_status"][:] = [n_ops, n_tensors, complete, blob_len + len(new)]
        f.attrs["schema_version"] = 4
        reseal(f)
    with load_dump(old) as d:
        assert d.schema_version == 4 and not any(t.strided for t in d.tensors)
        assert d.verify() == []
        for t in d.tensors:
            if t.has_data:
                assert torch.equal(t.load(), values[t.row]), t.address


def _crafted(good, dst, row_of, edit) -> None:
    shutil.copyfile(good, dst)
    with h5py.File(dst, "r+") as f:
        rows = f[schema.TENSORS][:]
        edit(rows[row_of(rows)])
        f[schema.TENSORS][:] = rows
        reseal(f)


def _strided_2d(rows) -> int:
    return int(next(i for i, r in enumerate(rows) if r["strided"] and r["ndim"] == 2
                    and r["first"] == i and r["shape"][0] > 1 and r["shape"][1] > 1))


def _set(**cols):
    def edit(r):
        for k, v in cols.items():
            if k in ("stride0", "stride1"):
                r["layout"][int(k[-1])] = v
            else:
                r[k] = v
    return edit


@pytest.mark.parametrize("edit, why", [
    (_set(stride0=-1), "negative stride"),
    (_set(stride0=0), "overlapping strides"),
    (_set(stride1=1, stride0=1), "overlapping strides"),
    (_set(stride0=1 << 40), "past the end of the data"),
    (_set(stride0=1 << 62, stride1=1), "past the end of the data"),
    (_set(offset=1 << 20), "past the end of the data"),
    (_set(strided=2), "strided is neither 0 nor 1"),
    (_set(offset=-1), "strided without stored bytes"),
])
def test_crafted_strides_and_offsets_are_refused_in_one_line(views_dump, tmp_path, capsys,
                                                             edit, why):
    path, _, _ = views_dump
    bad = tmp_path / "bad.h5"
    _crafted(path, bad, _strided_2d, edit)
    with pytest.raises(DumpError, match=why):
        load_dump(bad)
    assert main(["info", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "error:" in err[0] and why in err[0]


@pytest.mark.parametrize("edit, why", [
    (lambda rows, i: rows[i].__setitem__("first", i + 1), "strided link to no earlier row"),
    (lambda rows, i: rows[i].__setitem__("offset", rows[i]["offset"] + 4), "of other bytes"),
])
def test_a_crafted_strided_link_is_refused(views_dump, tmp_path, edit, why):
    path, _, _ = views_dump
    bad = tmp_path / "bad.h5"
    shutil.copyfile(path, bad)
    with h5py.File(bad, "r+") as f:
        rows = f[schema.TENSORS][:]
        i = int(next(j for j, r in enumerate(rows) if r["strided"] and r["first"] != j))
        edit(rows, i)
        f[schema.TENSORS][:] = rows
        reseal(f)
    with pytest.raises(DumpError, match=why):
        load_dump(bad)


def test_strides_are_applied_only_within_the_bytes_read():
    raw = np.arange(12, dtype=np.uint8)
    assert layout.gather(raw, (3, 4), (1, 3), 1).tolist() == [0, 3, 6, 9, 1, 4, 7, 10,
                                                             2, 5, 8, 11]
    assert layout.gather_window(raw, (3, 4), (1, 3), 1, 5, 9).tolist() == [4, 7, 10, 2]
    with pytest.raises(ValueError):
        layout.strided_view(raw[:11], (3, 4), (1, 3), 1)  # one byte short of the span
    assert layout.problem((3, 4), (1, 3), 1, 0, 12) == ""
    assert layout.problem((3, 4), (1, 3), 1, 1, 12) != ""
    assert layout.problem((4, 3), (0, 1), 1, 0, 12) != ""


def test_each_output_of_a_multi_output_view_is_placed(tmp_path):
    x = torch.randn(4, 6)
    with dumper(dump_path=tmp_path / "u.h5", mode="tensor"):
        parts = x.t().unbind(0)
        halves = x.split(2)
        torch.stack([p * 1 for p in parts]).sum()
    with load_dump(tmp_path / "u.h5") as d:
        unbound = _outputs(d, "aten.unbind.int")
        assert len(unbound) == 6 and all(t.strided for t in unbound)
        assert all(torch.equal(t.load(), p) for t, p in zip(unbound, parts, strict=True))
        split = _outputs(d, "aten.split.Tensor")
        assert all(t.strided for t in split)
        assert all(torch.equal(t.load(), h) for t, h in zip(split, halves, strict=True))
