"""The monitor on 2 gloo CPU ranks with DDP: a file per rank, and with reduce=True one file of
figures reduced across ranks."""

from __future__ import annotations

import sys
import textwrap

import numpy as np

import accuracy.monitor as am
from tests._support.ranks import run_ranks

WORKER = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    import accuracy.monitor as am
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model[1].add_module("spare", nn.Identity())  # never called: measured by no rank
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    def step(x, y):
        opt.zero_grad(); loss = nn.functional.cross_entropy(ddp(x), y); loss.backward()
        opt.step(); return loss
    out = sys.argv[1]
    kw = dict(snapshot_every=None)
    local = am.watch(step, model, opt, path=out + "/local_{rank}.monitor.h5", **kw)
    both = am.watch(local, model, opt, path=out + "/reduced.monitor.h5", reduce=True, **kw)
    g = torch.Generator().manual_seed(10 + rank)  # each rank its own data
    for i in range(3):
        both(torch.randn(4, 8, generator=g) * (1 + rank), torch.randint(0, 4, (4,), generator=g))
    local.monitor.close()
    both.monitor.close()
    dist.destroy_process_group()
    # The files are closed: leave before C++ teardown. With DDP and two monitors, about one
    # run in 15 aborted after Python had finished ("terminate called without an active
    # exception", no Python frame; gloo's objects destroyed at exit), which tests nothing of ours.
    sys.stdout.flush()
    os._exit(0)
""")


def test_files_per_rank_and_reduced_across_ranks(tmp_path):
    run_ranks([[sys.executable, "-c", WORKER, str(tmp_path)]] * 2, timeout=180)
    r0, r1 = (am.read_series(tmp_path / f"local_{r}.monitor.h5") for r in (0, 1))
    assert (r0.attrs["rank"], r1.attrs["rank"]) == (0, 1)
    a0, a1 = r0.module["act_norm"], r1.module["act_norm"]
    assert not np.allclose(a0, a1)  # each rank measured its own activations
    assert np.allclose(r0.param["grad_norm"], r1.param["grad_norm"])  # all-reduced gradients
    assert sorted(p.name for p in tmp_path.glob("reduced*")) == ["reduced.monitor.h5"]
    red = am.read_series(tmp_path / "reduced.monitor.h5")  # the same steps, reduced
    assert red.attrs["reduced"] in (True, 1)
    m = red.module
    assert np.allclose(m["act_norm"], np.sqrt(a0 ** 2 + a1 ** 2), equal_nan=True)
    assert np.allclose(m["act_max"], np.fmax(r0.module["act_max"], r1.module["act_max"]),
                       equal_nan=True)
    assert np.allclose(m["act_min"], np.fmin(r0.module["act_min"], r1.module["act_min"]),
                       equal_nan=True)
    assert np.allclose(red.loss, (r0.loss + r1.loss) / 2)
    assert np.allclose(red.param["grad_norm"], r0.param["grad_norm"])
    # a module no rank measured stays "not measured" (NaN), not a norm of 0 and counts of 0
    spare = red.module_names.index("1.spare")
    assert np.isnan(r0.module["act_norm"][:, spare]).all()
    for fig in ("act_norm", "act_min", "act_max", "act_nan", "act_inf"):
        assert np.isnan(m[fig][:, spare]).all(), fig
