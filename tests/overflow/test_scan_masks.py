"""Overflow births exclude intended non-finite values (issue 25): attention masks filled with
-inf or finfo.min, their triu/tril, and their propagation through add and softmax, offline
(`accuracy overflow`) and online (`check_overflow=True`, where overflow_nums counts real births
only)."""

from __future__ import annotations

import torch

from accuracy.dumper import dumper
from accuracy.examples import lm_batch, lm_step, tiny_lm
from accuracy.overflow import scan


def _lm() -> None:
    lm_step(tiny_lm(layers=1), lm_batch(batch=2, seq=8))


def _real_fp16_overflow() -> torch.Tensor:
    x = torch.full((4,), 300.0, dtype=torch.float16)
    return x * x  # 90000 > 65504: inf born here


def _masks_fp16() -> torch.Tensor:
    scores = -torch.rand(2, 8, 8, dtype=torch.float16) * 100
    causal = torch.full((8, 8), torch.finfo(torch.float16).min, dtype=torch.float16).triu(1)
    masked = scores + causal  # finfo.min + negative scores: -inf in fp16, intended
    pad = torch.zeros(2, 1, 8, dtype=torch.bool)
    pad[:, :, -2:] = True
    filled = masked.masked_fill(pad, float("-inf"))
    return torch.softmax(filled.float(), -1)


def test_readme_tiny_lm_mask_is_not_an_overflow_birth(tmp_path):
    path = tmp_path / "lm.h5"
    with dumper(str(path)):
        _lm()
    rep = scan(path)
    assert rep.births == [], [b.op for b in rep.births]
    assert any(f.op == "aten.full.default" for f in rep.intended)
    assert "intended non-finite values" in rep.format()


def test_fp16_masks_offline_are_intended_and_a_real_overflow_is_born(tmp_path):
    path = tmp_path / "m.h5"
    with dumper(str(path)):
        _masks_fp16()
        _real_fp16_overflow()
    rep = scan(path)
    assert [b.op for b in rep.births] == ["aten.mul.Tensor"]
    assert {"aten.add.Tensor", "aten.masked_fill.Scalar"} <= {f.op for f in rep.intended}


def test_online_overflow_nums_counts_real_births_only(tmp_path):
    path = tmp_path / "online.h5"
    with dumper(str(path), check_overflow=True, overflow_nums=1):
        _lm()
        _masks_fp16()
        _real_fp16_overflow()
    rep = scan(path)
    assert [b.op for b in rep.births] == ["aten.mul.Tensor"]  # not stopped at the mask


def test_a_real_overflow_next_to_a_mask_is_still_born(tmp_path):
    path = tmp_path / "real.h5"
    with dumper(str(path), check_overflow=True, overflow_nums=-1):
        big = torch.full((2, 8), 60000.0, dtype=torch.float16)
        mask = torch.full((2, 8), float("-inf"), dtype=torch.float16).triu(1)
        _ = (big + big) + mask  # +inf from the values, not the mask
    rep = scan(path)
    assert [b.op for b in rep.births] == ["aten.add.Tensor"]
