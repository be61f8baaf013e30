"""The models the dump benchmarks time, built alike on our side and in msprobe's runner.

msprobe_runner.py runs in msprobe's own virtualenv, where `accuracy` is not installed: it
imports this file from the benchmarks folder, as bench_dump.py does, so both tools time the
same model, batch and step.

- `bench`: the benchmark step (4-layer `nn.TransformerEncoder`, d_model 256, 8 heads, ff 1024,
  batch 8 x sequence 128, a 1000-class head), the same model as
  `accuracy.examples.bench_setup`; 559 ATen ops a step.
- `gpt2`: a 4-layer `transformers` GPT-2 of the same width (n_embd 256, 8 heads, vocabulary
  1000, batch 8 x 128 tokens, its own language-model loss), random init: a transformer this
  project did not write, whose layers are `transformers`' own (Conv1D projections, GELU,
  SDPA attention, tied embeddings). Dropout is off, as in `bench`, so every run computes the
  same values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

MODELS = ("bench", "gpt2")


class EncoderClassifier(nn.Module):
    """The same model as accuracy.examples.EncoderClassifier (that package is not in
    msprobe's virtualenv)."""

    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(256, 8, 1024, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
        self.head = nn.Linear(256, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


def _bench() -> tuple[nn.Module, tuple[torch.Tensor, ...], Callable[..., Any]]:
    torch.manual_seed(0)
    model = EncoderClassifier()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 128, 256, generator=g)
    y = torch.randint(0, 1000, (8,), generator=g)

    def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss
    return model, (x, y), step


def _gpt2() -> tuple[nn.Module, tuple[torch.Tensor, ...], Callable[..., Any]]:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=1000, n_positions=128, n_embd=256, n_layer=4,
                                  n_head=8, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (8, 128), generator=g)

    def step(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss
    return model, (ids,), step


def setup(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...], Callable[..., Any]]:
    """(model, batch, step) of model `name`; `step(model, *batch)` runs forward and backward."""
    if name == "bench":
        return _bench()
    if name == "gpt2":
        return _gpt2()
    raise SystemExit(f"error: unknown model {name!r}; choose from {', '.join(MODELS)}")
