"""A torchrun job recorded with PrecisionDebugger and an msprobe config.json.

    torchrun --nproc-per-node 2 --master-addr 127.0.0.1 examples/torchrun_debugger.py \
        --config config.json --steps 6

Every rank trains a small DDP model on its own shard (gloo on CPU, nccl on GPUs); the config's
`step` and `rank` lists decide which steps of which ranks are written to
`dump_path/step{N}/rank{R}/dump.h5`. Run it twice (two backends, two versions) and compare the
trees with `accuracy compare -m run_a -g run_b -o report/`: one report per step and rank.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from accuracy import PrecisionDebugger

DEFAULT_CONFIG = {"task": "statistics", "dump_path": "./dump_path", "rank": [],
                  "step": [1, "3-4"], "level": "L1",
                  "statistics": {"scope": [], "list": [], "data_mode": ["all"],
                                 "summary_mode": "statistics"}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", help="msprobe config.json (default: a statistics config "
                                     "recording steps 1, 3 and 4)")
    ap.add_argument("--dump-path", help="overrides the config's dump_path")
    ap.add_argument("--steps", type=int, default=6)
    args = ap.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
                          if backend == "nccl" else "cpu")
    config = args.config
    if config is None:
        config = Path(f"./.debugger_config_{rank}.json")
        config.write_text(json.dumps(DEFAULT_CONFIG))
    debugger = PrecisionDebugger(config_path=config, dump_path=args.dump_path)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.LayerNorm(64), nn.GELU(),
                              nn.Linear(64, 10)).to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    for _ in range(args.steps):
        x = torch.randn(8, 32, generator=g).to(device)
        y = torch.randint(0, 10, (8,), generator=g).to(device)
        debugger.start(model)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        debugger.stop()
        debugger.step()
    if rank == 0:
        print(f"dumps under {debugger.config.dump_path}: "
              f"{sorted(str(p) for p in debugger.config.dump_path.glob('step*/rank*/dump.h5'))}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
