"""The monitor's capture of a compiled model's flagged step records the program that runs.

The model is compiled at the job's first step, long before a trigger flags step 6; the capture
re-runs step 6 from the snapshot of step 4 with the dumper on. Before, that program had no hook
lines (nothing of ours was installed when it compiled): the capture's dump held no kernel, its
region read `not-recorded`, and a miscompiled kernel could not be named.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import accuracy.monitor as am
from accuracy import load_dump
from tests._support.miscompile import ScaleMatmul, inductor_cache
from tests.dumper.compiled.test_watch import Net

pytestmark = pytest.mark.filterwarnings("ignore:Using `torch.compile")

FLAGGED = 6


def _run(folder: Path, fault: bool):
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = Net()
    model = torch.compile(net)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)

    def train_step(x):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    step = am.watch(train_step, net, opt, path=folder / "run.monitor.h5", snapshot_every=4,
                    triggers=[am.Predicate(lambda s: s.step == FLAGGED, "flagged")])
    from torch._dynamo.utils import counters

    miscompile = ScaleMatmul(torch.ops.aten.addmm.default, "blocks.1.fc1") if fault else None
    with torch._inductor.config.patch(post_grad_custom_post_pass=miscompile):
        for i in range(FLAGGED + 1):
            if i == 2:  # the monitor's hooks recompile it once, at step 1 (figures.py)
                frames = sum(counters["frames"].values())
            step(torch.randn(4, 8, generator=torch.Generator().manual_seed(i)))
    step.monitor.close()
    torch._dynamo.reset()
    return step.monitor, sum(counters["frames"].values()) - frames


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    with inductor_cache(tmp_path_factory.mktemp("monitor")) as folder:
        yield {"clean": _run(folder, False), "fault": _run(folder / "f", True)}


def _summary(cap) -> dict:
    return json.loads((Path(cap.folder) / "report" / "summary.json").read_text())


def test_the_capture_records_the_kernels_of_the_program_compiled_at_the_first_step(runs):
    mon, recompiled = runs["clean"]
    (cap,) = mon.captures
    assert cap.step == FLAGGED and cap.exact is True and recompiled == 0
    d = load_dump(Path(cap.folder) / "device.h5")
    [region] = d.attrs["compiled_regions"]
    assert region["status"] == "recorded-compiled", region
    assert d.attrs["compiled_kernels_recorded"] >= 8
    assert not cap.culprit and not _summary(cap)["blind"]


def test_the_capture_names_the_miscompiled_kernel(runs):
    mon, recompiled = runs["fault"]
    (cap,) = mon.captures
    assert cap.exact is True and recompiled == 0
    assert cap.culprit is not None and cap.culprit["op"].startswith("inductor.cpp_fused"), \
        cap.messages
    assert cap.culprit["module"] == "Net.blocks.1.fc1" and cap.culprit["phase"] == "forward"
    assert not _summary(cap)["blind"]
