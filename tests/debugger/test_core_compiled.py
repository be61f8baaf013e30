"""PrecisionDebugger on a compiled training loop: config.json selects step 5 of 10, the model
was compiled at step 0 (long before the selected step), and step 5's dump holds the kernels of
the program that runs, without recompiling it there.

Before, nothing was installed on unselected steps, so the program compiled at step 0 had no
hook lines and step 5's region read `not-recorded` (BLIND): the debugger could only be told to
select the first step or to reset dynamo before the selected one.
"""

from __future__ import annotations

import json

import pytest
import torch

from accuracy import PrecisionDebugger, load_dump
from accuracy.compare import compare
from accuracy.replay import replay
from tests._support.miscompile import ScaleMatmul, inductor_cache
from tests.dumper.compiled.test_watch import Net

pytestmark = pytest.mark.filterwarnings("ignore:Using `torch.compile")

STEP = 5


def _loop(folder, compiled: bool, fault: bool = False):
    """Ten SGD steps driven by a PrecisionDebugger whose config.json selects step 5."""
    cfg = {"task": "tensor", "dump_path": str(folder), "rank": [], "step": [STEP],
           "level": "L1", "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}
    (folder.parent / f"{folder.name}.json").write_text(json.dumps(cfg))
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = Net()
    model = torch.compile(net) if compiled else net
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    dbg = PrecisionDebugger(config_path=folder.parent / f"{folder.name}.json")
    from torch._dynamo.utils import counters

    frames = {}
    miscompile = ScaleMatmul(torch.ops.aten.addmm.default, "blocks.1.fc1") if fault else None
    with torch._inductor.config.patch(post_grad_custom_post_pass=miscompile):
        for i in range(10):
            g = torch.Generator().manual_seed(i)
            x = torch.randn(4, 8, generator=g)
            frames[i] = sum(counters["frames"].values())
            dbg.start(model)
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            dbg.stop()
            dbg.step()
    torch._dynamo.reset()
    return folder / f"step{STEP}" / "rank0" / "dump.h5", frames


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    with inductor_cache(tmp_path_factory.mktemp("debugger")) as folder:
        eager, _ = _loop(folder / "eager", compiled=False)
        clean, frames = _loop(folder / "clean", compiled=True)
        fault, _ = _loop(folder / "fault", compiled=True, fault=True)
        yield {"eager": eager, "clean": clean, "fault": fault, "frames": frames,
               "folder": folder}


def test_the_selected_step_records_the_kernels_of_the_program_compiled_at_step_0(runs):
    d = load_dump(runs["clean"])
    [region] = d.attrs["compiled_regions"]
    assert region["status"] == "recorded-compiled" and region["steps"] == [STEP]
    assert d.attrs["compiled_kernels_recorded"] >= 8
    assert {r.step for r in d.records} == {STEP}
    frames = runs["frames"]
    assert frames[1] == frames[STEP] == frames[STEP + 1]  # compiled once, at step 0


def test_clean_compiled_step_5_against_eager_step_5_has_no_error_and_no_blind(runs):
    rep = compare(runs["clean"], runs["eager"], replay(runs["clean"],
                                                       runs["folder"] / "clean_replay.h5").path)
    assert rep.summary["counts"]["error"] == 0 and rep.culprit is None
    assert not rep.summary["blind"] and "BLIND" not in rep.format()


def test_the_miscompiled_kernel_is_the_culprit_of_step_5_with_replay(runs):
    rep = compare(runs["fault"], runs["eager"], replay(runs["fault"],
                                                       runs["folder"] / "fault_replay.h5").path)
    cul = rep.culprit
    assert cul is not None and cul["op"].startswith("inductor.cpp_fused")
    row = load_dump(runs["fault"]).record(cul["seq_my"])
    assert row.extra["outputs"][0]["module"] == "Net.blocks.1.fc1"
    assert not rep.summary["blind"]
