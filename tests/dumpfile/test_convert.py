"""`accuracy convert` (accuracy/dumpfile/convert.py): one .npy per tensor with an index, the
flags msaccucmp users type, filters, and nothing written outside the folder it is given."""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import torch

from accuracy import dumper, load_dump
from accuracy.cli import main
from accuracy.dumpfile.convert import npy_name
from tests._support.crafted import edit_op_texts, reseal


def test_msaccucmp_convert_flags_on_a_folder_of_dumps(tmp_path, capsys):
    """`convert -d DIR -out DIR -v 2`, as msaccucmp is called: every dump in the folder, each
    into its own subfolder; a file that is not a dump is named and passed over."""
    src = tmp_path / "dump"
    src.mkdir()
    for name in ("a", "b"):
        with dumper(dump_path=src / f"{name}.h5"):
            torch.ones(3).exp()
    (src / "notes.h5").write_text("not hdf5")
    assert main(["convert", "-d", str(src), "-out", str(tmp_path / "npy"), "-v", "2"]) == 0
    out = capsys.readouterr().out
    for name in ("a", "b"):
        index = json.loads((tmp_path / "npy" / name / "index.json").read_text())
        assert index["tensors"] and all((tmp_path / "npy" / name / t["file"]).is_file()
                                        for t in index["tensors"].values())
    assert "notes.h5: skipped" in out
    assert main(["convert", "-d", str(src / "a.h5"), "-out", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "index.json").is_file()


def test_convert_writes_one_npy_per_tensor_with_an_index(in_tmp):
    x = torch.randn(4, 3, dtype=torch.bfloat16)
    with dumper(dump_path="bf.h5"):
        y = (x * 2).float().to(torch.float8_e4m3fn)
    assert main(["convert", "bf.h5", "-o", "npy"]) == 0
    index = json.loads(Path("npy/index.json").read_text())["tensors"]
    with load_dump("bf.h5") as d:
        tensors = [t for r in d.records for t in r.tensors if t.has_data]
        assert set(index) == {t.address for t in tensors}
        for t in tensors:
            entry = index[t.address]
            arr = np.load(Path("npy") / entry["file"], allow_pickle=False)
            assert entry["dtype"] == t.dtype and entry["shape"] == list(t.shape)
            assert arr.dtype == (np.float32 if t.dtype in ("bfloat16", "float8_e4m3fn")
                                 else t.load().numpy().dtype)
            assert np.array_equal(arr, t.load().float().numpy() if arr.dtype == np.float32
                                  else t.load().numpy())
        last = d.records[-1].outputs[0]
    assert index[last.address]["dtype"] == "float8_e4m3fn"
    assert torch.equal(torch.from_numpy(np.load(Path("npy") / index[last.address]["file"])),
                       y.float())
    assert sorted(os.listdir("npy")) == sorted([e["file"] for e in index.values()]
                                               + ["index.json"])
    # a second run refuses to write into the folder, with a one-line reason
    assert main(["convert", "bf.h5", "-o", "npy"]) == 2
    assert main(["convert", "bf.h5", "-o", "npy", "--overwrite", "--op", "aten.mul*"]) == 0


def test_convert_filters_by_op_seq_module(lm_runs, in_tmp):
    d, _ = lm_runs
    assert main(["convert", str(d / "gold.h5"), "-o", "a", "--op", "aten.addmm*",
                 "--module", "*layers.0.*"]) == 0
    index = json.loads(Path("a/index.json").read_text())["tensors"]
    assert index and all(a.startswith("/aten.addmm.default/") for a in index)
    assert all("layers.0" in e["module"] for e in index.values())
    seq = int(next(iter(index)).split("/")[2])
    assert main(["convert", str(d / "gold.h5"), "-out", "b", "--seq", str(seq)]) == 0
    index = json.loads(Path("b/index.json").read_text())["tensors"]
    assert {int(a.split("/")[2]) for a in index} == {seq}


def test_convert_never_writes_outside_its_folder(in_tmp):
    with dumper(dump_path="evil.h5"):
        torch.ones(2).exp()
    with h5py.File("evil.h5", "r+") as f:  # an untrusted dump naming its op like a path
        edit_op_texts(f, lambda ops: ops[0].update(op="../../escaped/x"))
        reseal(f)  # the metadata hashes, recomputed as whoever crafts a file can
    os.mkdir("out")
    os.symlink("/tmp", "out/planted.npy")
    assert main(["convert", "evil.h5", "-o", "out", "--overwrite"]) == 0
    assert not Path("escaped").exists() and not Path("../escaped").exists()
    names = set(os.listdir("out")) - {"planted.npy", "index.json"}
    assert names and all("/" not in n and not n.startswith(".") for n in names)
    for addr in ("/../../x/1/input/0", "/a" * 300, "/./1/output/0"):
        n = npy_name(addr)
        assert "/" not in n and not n.startswith(".") and len(n) < 256


def test_convert_does_not_follow_a_planted_symlink(in_tmp, tmp_path_factory):
    with dumper(dump_path="a.h5"):
        torch.ones(2).exp()
    victim = tmp_path_factory.mktemp("victim") / "v.txt"
    victim.write_text("keep")
    os.mkdir("out")
    with load_dump("a.h5") as d:
        addr = d.records[0].tensors[0].address
    os.symlink(victim, Path("out") / npy_name(addr))
    assert main(["convert", "a.h5", "-o", "out", "--overwrite"]) == 2
    assert victim.read_text() == "keep"

