"""Worker for tests/scenarios/test_multirank.py: one gloo rank running a scenario inside the dumper.

Run as `python -m tests._support.multirank_worker SCENARIO[,SCENARIO...] OUT_DIR` under a
launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (the test starts one process
per rank).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from accuracy.dumper.core import dumper


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data shard
    return torch.randn(4, 16, generator=g), torch.randint(0, 8, (4,), generator=g)


def ddp(out: str, fault: bool, profile: str = "exact") -> dict:
    """One DDP step; with `fault`, rank 1 runs under `sim` with a bias in its first addmm
    (with another `profile`, rank 0 runs under that profile too, without a fault)."""
    from contextlib import nullcontext

    from torch.nn.parallel import DistributedDataParallel as DDP

    from accuracy.device_backend import sim

    rank = dist.get_rank()
    model = DDP(_model())
    x, y = _batch(rank)
    ctx = sim(profile=profile, faults=[sim.fault("aten.addmm.default", kind="bias", value=0.05,
                                                  occurrence=0)]) if fault and rank == 1 \
        else sim(profile=profile) if profile != "exact" else nullcontext()
    with ctx, dumper(os.path.join(out, "run_{rank}.h5"), overwrite=True):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
    return {"grad": model.module[0].weight.grad.flatten().tolist()}


def ddp_monitor_one_rank(out: str) -> dict:
    """DDP under the monitor where only rank 1's loss spikes (its step returns the loss times
    1e3 at step 6; gradients unchanged): the losses of a bare run of the same steps first, then
    the monitored run's, and each rank's captures."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import accuracy.monitor as am

    rank = dist.get_rank()
    x, y = _batch(rank)

    def run(monitored: bool) -> tuple[list[float], list[int]]:
        model = DDP(_model())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x: torch.Tensor, y: torch.Tensor, mult: float) -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss.detach() * mult

        if monitored:
            step = am.watch(step, model, opt, snapshot_every=2,
                            path=os.path.join(out, f"m_{rank}.monitor.h5"))
        losses = [float(step(x, y, 1e3 if rank == 1 and i == 6 else 1.0)) for i in range(8)]
        caps = [c.step for c in step.monitor.captures] if monitored else []
        return losses, caps

    bare, _ = run(False)
    losses, caps = run(True)
    return {"bare": bare, "monitored": losses, "captures": caps}


def functional(out: str) -> dict:
    import torch.distributed._functional_collectives as fc

    rank = dist.get_rank()
    x = torch.arange(6, dtype=torch.float32) + 10 * rank
    with dumper(os.path.join(out, "run_{rank}.h5"), overwrite=True):
        y = fc.all_reduce(x * 2, "sum", dist.group.WORLD)
        z = (y + 1).sum()
        buf = x.clone()
        dist.all_reduce(buf)
        gathered = [torch.empty(6) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, x)
    return {"y": y.tolist(), "z": float(z), "buf": buf.tolist(),
            "gathered": [g.tolist() for g in gathered]}


def dtensor(out: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    with dumper(os.path.join(out, "run_{rank}.h5"), overwrite=True):
        m = _model()
        parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        y = m(_batch(0)[0])
        y.sum().backward()
    return {"y": y.full_tensor().tolist() if hasattr(y, "full_tensor") else y.tolist()}


def fsdp(out: str) -> dict:
    """FSDP2: all-gathers of parameters, reduce-scatters of gradients, storage freed by resize."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    m = _model()
    for layer in (m[0], m[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    with dumper(os.path.join(out, "run_{rank}.h5"), overwrite=True):
        m(_batch(dist.get_rank())[0]).sum().backward()
    return {"grad": m[0].weight.grad.to_local().flatten().tolist()}


def ranks_filter(out: str) -> dict:
    with dumper(os.path.join(out, "run_{rank}.h5"), overwrite=True, ranks=[1]) as d:
        t = torch.ones(3) * (dist.get_rank() + 1)
        dist.all_reduce(t)
    return {"active": d.active, "t": t.tolist()}


def _ln_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 8))


def fsdp_ln(out: str, fault: bool, size: float = 0.05, profile: str = "exact") -> dict:
    """FSDP2 over a model with a LayerNorm; with `fault`, rank 1's layer norm is `size` off
    (both ranks under `profile`)."""
    from contextlib import nullcontext

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from accuracy.device_backend import sim

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    m = _ln_model()
    for layer in (m[0], m[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    faults = [sim.fault("aten.native_layer_norm.default", kind="bias", value=size,
                        occurrence=0)] if fault and dist.get_rank() == 1 else []
    ctx = sim(profile=profile, faults=faults) if faults or profile != "exact" else nullcontext()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False)  # steps on DTensors
    with ctx, dumper(os.path.join(out, "x_{rank}.h5"), overwrite=True):
        m(_batch(dist.get_rank())[0]).sum().backward()
        opt.step()
    return {}


def fsdp_overflow(out: str) -> dict:
    """FSDP2 with AdamW on DTensors under check_overflow; rank 1's first layer overflows in
    forward (a hook scales it to inf), its gradients reach rank 0 through the reduce-scatter."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    m = _ln_model()
    for layer in (m[0], m[3]):  # gathered parameters kept from forward to backward
        fully_shard(layer, mesh=mesh, reshard_after_forward=False)
    fully_shard(m, mesh=mesh, reshard_after_forward=False)
    boom = {"on": True}
    if dist.get_rank() == 1:
        m[2].register_forward_hook(lambda mod, i, o: o * 1e39 if boom["on"] else o)  # inf
    with dumper(os.path.join(out, "s_{rank}.h5"), overwrite=True, mode="statistics"):
        m(_batch(dist.get_rank())[0]).sum().backward()  # for the offline scan
    m.zero_grad()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)  # zeros_like(DTensor) for its state
    with dumper(os.path.join(out, "o_{rank}.h5"), overwrite=True, check_overflow=True,
                overflow_nums=-1) as d:  # checking goes on through the optimizer
        for step in range(3):  # clean, the overflow, then a step from the NaN it left
            boom["on"] = step == 1
            m(_batch(dist.get_rank())[0]).sum().backward()
            opt.step()
            opt.zero_grad()
            d.step()
    return {}


class _PassThrough(TorchDispatchMode):
    """A dispatch mode that changes nothing: the monitor's reductions then run with Python
    dispatch off, as under a dumper or `sim`."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        return func(*args, **(kwargs or {}))


def _monitored_steps(m: nn.Module, out: str, x: torch.Tensor, last_under_mode: bool = False
                     ) -> Callable[[torch.Tensor], torch.Tensor]:
    """Three AdamW steps of `m` on `x` under the monitor (m_<rank>.monitor.h5); the step.
    `last_under_mode`: the third inside a dispatch mode (both of the monitor's paths)."""
    import accuracy.monitor as am

    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = m(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    watched = am.watch(step, m, opt, path=os.path.join(out, f"m_{dist.get_rank()}.monitor.h5"))
    for i in range(3):
        if last_under_mode and i == 2:
            with _PassThrough():
                watched(x)
        else:
            watched(x)
    watched.monitor.close()
    return step


def fsdp_steps(out: str) -> dict:
    """Three FSDP2 SGD steps in one statistics dump, and the L2 norm of the first layer's
    full weight before each step's forward (what its addmm reads)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.utils._python_dispatch import _disable_current_modes

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    m = _model()
    for layer in (m[0], m[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    norms = []
    with dumper(os.path.join(out, "s_{rank}.h5"), overwrite=True, mode="statistics") as d:
        for _ in range(3):
            with _disable_current_modes(), torch.no_grad():  # not recorded
                norms.append(float(m[0].weight.full_tensor().norm()))
            m(_batch(dist.get_rank())[0]).sum().backward()
            opt.step()
            opt.zero_grad()
            d.step()
    return {"norms": norms}


def fsdp_monitor(out: str) -> dict:
    """FSDP2 with AdamW under the monitor: snapshots and figures of DTensor parameters,
    gradients and optimizer states, three steps."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    m = _ln_model()
    for layer in (m[0], m[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    _monitored_steps(m, out, _batch(dist.get_rank())[0])
    return {}


def fsdp_live(out: str) -> dict:
    """FSDP2 over the LayerNorm model under `live_check` (no dumper): what it judged and
    skipped, per call, for the test to read."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from accuracy.live import live_check

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    m = _ln_model()
    for layer in (m[0], m[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False)
    with live_check() as chk:
        for _ in range(2):  # the second step reuses the buffers FSDP2 freed with resize_(0)
            m(_batch(dist.get_rank())[0]).sum().backward()
            opt.step()
            opt.zero_grad()
    return {"counts": {str(k): v for k, v in chk.counts().items()},
            "errors": [r.describe() for r in chk.errors()],
            "ops": [{"seq": r.seq, "op": r.op, "status": r.status, "reason": r.reason,
                     "verdict": None if r.verdict is None else str(r.verdict)}
                    for r in chk.results]}


class _Scale(nn.Module):
    def __init__(self, s: float) -> None:
        super().__init__()
        self.s = s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.s


def tp(out: str, profile: str | None, scale: float) -> dict:
    """Tensor parallel (Colwise then Rowwise), optionally under `sim(profile)`; `scale`
    multiplies the hidden activations (a different scalar argument than golden's 1.0)."""
    from contextlib import nullcontext

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from accuracy.device_backend import sim

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), _Scale(scale), nn.Linear(32, 8))
    parallelize_module(m, mesh, {"0": ColwiseParallel(), "3": RowwiseParallel()})
    ctx = sim(profile=profile) if profile else nullcontext()
    with ctx, dumper(os.path.join(out, "run_{rank}.h5"), overwrite=True):
        y = m(_batch(0)[0])
        y.sum().backward()
    return {"y": y.tolist()}


def tp_monitor(out: str) -> dict:
    """Tensor parallel with AdamW under the monitor (DTensor parameters and module outputs)
    and then check_overflow, three steps and one."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    parallelize_module(m, mesh, {"0": ColwiseParallel(use_local_output=False),
                                 "2": RowwiseParallel(use_local_output=False)})  # DTensor loss
    step = _monitored_steps(m, out, _batch(0)[0], last_under_mode=True)
    with dumper(os.path.join(out, "o_{rank}.h5"), overwrite=True, check_overflow=True,
                overflow_nums=-1):
        step(_batch(0)[0])
    return {}


SCENARIOS = {
    "functional": functional, "dtensor": dtensor, "ranks": ranks_filter, "fsdp": fsdp,
    "ddp-golden": lambda out: ddp(out, fault=False), "ddp-fault": lambda out: ddp(out, fault=True),
    "ddp-fp16": lambda out: ddp(out, fault=True, profile="fp16-cube"),
    "fsdp-gold-a": lambda out: fsdp_ln(out, fault=False),
    "fsdp-gold-b": lambda out: fsdp_ln(out, fault=False),
    "fsdp-fault": lambda out: fsdp_ln(out, fault=True),
    "fsdp-fault-bf16": lambda out: fsdp_ln(out, fault=True, size=0.01, profile="bf16"),
    "fsdp-live": fsdp_live,
    "fsdp-overflow": fsdp_overflow,
    "fsdp-monitor": fsdp_monitor,
    "fsdp-steps": fsdp_steps,
    "tp-monitor": tp_monitor,
    "ddp-monitor-one-rank": ddp_monitor_one_rank,
    "tp-gold": lambda out: tp(out, None, 1.0),
    "tp-sim": lambda out: tp(out, "fp16-cube", 1.0),
    "tp-scale": lambda out: tp(out, None, 1.05),
}


def main() -> None:
    """argv: comma-separated scenarios, output folder (each scenario gets a subfolder)."""
    names, root = sys.argv[1].split(","), sys.argv[2]
    dist.init_process_group("gloo")
    try:
        for name in names:
            out = os.path.join(root, name)
            os.makedirs(out, exist_ok=True)
            result = SCENARIOS[name](out)
            with open(os.path.join(out, f"result_{os.environ['RANK']}.json"), "w") as f:
                json.dump(result, f)
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
