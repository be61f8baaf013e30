"""A program compiled and run before the dumper started, recorded at a later step as it runs.

The issue's case: the 3-block model compiled with Inductor on CPU and warmed up (one step run
compiled) before any dumper, one matmul of `blocks.1.fc1` miscompiled +5% by a post-grad pass;
a later step is dumped and compared against the eager dump. Before the standing hooks its
region read `not-recorded` (BLIND) and no kernel was in the dump; the only remedy was a
recompilation at the dumped step.
"""

from __future__ import annotations

import pytest
import torch

from accuracy import dumper, load_dump, watch_compiled
from accuracy.compare import compare
from accuracy.dumper.compiled import launches, standing
from tests._support.miscompile import ScaleMatmul
from tests.dumper.compiled.test_watch import Net

pytestmark = pytest.mark.filterwarnings("ignore:Using `torch.compile")


def _frames() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["frames"].values())


def make_dumps(folder, fault: bool) -> dict:
    """Eager dump of the step; then the compiled model warmed up outside any dumper, and the
    next step dumped. The hooks are in before `torch.compile` runs, as a job that calls
    `accuracy.watch_compiled()` (or builds a PrecisionDebugger or a Monitor) first."""
    folder.mkdir()
    assert watch_compiled()
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    with dumper(folder / "eager.h5", mode="tensor"):
        net(x).sum().backward()
    net.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(net)
    miscompile = ScaleMatmul(torch.ops.aten.addmm.default, "blocks.1.fc1") if fault else None
    with torch._inductor.config.patch(post_grad_custom_post_pass=miscompile):
        compiled(x).sum().backward()  # the warm-up step: compiled here, no dumper
        net.zero_grad()
        frames = _frames()
        with dumper(folder / "compiled.h5", mode="tensor"):
            compiled(x).sum().backward()
    return {"eager": folder / "eager.h5", "compiled": folder / "compiled.h5",
            "compiled_frames": _frames() - frames, "folder": folder}


def test_a_program_compiled_before_the_dumper_is_recorded_without_recompiling(clean):
    d = load_dump(clean["compiled"])
    [region] = d.attrs["compiled_regions"]
    assert region["status"] == "recorded-compiled", region
    assert region["recompiles"] == [] and clean["compiled_frames"] == 0  # the warm program
    kernels = [r for r in d.records if r.op.startswith("inductor.")]
    assert {r.phase for r in kernels} == {"forward", "backward"}
    assert d.attrs["compiled_kernels_recorded"] == len(kernels) >= 8
    fc1 = [r for r in kernels if any(o["module"] == "Net.blocks.1.fc1"
                                     for o in r.extra["outputs"])]
    assert fc1 and all(r.source for r in fc1)  # origins, module and source, as compiled here


def test_the_clean_warm_program_against_eager_has_no_error_and_no_blind_line(clean, tmp_path):
    from accuracy.replay import replay

    replay(clean["compiled"], tmp_path / "replay.h5")
    rep = compare(clean["compiled"], clean["eager"], tmp_path / "replay.h5")
    assert rep.summary["counts"]["error"] == 0 and rep.culprit is None
    assert not rep.summary["blind"] and "BLIND" not in rep.format()


def test_the_miscompiled_kernel_of_the_warm_program_is_the_culprit_with_replay(fault, tmp_path):
    from accuracy.replay import replay

    replay(fault["compiled"], tmp_path / "replay.h5")
    rep = compare(fault["compiled"], fault["eager"], tmp_path / "replay.h5")
    cul = rep.culprit
    assert rep.summary["ranking"] == "local error (replay)"
    assert cul is not None and cul["op"].startswith("inductor.cpp_fused")
    row = load_dump(fault["compiled"]).record(cul["seq_my"])
    # the kernel holding blocks.1.fc1's scaled matmul (its first output is that module's)
    assert row.extra["outputs"][0]["module"] == "Net.blocks.1.fc1"
    assert not rep.summary["blind"]


def test_a_description_not_of_the_running_kernel_makes_the_region_blind(clean, tmp_path):
    """The kernels recorded are the kernels that run: a launch site whose registered
    description carries another source digest than the running module's definition is not
    recorded, and the region says why (BLIND), instead of writing another kernel's story."""
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    assert watch_compiled()
    torch._dynamo.reset()
    compiled = torch.compile(net)
    compiled(x).sum().backward()
    mine = [k for k in launches.KERNELS.values() if k.graph == "forward"][-1]
    kept, mine.src = mine.src, "0" * 16  # as if registered for another source
    try:
        with dumper(tmp_path / "d.h5", mode="statistics"):
            compiled(x).sum().backward()
    finally:
        mine.src = kept
        torch._dynamo.reset()
    d = load_dump(tmp_path / "d.h5")
    [region] = d.attrs["compiled_regions"]
    assert region["status"] == "not-recorded"
    assert mine.kernel in region["reason"] and "differs from the running definition" \
        in region["reason"]
    assert not any(r.op == f"inductor.{mine.kernel}" for r in d.records)
    rep = compare(tmp_path / "d.h5", clean["eager"])
    assert any(mine.kernel in line for line in rep.summary["blind"])


def test_without_the_standing_hooks_a_warm_program_stays_blind(tmp_path):
    """What the hooks change: the same warm-up without them leaves the region unseen."""
    standing.stop()
    torch._dynamo.reset()
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    compiled = torch.compile(net)
    compiled(x).sum().backward()
    with dumper(tmp_path / "d.h5", mode="statistics"):
        compiled(x).sum().backward()
    torch._dynamo.reset()
    [region] = load_dump(tmp_path / "d.h5").attrs["compiled_regions"]
    assert region["status"] == "not-recorded" and "before the dumper" in region["reason"]


def _module_hooks() -> set:
    from torch.nn.modules import module as m

    return {*m._global_forward_pre_hooks.values(), *m._global_forward_hooks.values()}


def test_ensure_costs_an_eager_job_nothing_and_hooks_the_next_compile(tmp_path):
    """What the debugger and the monitor call each step: dynamo being loaded (transformers
    loads it in every eager forward) puts no global module hook in, so the eager steps pay
    nothing; the next compile starts with the hooks in, so its program is recorded by a later
    dumper as it runs, without a recompile."""
    from accuracy.dumper import scope

    standing.stop()
    scope._KEEP[0] = False  # as in a fresh process: no global hook kept yet (the compile below
    scope._remove_hooks()   # keeps them again)
    torch._dynamo.reset()
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    assert standing.ensure() is False
    net(x).sum().backward()  # eager steps
    assert not standing.watching() and scope._global_pre not in _module_hooks()
    compiled = torch.compile(net)
    compiled(x).sum().backward()  # compiled at its first call
    assert standing.watching() and scope._global_pre in _module_hooks()
    frames = _frames()
    with dumper(tmp_path / "d.h5", mode="statistics"):
        compiled(x).sum().backward()
    torch._dynamo.reset()
    assert _frames() == frames
    d = load_dump(tmp_path / "d.h5")
    [region] = d.attrs["compiled_regions"]
    assert region["status"] == "recorded-compiled", region
    assert any(r.op.startswith("inductor.") for r in d.records)
