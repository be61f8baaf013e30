"""Worker for tests/scenarios/test_trainer_and_lightning_ranks.py: a real Trainer (transformers
or Lightning) on a tiny random-init model, driven by AccuracyTrainerCallback /
AccuracyLightningCallback.

`python -m tests._support.integration_worker hf OUT STEPS` under RANK/WORLD_SIZE/MASTER_* env
(one process per rank, gloo); `python -m tests._support.integration_worker pl OUT STEPS DEVICES`
(Lightning spawns its own ranks with ddp_spawn when DEVICES > 1).
"""

from __future__ import annotations

import json
import os
import sys

import lightning as L
import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode

from accuracy import PrecisionDebugger


class ModeSeen:
    """A second probe beside the debugger: notes whether a dispatch mode is installed."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def start(self, model=None) -> None:
        self.seen.append(_get_current_dispatch_mode() is not None)

    def stop(self) -> None:
        pass

    def step(self) -> None:
        pass


def hf(out: str, steps: list[int]) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from accuracy.integrations import AccuracyTrainerCallback

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1,
                                       n_head=2, bos_token_id=0, eos_token_id=0))
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": ids, "labels": ids}
            for ids in torch.randint(0, 64, (16, 8), generator=g)]
    seen = ModeSeen()
    dbg = PrecisionDebugger(dump_path=os.path.join(out, "dump"), step=steps)
    args = TrainingArguments(output_dir=os.path.join(out, "trainer"), max_steps=4,
                             per_device_train_batch_size=2, use_cpu=True, report_to=[],
                             save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
                             dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[AccuracyTrainerCallback(dbg, seen)])
    trainer.train()
    return {"seen": seen.seen, "world": int(os.environ.get("WORLD_SIZE", 1)),
            "global_step": trainer.state.global_step}



class Net(L.LightningModule):
    """A small Conv1d-GroupNorm classifier (module level: ddp_spawn pickles it)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.GroupNorm(2, 8),
                                  nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.body(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def pl(out: str, steps: list[int], devices: int) -> dict:
    from accuracy.integrations import AccuracyLightningCallback

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    ds = torch.utils.data.TensorDataset(torch.randn(32, 4, 6, generator=g),
                                        torch.randint(0, 3, (32,), generator=g))
    loader = torch.utils.data.DataLoader(ds, batch_size=4)
    dbg = PrecisionDebugger(dump_path=os.path.join(out, "dump"), step=steps)
    trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=devices,
                        strategy="ddp_spawn" if devices > 1 else "auto", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0,
                        callbacks=[AccuracyLightningCallback(dbg)])
    trainer.fit(Net(), loader)
    return {"global_step": trainer.global_step}


if __name__ == "__main__":
    kind, out, steps = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if kind == "hf":
        result = hf(out, steps)
    else:
        result = pl(out, steps, int(sys.argv[4]))
    rank = int(os.environ.get("RANK", 0))
    with open(os.path.join(out, f"result_{kind}_{rank}.json"), "w") as f:
        json.dump(result, f)
    # gloo/DDP's C++ teardown at interpreter exit aborts now and then ("terminate called
    # without an active exception", after Python finished): the result is written, leave
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
