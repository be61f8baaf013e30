"""The honest bound's reduction lengths (issue 25): grouped and depthwise convolutions and
their backward, batched matmuls, attention and embedding backward, and the depthwise case a
user hit (a 2e-2 noise in a depthwise conv's grad_input read as a warning)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from torch import nn

from accuracy.compare import compare
from accuracy.compare.numerics import reduction_length
from accuracy.device_backend import sim
from accuracy.dumper import dumper
from accuracy.replay import replay


@dataclass
class _T:
    idx: int
    shape: tuple[int, ...]


@dataclass
class _Rec:
    op: str
    ins: list[tuple[int, ...]]
    outs: list[tuple[int, ...]]
    args: list = field(default_factory=list)

    @property
    def inputs(self):
        return [_T(i, s) for i, s in enumerate(self.ins)]

    @property
    def outputs(self):
        return [_T(i, s) for i, s in enumerate(self.outs)]

    @property
    def args_json(self):
        return json.dumps({"args": self.args, "kwargs": {}})


T = {"__tensor__": 0}


def test_depthwise_and_grouped_convolution_lengths():
    dw = [T, T, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 16]
    assert reduction_length(_Rec("aten.convolution.default", [(4, 16, 8, 8), (16, 1, 3, 3)],
                                 [(4, 16, 8, 8)], dw)) == 9
    back = [T, T, T, [0], [1, 1], [1, 1], [1, 1], False, [0, 0], 16, [True, True, False]]
    rec = _Rec("aten.convolution_backward.default",
               [(4, 16, 8, 8), (4, 16, 8, 8), (16, 1, 3, 3)], [(4, 16, 8, 8), (16, 1, 3, 3)],
               back)
    assert reduction_length(rec, 0) == 9  # grad_input: C_out/groups * kh * kw
    assert reduction_length(rec, 1) == 4 * 64  # grad_weight: batch * space
    grouped = back[:9] + [4, [True, True, False]]
    rec = _Rec("aten.convolution_backward.default",
               [(2, 16, 8, 8), (2, 16, 8, 8), (16, 4, 3, 3)], [(2, 16, 8, 8), (16, 4, 3, 3)],
               grouped)
    assert reduction_length(rec, 0) == 4 * 9
    # a first layer: no grad_input, so output 0 is grad_weight
    first = back[:9] + [1, [False, True, True]]
    rec = _Rec("aten.convolution_backward.default",
               [(2, 8, 8, 8), (2, 3, 8, 8), (8, 3, 3, 3)], [(8, 3, 3, 3), (8,)], first)
    assert reduction_length(rec, 0) == 2 * 64


def test_matmul_attention_and_embedding_lengths():
    assert reduction_length(_Rec("aten.bmm.default", [(8, 5, 7), (8, 7, 3)], [(8, 5, 3)])) == 7
    assert reduction_length(_Rec("aten.addbmm.default", [(5, 3), (8, 5, 7), (8, 7, 3)],
                                 [(5, 3)])) == 56
    sdpa = _Rec("aten._scaled_dot_product_flash_attention_for_cpu.default",
                [(2, 4, 16, 8), (2, 4, 32, 8), (2, 4, 32, 8)], [(2, 4, 16, 8), (2, 4, 16)])
    assert reduction_length(sdpa, 0) == 32
    back = _Rec("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
                [(2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 32, 8), (2, 4, 32, 8)],
                [(2, 4, 16, 8), (2, 4, 32, 8), (2, 4, 32, 8)])
    assert reduction_length(back, 0) == 32 and reduction_length(back, 2) == 16
    emb = _Rec("aten.embedding_dense_backward.default", [(2, 10, 8), (2, 10)], [(1000, 8)])
    assert reduction_length(emb, 0) == 20


class DepthwiseCNN(nn.Module):
    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(*[nn.Sequential(
            nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False), nn.GroupNorm(4, c), nn.ReLU(),
            nn.Conv2d(c, c, 1, bias=False), nn.GroupNorm(4, c), nn.ReLU()) for _ in range(2)])
        self.head = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def _step() -> None:
    torch.manual_seed(0)
    model = DepthwiseCNN()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 10, (4,), generator=g)
    nn.functional.cross_entropy(model(x), y).backward()


def test_depthwise_conv_backward_noise_is_the_culprit(tmp_path):
    g, d, r = (str(tmp_path / n) for n in ("g.h5", "d.h5", "r.h5"))
    with dumper(g):
        _step()
    fault = sim.fault("aten.convolution_backward.default", "*blocks.1.0", kind="noise",
                      value=2e-2, occurrence=0)
    with sim(profile="bf16", faults=[fault]), dumper(d):
        _step()
    replay(d, r)
    report = compare(d, g, replay=r)
    culprit = report.summary["culprit"]
    assert culprit["op"] == "aten.convolution_backward.default"
    assert culprit["module"].endswith("blocks.1.0") and culprit["verdict"] == "error"
    assert culprit["reduction_length"] == 9
    clean_d, clean_r = str(tmp_path / "c.h5"), str(tmp_path / "cr.h5")
    with sim(profile="bf16"), dumper(clean_d):
        _step()
    replay(clean_d, clean_r)
    assert compare(clean_d, g, replay=clean_r).summary["counts"]["error"] == 0


def test_lstm_layer_lengths():
    fwd = _Rec("aten.mkldnn_rnn_layer.default",
               [(5, 2, 16), (96, 16), (96, 24), (96,), (96,), (2, 24), (2, 24)],
               [(5, 2, 24), (2, 24), (2, 24), (1000,)])
    assert reduction_length(fwd, 0) == 16 + 24
    back = _Rec("aten.mkldnn_rnn_layer_backward.default",
                [(5, 2, 16), (96, 16), (96, 24), (96,), (96,), (2, 24), (2, 24)],
                [(5, 2, 16), (96, 16), (96, 24), (96,), (96,), (2, 24), (2, 24)])
    assert reduction_length(back, 0) == 96 and reduction_length(back, 1) == 10


def test_grad_input_and_grad_weight_are_separate_outlier_populations():
    """A convolution's grad_input and grad_weight are different kernels with different honest
    errors (here ~1x and ~100x their bounds). Pooled, their spread hides a grad_weight 6x its
    siblings: it must stand out among grad_weights (the outlier_error score is 5)."""
    from accuracy.compare.judge import _with_outlier_scores
    from accuracy.compare.row import Row

    op = "aten.convolution_backward.default"
    rows = [Row(index=i, kind="op", op=op, tensor_index=0, local_excess=1.0 + 0.02 * (i % 5))
            for i in range(12)]
    rows += [Row(index=12 + i, kind="op", op=op, tensor_index=1,
                 local_excess=100.0 + 2.0 * (i % 5)) for i in range(12)]
    rows.append(Row(index=99, kind="op", op=op, tensor_index=1, local_excess=600.0))
    z = _with_outlier_scores(rows, "local_excess", 0.15)
    assert z[99] >= 5.0, z[99]
