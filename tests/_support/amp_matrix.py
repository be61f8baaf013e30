"""One training step of a model this project did not write, under CPU autocast (none, fp16 with
a GradScaler, bf16) and AdamW, dumped on CPU (golden) and on `sim` (a profile, with or without
one 5% fault on one call), replayed and compared: the cells of the autocast x profile x model
matrix (tests/scenarios/test_autocast_matrix.py)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from accuracy.compare import compare
from accuracy.device_backend import sim
from accuracy.dumper import dumper
from accuracy.replay import replay

AUTOCASTS = {"none": None, "fp16": torch.float16, "bf16": torch.bfloat16}
PROFILES = ("bf16", "fp16-cube", "fp8")


class SeparableCNN(nn.Module):
    """Depthwise-separable blocks: 3x3 depthwise conv, GroupNorm, SiLU, 1x1 pointwise conv."""

    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(*[nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False), nn.GroupNorm(4, c), nn.SiLU(),
            nn.Conv2d(c, c, 1), nn.GroupNorm(4, c), nn.SiLU()) for _ in range(2)])
        self.head = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class GRUTagger(nn.Module):
    """An embedding, a 2-layer GRU and a linear head on its mean output."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.rnn = nn.GRU(16, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.embed(x))[0].mean(1))


def _llama() -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=32,
                                   attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg)


@dataclass(frozen=True)
class Model:
    make: Any
    batch: Any
    loss: Any
    fault: tuple[str, str]  # (op, module) of the one faulted call: its first occurrence


def _cls_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x).float(), y)


def _lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, labels=y).loss


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


MODELS = {
    "cnn": Model(SeparableCNN,
                 lambda: (torch.randn(4, 3, 16, 16, generator=_gen(1)),
                          torch.randint(0, 10, (4,), generator=_gen(2))),
                 _cls_loss, ("aten.convolution", "blocks.1.3")),
    "llama": Model(_llama,
                   lambda: (torch.randint(0, 64, (2, 16), generator=_gen(1)),) * 2,
                   _lm_loss, ("aten.mm", "model.layers.1.mlp.up_proj")),
    "rnn": Model(GRUTagger,
                 lambda: (torch.randint(0, 50, (4, 12), generator=_gen(1)),
                          torch.randint(0, 10, (4,), generator=_gen(2))),
                 _cls_loss, ("aten.addmm", "head")),
}


def train_step(name: str, autocast: str) -> None:
    """One step: forward under autocast, loss, (scaled) backward, AdamW (and scaler) step."""
    spec = MODELS[name]
    torch.manual_seed(0)
    model = spec.make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dtype = AUTOCASTS[autocast]
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10) if dtype == torch.float16 \
        else None
    x, y = spec.batch()
    ctx = torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()
    with ctx:
        loss = spec.loss(model, x, y)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()


@dataclass
class Cell:
    errors: int  # tensors judged an error
    culprit: tuple[str, str] | None  # (op, module)
    suspects: list


def golden(name: str, autocast: str, work: Path) -> Path:
    path = work / f"{name}-{autocast}-golden.h5"
    if not path.exists():
        with dumper(dump_path=path):
            train_step(name, autocast)
    return path


def run_cell(name: str, autocast: str, profile: str, faulty: bool, work: Path) -> Cell:
    """The device step on `sim(profile)` (one 5% fault on the model's fault call when
    `faulty`), replayed and compared against the golden CPU step."""
    gold = golden(name, autocast, work)
    tag = f"{name}-{autocast}-{profile}-{'fault' if faulty else 'clean'}"
    dev, rep = work / f"{tag}.h5", work / f"{tag}-replay.h5"
    op, module = MODELS[name].fault
    faults = [sim.fault(op, module=module, kind="bias", value=0.05, occurrence=0)] \
        if faulty else []
    with sim(profile=profile, faults=faults) as mode, dumper(dump_path=dev):
        train_step(name, autocast)
    if faulty:
        assert len(mode.applied) == 1, mode.applied
    replay(dev, rep)
    report = compare(dev, gold, replay=rep)
    s = report.summary
    c = s.get("culprit")
    return Cell(errors=int(s["judged_counts"].get("error", 0)),
                culprit=(c["op"], c["module"]) if c else None,
                suspects=[(x.get("op"), x.get("module"), x.get("verdict"))
                          for x in s.get("suspects", [])[:5]])
