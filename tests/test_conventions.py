"""Ascend's guide snippets run as written, and the CLI behaves like the tools users know (#17).

One test per row of issue #17's table, plus the guide's op-level flow: compare, pick an op,
extract it (and copy its group as h5copy does), load just that op in load mode.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from _crafted import edit_op_texts, reseal
from torch import nn

from accuracy import dumper, load_dump
from accuracy.cli import main
from accuracy.device_backend import sim
from accuracy.dumpfile.convert import npy_name
from accuracy.examples import lm_batch, lm_step, tiny_lm

DOC = Path(__file__).resolve().parents[1] / "docs" / "ascend-guide.md"
REPO = Path(__file__).resolve().parents[1]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def _guide_names(scale: float = 1.0) -> dict:
    """What the guide's snippets assume exists: model, input, criterion, target."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    if scale != 1.0:
        with torch.no_grad():
            model[0].weight.fill_(1.0)
    x = torch.randn(4, 8) if scale == 1.0 else torch.rand(4, 8) * scale  # finite
    return {"model": model, "input": x, "criterion": nn.CrossEntropyLoss(),
            "target": torch.tensor([0, 1, 2, 3])}


def _run_snippet(code: str, names: dict) -> None:
    assert "torch.utils.dumper" not in code
    exec(compile(code, str(DOC), "exec"), dict(names))  # noqa: S102 - the docs' own code


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# -- rows 1-3: the guide's three snippets, verbatim from docs/ascend-guide.md ---


def test_docs_guide_snippets_run_as_written(in_tmp):
    blocks = _python_blocks(DOC.read_text())
    dump_block, load_block, overflow_block = blocks[:3]
    assert 'dumper(use_dump=True, dump_path="./model_gpu.h5")' in dump_block

    _run_snippet(dump_block, _guide_names())
    with load_dump("model_gpu.h5") as d:
        assert d.attrs["complete"] and d.attrs["mode"] == "tensor"
        assert {r.phase for r in d.records} == {"forward", "backward"}

    _run_snippet(load_block, _guide_names())
    with load_dump("model_npu.h5") as d, load_dump("model_gpu.h5") as g:
        assert d.attrs["load_file_path"] == "./model_gpu.h5"
        assert d.attrs["ops_loaded"] > 5
        loaded = [r for r in d.records if r.extra.get("loaded")]
        assert loaded
        for r in loaded:  # fed the golden run's inputs
            for a, b in zip(r.inputs, g.record(r.seq).inputs, strict=True):
                assert torch.equal(a.load(), b.load())

    # finite inputs whose first Linear overflows float32: the birth is recorded
    from accuracy.overflow import OverflowWarning

    with pytest.warns(OverflowWarning, match="aten.addmm.default"):
        _run_snippet(overflow_block, _guide_names(scale=3e38))
    files = os.listdir("overflow_dump")
    assert files == ["dump_0.h5"]
    with load_dump("overflow_dump/dump_0.h5") as d:
        events = d.attrs["overflow"]["events"]
        assert events and events[0]["op"] == "aten.addmm.default"
        assert len(d.records) >= 1


def test_use_dump_false_records_nothing(in_tmp):
    names = _guide_names()
    with dumper(use_dump=False, dump_path="./off.h5") as dump:
        names["model"](names["input"]).sum().backward()
    assert not Path("off.h5").exists()
    assert dump.ops_recorded == 0


def test_folder_dump_path_gets_dump_rank_file(in_tmp):
    os.mkdir("runs")
    with dumper(dump_path="runs"):
        torch.ones(3).exp()
    with dumper(dump_path="new_folder/"):  # a trailing slash names a folder to create
        torch.ones(3).exp()
    assert os.listdir("runs") == ["dump_0.h5"]
    assert os.listdir("new_folder") == ["dump_0.h5"]
    with pytest.raises(FileExistsError, match="dump_0.h5"):
        dumper(dump_path="runs").__enter__()


def test_a_new_path_without_suffix_is_a_folder(in_tmp):
    """`dump_path="out/run1"` (no trailing slash, not there yet) is a folder, as `runs/` is:
    it used to become an HDF5 file named `run1`. A name with a suffix stays a file."""
    with dumper(dump_path="out/run1"):
        torch.ones(3).exp()
    assert os.listdir("out/run1") == ["dump_0.h5"]
    with dumper(dump_path="plain.hdf5"):
        torch.ones(3).exp()
    assert Path("plain.hdf5").is_file()


def test_empty_or_none_load_file_path_means_no_load(in_tmp):
    for value in ("", None):
        d = dumper(dump_path=f"x{value!r}.h5", load_file_path=value)
        with d:
            torch.ones(2).exp()
        with load_dump(d.path) as dump:
            assert "load_file_path" not in dump.attrs


def test_use_load_needs_a_load_file(in_tmp):
    with pytest.raises(ValueError, match="use_load=True needs load_file_path"):
        dumper(use_load=True, dump_path="./", load_file_path="")


# -- row 4: load_with_acl_dump is refused with its reason ---


def test_load_with_acl_dump_is_refused_in_one_line(in_tmp):
    with pytest.raises(ValueError) as e:
        dumper(use_load=True, dump_path="./", load_file_path="./output.h5",
               load_with_acl_dump=True)
    msg = str(e.value)
    assert "\n" not in msg and "ACL" in msg and "Ascend" in msg
    assert not Path("dump_0.h5").exists()


# -- row 5: compare, pick an op, extract (and h5copy), load just that op ---


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A golden CPU step and the same step on `sim` with one faulty addmm."""
    d = tmp_path_factory.mktemp("runs")
    batch = lm_batch(batch=2, seq=8)
    with dumper(d / "gold.h5"):
        lm_step(tiny_lm(), batch)
    with sim(profile="exact", faults=[_fault()]), dumper(d / "dev.h5"):
        lm_step(tiny_lm(), batch)
    return d, batch


def _fault():
    return sim.fault("aten.addmm.default", module="encoder.layers.1.linear1", kind="bias",
                     value=0.05, occurrence=0)


def test_extracted_ops_are_valid_load_files(runs, in_tmp, capsys):
    d, batch = runs
    assert main(["compare", "-m", str(d / "dev.h5"), "-g", str(d / "gold.h5"), "-out",
                 "result"]) == 0
    with open("result/summary.json") as f:
        culprit = json.load(f)["culprit"]
    op, seq = culprit["op"], int(culprit["my_address"].strip("/").split("/")[1])
    assert op == "aten.addmm.default"

    assert main(["extract", str(d / "gold.h5"), "--op", op, "--seq", str(seq), "-o",
                 "output.h5"]) == 0
    # what `h5copy -pv -i output.h5 -o picked.h5 -s /op/seq/ -d /op/seq/` does (H5Ocopy):
    # the group with its attributes, none of the file's
    with h5py.File("output.h5", "r") as src, h5py.File("picked.h5", "w") as dst:
        dst.require_group(op)
        src.copy(src[f"{op}/{seq}"], dst[op], name=str(seq))
        assert "format" not in dst.attrs

    for load_file in ("./output.h5", "./picked.h5"):
        for old in Path(".").glob("dump_0.h5"):
            old.unlink()
        with sim(profile="exact", faults=[_fault()]):
            with dumper(use_load=True, dump_path="./", load_file_path=load_file) as dump:
                lm_step(tiny_lm(), batch)
        with load_dump("dump_0.h5") as dev, load_dump(d / "gold.h5") as gold:
            assert dev.attrs["ops_loaded"] == 1, load_file
            loaded = [r.seq for r in dev.records if r.extra.get("loaded")]
            assert loaded == [seq]
            rec, grec = dev.record(seq), gold.record(seq)
            for a, b in zip(rec.inputs, grec.inputs, strict=True):
                assert torch.equal(a.load(), b.load())
        assert dump.path == os.path.join(".", "dump_0.h5")

    # the guide: `accuracy ls dump_0.h5 --tensors` shows the loaded ops
    capsys.readouterr()
    assert main(["ls", "dump_0.h5", "--tensors"]) == 0
    out, err = capsys.readouterr()
    marked = [ln for ln in out.splitlines() if ln.rstrip().endswith("[loaded]")]
    assert len(marked) == 1 and op in marked[0] and f"{seq:6d}" in marked[0], out
    assert "(golden input)" in out
    assert "(1 loaded from ./picked.h5)" in err, err


def test_guide_torch_utils_dumper_snippet_runs_as_written(tmp_path):
    """`import accuracy.torch_utils` registers torch.utils.dumper; the guide's block runs
    verbatim (in its own process: the registration is process-wide), and plain `import
    accuracy` leaves torch alone."""
    blocks = [b for b in _python_blocks(DOC.read_text()) if "torch.utils.dumper(" in b]
    assert len(blocks) == 1 and "import accuracy.torch_utils" in blocks[0]
    setup = ("import torch\nfrom torch import nn\ntorch.manual_seed(0)\n"
             "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))\n"
             "input = torch.randn(4, 8)\ncriterion = nn.CrossEntropyLoss()\n"
             "target = torch.tensor([0, 1, 2, 3])\n"
             "import accuracy\nfrom accuracy import dumper\n"
             "assert not hasattr(torch.utils, 'dumper'), 'import accuracy touched torch'\n")
    (tmp_path / "step.py").write_text(setup + blocks[0])
    r = subprocess.run([sys.executable, "step.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    with load_dump(tmp_path / "model_gpu.h5") as d:
        assert d.attrs["complete"] and {r.phase for r in d.records} == {"forward", "backward"}


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


def test_load_file_with_soft_link_is_refused(runs, in_tmp):
    d, batch = runs
    assert main(["extract", str(d / "gold.h5"), "--seq", "3", "-o", "one.h5"]) == 0
    with h5py.File("one.h5", "r+") as f:
        op = next(iter(f))
        f[f"{op}/3/input/9"] = h5py.SoftLink("/etc/passwd")
    from accuracy.dumpfile import DumpError

    with pytest.raises(DumpError, match="SoftLink"):
        with dumper(dump_path="x.h5", load_file_path="one.h5"):
            pass


# -- row 6: compare -out, and the CSV's msprobe columns ---


def test_compare_accepts_out_and_writes_msprobe_columns(runs, in_tmp):
    d, _ = runs
    assert main(["compare", "-m", str(d / "dev.h5"), "-g", str(d / "gold.h5"), "-out", "rep",
                 "--formats", "csv,json"]) == 0
    with open("rep/rows.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and "Accuracy Reached or Not" in rows[0] and "NPU_Stack_Info" in rows[0]
    expect = {"pass": "Yes", "warning": "Yes", "error": "No"}
    for r in rows:
        assert r["Accuracy Reached or Not"] == expect.get(r["Result"], "")
    assert any(r["Accuracy Reached or Not"] == "No" for r in rows)
    assert all(r["NPU_Stack_Info"] == r["Source"] for r in rows)


# -- row 7: convert to numpy ---


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


def test_convert_filters_by_op_seq_module(runs, in_tmp):
    d, _ = runs
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


# -- rows 8-10: CLI errors ---


def _cli(*argv: str, close_stdout: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-m", "accuracy.cli", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, start_new_session=True)
    if close_stdout:  # the reader of the pipe is gone before anything is written
        p.stdout.close()
        err = p.stderr.read()
        p.wait(timeout=120)
        return subprocess.CompletedProcess(p.args, p.returncode, b"", err)
    out, err = p.communicate(timeout=120)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


@pytest.mark.parametrize("command", ["info", "ls", "replay"])
def test_closed_pipe_ends_quietly(runs, in_tmp, command):
    d, _ = runs
    argv = [command, str(d / "gold.h5")] + (["-o", "r.h5", "-q", "--op", "aten.addmm*"]
                                            if command == "replay" else [])
    r = _cli(*argv, close_stdout=True)
    assert b"Traceback" not in r.stderr and b"BrokenPipe" not in r.stderr, r.stderr
    assert r.returncode == 141


def test_serve_names_the_missing_run_file(in_tmp, capsys):
    assert main(["serve", "--data", "data", "--run", "nope.h5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "accuracy serve: error: --run nope.h5: no such file"


def test_compare_to_an_existing_file_says_so(runs, in_tmp, capsys):
    d, _ = runs
    Path("taken").write_text("someone's notes")
    for extra in ([], ["--overwrite"]):
        code = main(["compare", "-m", str(d / "dev.h5"), "-g", str(d / "gold.h5"), "-o",
                     "taken", *extra])
        err = capsys.readouterr().err.strip()
        assert code == 2
        assert "taken is a file, not a report folder" in err and "Errno" not in err
        assert "\n" not in err
    assert Path("taken").read_text() == "someone's notes"


def test_op_patterns_take_the_names_users_type():
    """`--op addmm` means the aten op, every overload; globs and other namespaces as written."""
    from accuracy.patterns import op_matches

    assert op_matches("addmm", "aten.addmm.default")
    assert op_matches("aten.addmm", "aten.addmm.default")
    assert op_matches("aten.*norm*", "aten.native_layer_norm.default")
    assert not op_matches("mm", "aten.addmm.default")
    # DebugMode's and the profiler's C++ spelling names the same op
    assert op_matches("aten::addmm", "aten.addmm.default")
    assert not op_matches("aten::mm", "aten.addmm.default")
    assert not op_matches("addmm", "c10d.addmm_.default")
    assert op_matches("c10d.allreduce_", "c10d.allreduce_.default")
