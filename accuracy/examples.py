"""Small built-in models and training steps, for the demo, the benchmarks and the tests.

Everything is generated from a seed: no downloads, same numbers on every machine.
"""

from __future__ import annotations

import torch
from torch import nn


class TinyTransformerLM(nn.Module):
    """A small decoder-style language model: embedding, encoder layers, norm, vocab head."""

    def __init__(self, vocab: int = 256, d_model: int = 64, heads: int = 4, layers: int = 2,
                 ff: int = 128, max_len: int = 64, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=dropout,
                                           activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        pos = torch.arange(seq, device=tokens.device)
        h = self.embed(tokens) + self.pos(pos)
        mask = nn.Transformer.generate_square_subsequent_mask(seq, device=tokens.device)
        h = self.encoder(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))


def tiny_lm(seed: int = 0, **kw: int) -> TinyTransformerLM:
    torch.manual_seed(seed)
    return TinyTransformerLM(**kw)


def lm_batch(seed: int = 1, batch: int = 4, seq: int = 32, vocab: int = 256
             ) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def lm_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Forward and backward of one language-model step; returns the loss."""
    x, y = batch
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    return loss


class EncoderClassifier(nn.Module):
    """The benchmark model: 4-layer TransformerEncoder (d 256, 8 heads, ff 1024), 1000 classes."""

    def __init__(self, d_model: int = 256, heads: int = 8, ff: int = 1024, layers: int = 4,
                 classes: int = 1000) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


def bench_setup(seed: int = 0, batch: int = 8, seq: int = 128
                ) -> tuple[EncoderClassifier, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(seed)
    model = EncoderClassifier()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, seq, 256, generator=g)
    y = torch.randint(0, 1000, (batch,), generator=g)
    return model, (x, y)


def bench_step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss
