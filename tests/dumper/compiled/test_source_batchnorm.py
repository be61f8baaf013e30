"""A compiled conv-BatchNorm-ReLU-max pool-linear step against eager (a stranger's trial,
`t1_cnn_bn.py`): clean, it has no error; with a fault in one kernel, that kernel is named.

The trap: the kernel that fuses BatchNorm's backward writes `sum_5`, the sum of
grad * (x - mean) inside `native_batch_norm_backward`'s decomposition (only that call's
grad_weight and grad_input use it); paired "by origin" with the eager op's grad_bias output
(cosine 0.51) it gave the clean step a false error. It is recorded as inside the decomposition
and pairs with no eager value. Compiled once per module (clean and faulty), Inductor's cache in the
test's temporary folder.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from accuracy import dumper, load_dump
from accuracy.compare import compare
from tests._support.miscompile import ScaleMatmul

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.timeout(900)]

BN_BACKWARD = "aten.native_batch_norm_backward.default"


class Net(nn.Module):
    """The trial's CNN (same weights and batch): conv, BatchNorm, ReLU, max pool; conv,
    BatchNorm, ReLU, average pool; linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.n1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.n2 = nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.n1(self.conv1(x))))
        x = F.adaptive_avg_pool2d(F.relu(self.n2(self.conv2(x))), 4)
        return self.fc(x.flatten(1))


def _step(model: nn.Module) -> None:
    torch.manual_seed(1)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    F.cross_entropy(model(x), y).backward()


def make_dumps(folder, fault: bool) -> dict:
    folder.mkdir()
    torch.manual_seed(0)
    state = Net().state_dict()
    out = {k: folder / f"{k}.h5" for k in ("eager", "compiled")}
    m = Net()
    m.load_state_dict(state)
    with dumper(out["eager"], mode="tensor"):
        _step(m)
    torch._dynamo.reset()
    m = Net()
    m.load_state_dict(state)
    miscompile = ScaleMatmul(torch.ops.aten.relu.default, "", first=True) if fault else None
    with torch._inductor.config.patch(post_grad_custom_post_pass=miscompile):
        with dumper(out["compiled"], mode="tensor"):
            _step(torch.compile(m))
    torch._dynamo.reset()
    return out


def _inner_sums(comp) -> list[tuple[int, int]]:
    """(seq, output index) of the backward kernel outputs recorded as a sum inside BatchNorm
    backward's decomposition."""
    with load_dump(comp) as d:
        return [(r.seq, i) for r in d.records if r.extra.get("compiled")
                for i, o in enumerate(r.extra.get("outputs") or [])
                if o.get("inner") and o.get("orig") == BN_BACKWARD
                and o.get("op") == "aten.sum.dim_IntList"]


def test_the_clean_step_has_no_error(clean):
    rep = compare(clean["compiled"], clean["eager"])
    bad = [(r.op, r.tensor_index, r.message) for r in rep.rows if r.verdict == "error"]
    assert not bad, bad
    assert rep.culprit is None, rep.culprit
    # nor a warning: the bias dynamo detaches is eager's bias, not BatchNorm's saved mean
    warned = [(r.op, r.io, r.tensor_index, r.message) for r in rep.rows
              if r.verdict == "warning"]
    assert not warned, warned


def test_a_sum_inside_batchnorms_backward_pairs_with_no_eager_output(clean):
    inner = _inner_sums(clean["compiled"])
    assert inner, "no kernel output recorded as inside native_batch_norm_backward"
    rep = compare(clean["compiled"], clean["eager"])
    for seq, idx in inner:
        row = next(r for r in rep.rows if r.kind == "op" and r.io == "output"
                   and r.seq_my == seq and r.tensor_index == idx)
        assert row.golden_address is None and "inside the decomposition" in row.message, \
            row.message
    # BatchNorm's real outputs still pair with eager's: grad_input, grad_weight and grad_bias
    # of the first BatchNorm, all three written by the kernel that also writes its inner sum
    # (its grad_input's buffer is written in place, its node a guess: never called inner)
    paired = {tuple(r.golden_address.split("/")[2::2]) for r in rep.rows
              if r.kind == "op" and r.io == "output" and r.op_golden == BN_BACKWARD
              and r.golden_address is not None and r.seq_my in {s for s, _ in inner}}
    calls = {seq for seq, _ in paired}
    assert any({(c, i) for i in "012"} <= paired for c in calls), paired


def test_a_fault_in_one_kernel_is_the_culprit(fault):
    with load_dump(fault["compiled"]) as d:
        seqs = [r.seq for r in d.records if r.extra.get("compiled") and r.phase == "forward"
                and any("aten.relu.default" in (o.get("fused") or []) and not o.get("source")
                        for o in r.extra.get("outputs") or [])]
    assert len(seqs) == 1, seqs
    rep = compare(fault["compiled"], fault["eager"])
    assert rep.culprit is not None and rep.culprit["seq_my"] == seqs[0], rep.culprit


def _graph(uses: str, seq_nr: int | None = 5) -> torch.fx.Node:
    """A hand-made FX graph: `s`, a sum inside BatchNorm backward's decomposition (call
    `seq_nr`), and its users as `uses` says; returns `s`."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    aten = torch.ops.aten

    def node(target, args, orig, seq=seq_nr):
        n = g.call_function(target, args)
        n.meta.update(original_aten=orig, stack_trace='File "m.py", line 15')
        if seq is not None:
            n.meta["seq_nr"] = seq
        return n

    bn = aten.native_batch_norm_backward.default
    s = node(aten.sum.dim_IntList, (x, [0]), bn)
    if uses == "same call":
        g.output(node(aten.mul.Tensor, (s, 2.0), bn))
    elif uses == "view to another op":
        v = node(aten.unsqueeze.default, (s, 0), bn)
        g.output(node(aten.convolution_backward.default, (v,), aten.convolution_backward.default,
                      4))
    elif uses == "another call":
        g.output(node(aten.mul.Tensor, (s, 2.0), bn, 6))
    elif uses == "graph output":
        node(aten.mul.Tensor, (s, 2.0), bn)
        g.output(s)
    return s


@pytest.mark.parametrize("uses, seq_nr, inner", [
    ("same call", 5, True),
    ("same call", None, False),  # no autograd sequence number: calls cannot be told apart
    ("view to another op", 5, False),
    ("another call", 5, False),
    ("graph output", 5, False),
])
def test_a_value_is_inner_only_when_its_own_call_alone_uses_it(uses, seq_nr, inner):
    from accuracy.dumper.compiled.kernels import decomposition_inner

    assert decomposition_inner(_graph(uses, seq_nr)) is inner
