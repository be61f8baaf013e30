"""A sum whose terms cancel is judged against its terms, not against the sum.

Seen on a stranger's CNN (a conv with a bias before each BatchNorm, the PyTorch default): the
bias's true gradient is 0, so its gradient (the output gradient summed over batch and space)
is fp32 noise in golden and bf16 noise on the device, 900x apart. Without a replay and with
one, every clean bf16 or fp16 run named `convolution_backward` the culprit. The statistics
bound how much the terms exceed their sum (numerics.cancellation); the honest error grows by
that factor. A fault in a sum whose terms do not cancel is still the culprit.
"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from torch import nn

from accuracy.compare import compare
from accuracy.dumper.core import dumper

sim = pytest.importorskip("accuracy.device_backend").sim
replay = pytest.importorskip("accuracy.replay").replay


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def _step(path, faults=None) -> None:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 3, 12, 12, generator=g), torch.randint(0, 10, (8,), generator=g)
    model = _cnn()
    with (sim(profile="bf16", faults=faults) if faults is not None else nullcontext()), \
            dumper(str(path)):
        nn.functional.cross_entropy(model(x), y).backward()


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    p = tmp_path_factory.mktemp("cancel") / "golden.h5"
    _step(p)
    return p


def test_a_clean_bf16_cnn_with_conv_biases_before_batchnorm_has_no_error(golden, tmp_path):
    dev, rep_path = tmp_path / "dev.h5", tmp_path / "replay.h5"
    _step(dev, faults=[])
    replay(dev, rep_path)
    for rep in (compare(dev, golden), compare(dev, golden, replay=rep_path)):
        assert rep.summary["counts"]["error"] == 0 and rep.summary["culprit"] is None
        biases = [r for r in rep.rows if r.kind == "op" and r.io == "output"
                  and r.op == "aten.convolution_backward.default" and r.shape_my in ([8], [16])]
        assert len(biases) == 2
        for r in biases:  # their figures are far apart: the sum's terms explain it
            assert r.rel_euc_dist > 1 and r.cancellation > 1e3
            assert "they cancel" in r.message and r.verdict == "pass"


def test_a_fault_in_a_sum_whose_terms_do_not_cancel_is_still_the_culprit(golden, tmp_path):
    dev, rep_path = tmp_path / "dev.h5", tmp_path / "replay.h5"
    _step(dev, faults=[sim.fault("aten.sum.dim_IntList", kind="bias", value=0.05)])
    replay(dev, rep_path)
    rep = compare(dev, golden, replay=rep_path)
    culprit = rep.summary["culprit"]
    assert culprit is not None and culprit["op"] == "aten.sum.dim_IntList"
    assert 1.0 <= culprit["cancellation"] < 10


def _norm_step(path, dtype: torch.dtype) -> None:
    """A LayerNorm and a training-mode BatchNorm on inputs whose means nearly cancel (as a
    residual stream's rows do), the model cast to `dtype`."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 32, generator=g)
    x = 100 * (x - x.mean(-1, keepdim=True)) + 0.1  # rows of size 100, means of 0.1
    c = torch.randn(8, 4, 5, 5, generator=g)
    c = 100 * (c - c.mean((0, 2, 3), keepdim=True)) + 0.1
    torch.manual_seed(0)
    ln, bn = nn.LayerNorm(32).to(dtype), nn.BatchNorm2d(4).to(dtype)
    with dumper(str(path)):
        (ln(x.to(dtype)).square().sum() + bn(c.to(dtype)).square().sum()).backward()


def test_a_norms_mean_of_terms_that_cancel_is_no_culprit_of_a_clean_bf16_run(tmp_path):
    """A tiny BERT cast to bf16 against fp32, without a replay: LayerNorm's mean output (a
    mean of its row) of rows whose values cancel to 1/1657 of their size differed from golden
    by 108% (cosine 0.69), "124x what its inputs explain", and was the culprit of a clean run.
    It is a sum of input 0: its honest error is relative to its terms."""
    gold, dev = tmp_path / "gold.h5", tmp_path / "dev.h5"
    _norm_step(gold, torch.float32)
    _norm_step(dev, torch.bfloat16)
    rep = compare(dev, gold)
    means = [r for r in rep.rows if r.kind == "op" and r.io == "output" and r.tensor_index == 1
             and r.op in ("aten.native_layer_norm.default", "aten.native_batch_norm.default")]
    assert len(means) == 2
    for r in means:
        assert r.rel_euc_dist > 0.1 and r.cancellation > 100, (r.op, r.rel_euc_dist)
        assert r.verdict != "error" and "they cancel" in r.message
    assert rep.summary["culprit"] is None
