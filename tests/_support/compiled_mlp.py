"""A small MLP's training step dumped eager and `torch.compile`d (Inductor, CPU), for the
compare tests that need a compiled run against its eager golden without a large model."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from accuracy.dumper.core import dumper
from tests._support.miscompile import inductor_cache


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)
        self.norm = nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(self.act(self.fc1(x))) * 2.0 + 1.0)


def compiled_and_eager(folder: Path) -> tuple[Path, Path]:
    """(compiled.h5, eager.h5): one forward and backward of `Mlp`, same weights and batch,
    compiled in `folder`'s own Inductor cache."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model, x = Mlp(), torch.randn(8, 16)
    eager, comp = folder / "eager.h5", folder / "compiled.h5"
    with dumper(eager):
        model(x).square().mean().backward()
    model.zero_grad()
    with inductor_cache(folder / "cache"):
        torch._dynamo.reset()
        compiled = torch.compile(model)
        with dumper(comp):
            compiled(x).square().mean().backward()
        torch._dynamo.reset()
    return comp, eager
