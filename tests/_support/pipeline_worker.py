"""Worker for tests/scenarios/test_pipeline.py: one gloo rank of a two-stage pipeline (or a
point-to-point exchange, or DDP around a compiled module) recorded by the dumper, every
scenario in one process.

Run as `python -m tests._support.pipeline_worker SCENARIO[,SCENARIO...] OUT_DIR` under a
launcher that sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (tests/_support/ranks.py).
The process group times out after 30 s: a hang fails the rank, and the launcher kills the
ranks' process groups when they outlive its wait.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from accuracy.device_backend import sim
from accuracy.dumper.core import dumper

MICROBATCHES = 2


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(),
                         nn.Linear(32, 8))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 16, generator=g), torch.randint(0, 8, (8,), generator=g)


def _device(rank: int, fault_rank: int | None, occurrence: int, module: str | None) -> object:
    """The device side: `sim` bf16, with a 5% bias on one addmm of `fault_rank` (in modules
    matching `module`)."""
    faults = [sim.fault("aten.addmm.default", kind="bias", value=0.05, occurrence=occurrence,
                        module=module)] if rank == fault_rank else []
    return sim(profile="bf16", faults=faults)


def _step(out: str, sched: Any, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          device: bool, fault_rank: int | None = None, occurrence: int = 0,
          module: str | None = None) -> None:
    """One schedule step and the optimizer's, inside the dumper: stage 0 feeds the input, the
    last stage the target; golden on plain CPU, the device side under `sim` (`_device`)."""
    rank = dist.get_rank()
    ctx = _device(rank, fault_rank, occurrence, module) if device else nullcontext()
    with ctx, dumper(os.path.join(out, "run_{rank}.h5"), overwrite=True):
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=y)
        opt.step()


def pipeline(out: str, schedule: str, device: bool, fault_rank: int | None = None,
             occurrence: int = 0, module: str | None = None) -> dict:
    """One training step of a two-stage pipeline (manual PipelineStage, 2 micro-batches,
    AdamW) inside the dumper; golden on plain CPU, or the device side under sim."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank = dist.get_rank()
    full = _model()
    mod = nn.Sequential(*list(full)[:2]) if rank == 0 else nn.Sequential(*list(full)[2:])
    stage = PipelineStage(mod, rank, 2, torch.device("cpu"))
    kind = ScheduleGPipe if schedule == "gpipe" else Schedule1F1B
    sched = kind(stage, n_microbatches=MICROBATCHES,
                 loss_fn=lambda o, y: nn.functional.cross_entropy(o, y))
    opt = torch.optim.AdamW(mod.parameters(), lr=1e-3)
    x, y = _data()
    _step(out, sched, opt, x, y, device, fault_rank, occurrence, module)
    return {"weight": mod[0].weight.flatten().tolist()}


def _gpt2_stage(rank: int) -> nn.Module:
    """Half of a tiny random-init `transformers` GPT-2 (2 blocks, no dropout): stage 0 the
    embeddings and block 0, stage 1 block 1, the final norm and the LM head."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    lm = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                    n_head=2, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0,
                                    embd_pdrop=0.0, attn_pdrop=0.0,
                                    attn_implementation="eager"))
    t = lm.transformer

    class First(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe, self.block = t.wte, t.wpe, t.h[0]

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(ids.shape[1], device=ids.device)
            return self.block(self.wte(ids) + self.wpe(pos))

    class Last(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block, self.ln_f, self.lm_head = t.h[1], t.ln_f, lm.lm_head

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return self.lm_head(self.ln_f(self.block(h)))

    return First() if rank == 0 else Last()


def gpt2(out: str, device: bool, fault_rank: int | None = None) -> dict:
    """A tiny GPT-2 split by hand into two manual PipelineStages, GPipe, 2 micro-batches,
    AdamW; the fault a 5% bias on the stage's attention projection (`c_attn`, an addmm) in
    micro-batch 0 (stage 1 runs a shape-inference pass first: its occurrence 1)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    rank = dist.get_rank()
    mod = _gpt2_stage(rank)
    stage = PipelineStage(mod, rank, 2, torch.device("cpu"))
    sched = ScheduleGPipe(stage, n_microbatches=MICROBATCHES,
                          loss_fn=lambda o, y: nn.functional.cross_entropy(o.flatten(0, 1),
                                                                           y.flatten()))
    opt = torch.optim.AdamW(mod.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(1))
    _step(out, sched, opt, ids, ids, device, fault_rank, rank, "*.c_attn")
    return {}


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def front_end(out: str, device: bool, fault_rank: int | None = None) -> dict:
    """The `pipeline(...)`/`SplitPoint` front end: the model traced and split before `b`,
    each rank builds its stage; GPipe, 2 micro-batches. The fault (on rank 0's one addmm
    per forward) is in micro-batch 1: its stage runs no shape-inference pass."""
    from torch.distributed.pipelining import ScheduleGPipe, SplitPoint
    from torch.distributed.pipelining import pipeline as split

    rank = dist.get_rank()
    torch.manual_seed(0)
    x, y = _data()
    pipe = split(_Net(), mb_args=(x.chunk(MICROBATCHES)[0],),
                 split_spec={"b": SplitPoint.BEGINNING})
    stage = pipe.build_stage(rank, torch.device("cpu"))
    sched = ScheduleGPipe(stage, n_microbatches=MICROBATCHES,
                          loss_fn=lambda o, t: nn.functional.cross_entropy(o, t))
    opt = torch.optim.AdamW(stage.submod.parameters(), lr=1e-3)
    _step(out, sched, opt, x, y, device, fault_rank, 1)
    return {}


def p2p_apis(out: str) -> dict:
    """Every point-to-point API once, rank 0 to rank 1 and back (a receive from any source
    on rank 1), inside the dumper: what each side sent, for the test to find in the dumps."""
    rank = dist.get_rank()
    peer = 1 - rank
    sent = {}
    with dumper(os.path.join(out, "run_{rank}.h5"), overwrite=True):
        a = torch.arange(6, dtype=torch.float32) + 10 * rank
        buf = torch.empty(6)
        if rank == 0:
            dist.send(a, 1, tag=1)  # blocking pair
            dist.recv(buf, 1, tag=1)
        else:
            dist.recv(buf, 0, tag=1)
            dist.send(a, 0, tag=1)
        sent["send"] = a.tolist()
        got = {"recv": (buf * 1).tolist()}
        b = torch.full((3,), float(rank + 1))
        ibuf = torch.empty(3)
        works = [dist.isend(b, peer, tag=2), dist.irecv(ibuf, peer, tag=2)]
        for w in works:
            w.wait()
        sent["isend"] = b.tolist()
        got["irecv"] = (ibuf + 0).tolist()
        c = torch.linspace(0, 1, 5) * (rank + 2)
        bbuf = torch.empty(5)
        ops = [dist.P2POp(dist.isend, c, peer, tag=3), dist.P2POp(dist.irecv, bbuf, peer, tag=3)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        sent["batch"] = c.tolist()
        got["batch"] = bbuf.sum().item()
        d = torch.full((2,), 7.0 + rank)
        dbuf = torch.empty(2)
        if rank == 0:
            dist.send(d, 1, tag=4)
        else:
            dist.recv(dbuf, tag=4)  # from any source
        sent["any"] = d.tolist()
    return {"sent": sent, "got": got}


def pending(out: str) -> dict:
    """Rank 1 posts a receive inside the dumper and waits for it only after the dumper
    closed; rank 0 sends after a barrier that rank 1 passes once it closed."""
    rank = dist.get_rank()
    if rank == 1:
        buf = torch.empty(4)
        with dumper(os.path.join(out, "run_{rank}.h5"), overwrite=True):
            work = dist.irecv(buf, 0, tag=7)
        dist.barrier()
        work.wait()
        return {"got": buf.tolist()}
    dist.barrier()
    dist.send(torch.ones(4), 1, tag=7)
    return {}


def ddp(out: str, compiled: bool) -> dict:
    """One DDP step with AdamW, the module compiled (`DDP(torch.compile(m))`) or eager: DDP
    copies the all-reduced gradients into the grads the compiled backward made."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tests._support.miscompile import inductor_cache

    rank = dist.get_rank()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data shard
    x, y = torch.randn(4, 16, generator=g), torch.randint(0, 8, (4,), generator=g)
    with inductor_cache(Path(out)):
        model = DDP(torch.compile(m) if compiled else m)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with dumper(os.path.join(out, "run_{rank}.h5"), overwrite=True):
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return {"weight": m[0].weight.flatten().tolist()}


SCENARIOS = {
    "gpipe-gold": lambda out: pipeline(out, "gpipe", device=False),
    "gpipe-dev": lambda out: pipeline(out, "gpipe", device=True),
    # rank 1's stage runs one shape-inference forward first (and its backward, through
    # torch.autograd.grad on the stage input): the addmm of its module 0 in micro-batch 0 is
    # occurrence 1 there; rank 0's stage runs its first forward on micro-batch 0: occurrence 1
    "gpipe-fault1": lambda out: pipeline(out, "gpipe", device=True, fault_rank=1, occurrence=1,
                                         module="*.0"),
    "gpipe-fault0": lambda out: pipeline(out, "gpipe", device=True, fault_rank=0, occurrence=1),
    "1f1b-gold": lambda out: pipeline(out, "1f1b", device=False),
    "1f1b-dev": lambda out: pipeline(out, "1f1b", device=True),
    # 1F1B: the same stages and the same forward order per stage (its warm-up and steady
    # state only interleave the backwards), so the same occurrences name micro-batch 0
    "1f1b-fault1": lambda out: pipeline(out, "1f1b", device=True, fault_rank=1, occurrence=1,
                                        module="*.0"),
    "1f1b-fault0": lambda out: pipeline(out, "1f1b", device=True, fault_rank=0, occurrence=1),
    "fe-gold": lambda out: front_end(out, device=False),
    "fe-fault0": lambda out: front_end(out, device=True, fault_rank=0),
    "gpt2-gold": lambda out: gpt2(out, device=False),
    "gpt2-dev": lambda out: gpt2(out, device=True),
    "gpt2-fault1": lambda out: gpt2(out, device=True, fault_rank=1),
    "gpt2-fault0": lambda out: gpt2(out, device=True, fault_rank=0),
    "p2p-apis": p2p_apis,
    "pending": pending,
    "ddp-gold": lambda out: ddp(out, compiled=False),
    "ddp-compiled": lambda out: ddp(out, compiled=True),
}


def main() -> None:
    names, out = sys.argv[1].split(","), sys.argv[2]
    warnings.filterwarnings("ignore", "Using `torch.compile")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    try:
        for name in names:
            where = os.path.join(out, name)
            os.makedirs(where, exist_ok=True)
            result = SCENARIOS[name](where)
            dist.barrier()
            with open(os.path.join(where, f"result_{rank}.json"), "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
