"""docs/ascend-guide.md's code blocks, and the names its snippets assume exist."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

DOC = Path(__file__).resolve().parents[2] / "docs" / "ascend-guide.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def guide_names(scale: float = 1.0) -> dict:
    """What the guide's snippets assume exists: model, input, criterion, target."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    if scale != 1.0:
        with torch.no_grad():
            model[0].weight.fill_(1.0)
    x = torch.randn(4, 8) if scale == 1.0 else torch.rand(4, 8) * scale  # finite
    return {"model": model, "input": x, "criterion": nn.CrossEntropyLoss(),
            "target": torch.tensor([0, 1, 2, 3])}
