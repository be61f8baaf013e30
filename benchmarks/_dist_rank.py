"""One gloo rank of bench_detection.py's distributed families (FSDP2, tensor parallel).

Run as `python benchmarks/_dist_rank.py PLAN.json` under a launcher that sets RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT (bench_detection.py starts one process per rank).
PLAN.json lists the runs: {"family", "profile" (or null: CPU fp32), "fault" (or null:
{"rank", "op", "kind", "value", "occurrence"}), "out"}. Every run dumps one step of its
family's model to `out/run_{rank}.h5`; the ranks meet at a barrier after each run.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from accuracy.device_backend import sim  # noqa: E402
from accuracy.dumper import dumper  # noqa: E402


def _batch(rank: int, shard: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + (rank if shard else 0))
    return torch.randn(8, 32, generator=g)


def fsdp_model(mesh) -> nn.Module:
    """Linear-LayerNorm-GELU-Linear-GELU-Linear, each linear its own FSDP2 unit."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.GELU(), nn.Linear(64, 64),
                      nn.GELU(), nn.Linear(64, 8))
    for i in (0, 3, 5):
        fully_shard(m[i], mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def tp_model(mesh) -> nn.Module:
    """Linear (ColwiseParallel) - GELU - Linear (RowwiseParallel) - LayerNorm."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32), nn.LayerNorm(32))
    parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return m


def run(plan: dict, mesh, rank: int) -> None:
    family = plan["family"]
    m = fsdp_model(mesh) if family == "fsdp2" else tp_model(mesh)
    x = _batch(rank, shard=family == "fsdp2")  # TP ranks see the same batch
    fault = plan.get("fault")
    faults = []
    if fault and fault["rank"] == rank:
        faults = [sim.fault(fault["op"], kind=fault["kind"], value=fault["value"],
                            occurrence=fault.get("occurrence", 0))]
    profile = plan.get("profile")
    ctx = sim(profile=profile or "exact", faults=faults) if (profile or faults) \
        else nullcontext()
    with ctx, dumper(os.path.join(plan["out"], "run_{rank}.h5"), overwrite=True):
        m(x).float().pow(2).mean().backward()


def main() -> None:
    plans = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        rank = dist.get_rank()
        for plan in plans:
            os.makedirs(plan["out"], exist_ok=True)
            run(plan, mesh, rank)
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
