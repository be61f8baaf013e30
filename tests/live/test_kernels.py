"""The live check on a compiled model checks the compiled program that runs in the job.

The issue's case (3 blocks of LayerNorm, Linear, GELU under Inductor on CPU, one matmul of
`blocks.1.fc1` miscompiled +5% by a post-grad pass), compiled and warmed up before the live
check, as every training job is. Before, dynamo declined every frame under the check's
dispatch mode: the region ran its eager code (`ran-eager`, BLIND) and the miscompiled kernel
was never seen. Now the check's loop runs compiled code, and each kernel launch is checked
against its own ATen ops re-run on the reference.
"""

from __future__ import annotations

import pytest
import torch

from accuracy import live_check, watch_compiled
from accuracy.live import LiveCheckError
from tests._support.miscompile import ScaleMatmul, inductor_cache
from tests.dumper.compiled.test_watch import Net

pytestmark = pytest.mark.filterwarnings("ignore:Using `torch.compile")


def _frames() -> int:
    from torch._dynamo.utils import counters

    return sum(counters["frames"].values())


def _run(folder, fault: bool) -> dict:
    """The model compiled (hook lines in: `watch_compiled()` first) and warmed up with no
    check, then one step under `live_check`, and one under `live_check(stop_on="error")`."""
    folder.mkdir()
    assert watch_compiled()
    torch._dynamo.reset()
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    compiled = torch.compile(net)
    miscompile = ScaleMatmul(torch.ops.aten.addmm.default, "blocks.1.fc1") if fault else None
    stopped = None
    with torch._inductor.config.patch(post_grad_custom_post_pass=miscompile):
        compiled(x).sum().backward()  # the warm-up step: compiled here, no check
        net.zero_grad()
        frames = _frames()
        with live_check() as lc:
            compiled(x).sum().backward()
        frames = _frames() - frames
        net.zero_grad()
        try:
            with live_check(stop_on="error"):
                compiled(x).sum().backward()
        except LiveCheckError as e:
            stopped = e
    torch._dynamo.reset()
    return {"check": lc, "frames": frames, "stopped": stopped}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """This module's Inductor cache (tests/_support/miscompile.py)."""
    with inductor_cache(tmp_path_factory.mktemp("live_kernels")) as folder:
        yield folder


@pytest.fixture(scope="module")
def clean(cache):
    return _run(cache / "clean", False)


@pytest.fixture(scope="module")
def fault(cache):
    return _run(cache / "fault", True)


def _kernels(lc) -> list:
    return [r for r in lc.results if r.op.startswith("inductor.")]


def test_a_program_compiled_before_the_check_is_checked_as_compiled(clean):
    lc = clean["check"]
    assert clean["frames"] == 0  # the warm program ran: nothing compiled under the check
    [region] = lc.report()["compiled_regions"]
    assert region["status"] == "recorded-compiled", region
    assert region["recompiles"] == []
    kernels = _kernels(lc)
    assert len(kernels) >= 8 and {r.phase for r in kernels} == {"forward", "backward"}
    assert f"all {len(kernels)} kernel launch(es) judged live" in region["reason"]
    assert all(r.verdict == "pass" for r in kernels), [r.describe() for r in kernels]
    assert all(r.module.startswith("Net") and r.source for r in kernels)
    assert lc.errors() == [] and "BLIND" not in lc.text()
    assert clean["stopped"] is None  # stop_on="error" lets the clean program run


def test_the_miscompiled_kernel_is_named_by_the_check(fault):
    lc = fault["check"]
    assert fault["frames"] == 0
    [bad] = lc.errors()
    assert bad.op.startswith("inductor.cpp_fused") and bad.module == "Net.blocks.1.fc1"
    worst = max(o["error_ratio"] for o in bad.outputs if o.get("error_ratio") is not None)
    assert worst > 1e3
    # an output whose ops come from the graph after the pass is not judged, and says so
    assert any(o.get("not_judged") for o in bad.outputs)
    assert bad.describe() in lc.text()
    # stop_on="error" stops the user's step at that kernel, from inside the compiled program
    assert fault["stopped"] is not None and fault["stopped"].result.op == bad.op


def test_kernels_the_check_cannot_judge_make_their_region_blind(cache, monkeypatch):
    """A dropout kernel drawing with Inductor's own generator draws what no reference can
    redraw: its launch is not judged, and the region reads `not-checked`, said `BLIND:`
    first, never a bare pass."""
    from accuracy.dumper.compiled import standing

    class Drop(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.dropout(self.fc(x).relu(), 0.5, training=True) * 2

    standing.stop()  # the hooks again, with the program's own generator
    monkeypatch.setenv("ACCURACY_COMPILED_RANDOM", "inductor")
    try:
        assert watch_compiled()
        torch._dynamo.reset()
        torch.manual_seed(0)
        m, x = torch.compile(Drop()), torch.randn(4, 8)
        m(x).sum().backward()
        with live_check() as lc:
            m(x).sum().backward()
    finally:
        torch._dynamo.reset()
        standing.stop()
        monkeypatch.delenv("ACCURACY_COMPILED_RANDOM")
        assert watch_compiled()
    [region] = lc.report()["compiled_regions"]
    assert region["status"] == "not-checked", region
    assert "not judged live" in region["reason"] and "rng op" in region["reason"]
    judged = [r for r in _kernels(lc) if r.verdict is not None]
    assert judged and len(judged) < len(_kernels(lc))  # the others are checked
    lines = lc.text().splitlines()
    assert lines[1].startswith("  BLIND: compiled region ") and "not-checked" in lines[1]
    assert lc.notes and lc.notes[0].startswith("compiled region ")


def test_a_program_compiled_before_the_hooks_is_said_blind(cache):
    """Compiled without the hook lines, its kernels cannot be checked: BLIND, not a pass."""
    from accuracy.dumper.compiled import standing

    standing.stop()
    try:
        torch._dynamo.reset()
        torch.manual_seed(0)
        compiled, x = torch.compile(Net()), torch.randn(4, 8)
        compiled(x).sum().backward()
        with live_check() as lc:
            compiled(x).sum().backward()
    finally:
        torch._dynamo.reset()
        assert watch_compiled()
    [region] = lc.report()["compiled_regions"]
    assert region["status"] == "not-recorded" and _kernels(lc) == []
    assert lc.text().splitlines()[1].startswith("  BLIND: ")
