"""Ascend's guide (docs/ascend-guide.md) runs as written: its snippets verbatim, and its op-level
flow: compare, pick an op, extract it (and copy its group as h5copy does), load just that op in
load mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch

from accuracy import dumper, load_dump
from accuracy.cli import main
from accuracy.device_backend import sim
from accuracy.examples import lm_step, tiny_lm
from tests._support.guide import DOC, guide_names, python_blocks
from tests._support.lm_dumps import addmm_fault


def _run_snippet(code: str, names: dict) -> None:
    assert "torch.utils.dumper" not in code
    exec(compile(code, str(DOC), "exec"), dict(names))  # noqa: S102 - the docs' own code


# -- the guide's three snippets, verbatim from docs/ascend-guide.md ---


def test_docs_guide_snippets_run_as_written(in_tmp):
    blocks = python_blocks(DOC.read_text())
    dump_block, load_block, overflow_block = blocks[:3]
    assert 'dumper(use_dump=True, dump_path="./model_gpu.h5")' in dump_block

    _run_snippet(dump_block, guide_names())
    with load_dump("model_gpu.h5") as d:
        assert d.attrs["complete"] and d.attrs["mode"] == "tensor"
        assert {r.phase for r in d.records} == {"forward", "backward"}

    _run_snippet(load_block, guide_names())
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
        _run_snippet(overflow_block, guide_names(scale=3e38))
    files = os.listdir("overflow_dump")
    assert files == ["dump_0.h5"]
    with load_dump("overflow_dump/dump_0.h5") as d:
        events = d.attrs["overflow"]["events"]
        assert events and events[0]["op"] == "aten.addmm.default"
        assert len(d.records) >= 1



# -- compare, pick an op, extract (and h5copy), load just that op ---


def test_extracted_ops_are_valid_load_files(lm_runs, in_tmp, capsys):
    d, batch = lm_runs
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
        with sim(profile="exact", faults=[addmm_fault()]):
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
    blocks = [b for b in python_blocks(DOC.read_text()) if "torch.utils.dumper(" in b]
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

