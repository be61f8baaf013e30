"""Higher-order operators in eager code under our dispatch modes (accuracy/hops.py): torch
raised NotImplementedError at the first `flex_attention` or `torch.cond` inside `with
dumper(...)`, killing the step. Now the step runs with the same numbers and the ops inside the
HOP are recorded; a HOP the dumper cannot run inside is said first (BLIND), never passed over."""

from __future__ import annotations

import pytest
import torch

from accuracy import dumper, hops, load_dump
from accuracy.compare import compare
from accuracy.dumpfile.describe import describe

flex_attention = pytest.importorskip("torch.nn.attention.flex_attention").flex_attention


def _causal(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx >= kv_idx, score, -float("inf"))


def _qkv() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, 16, 8, generator=g) for _ in range(3)]


def _attend() -> torch.Tensor:
    return flex_attention(*_qkv(), score_mod=_causal)


def test_flex_attention_in_eager_runs_and_its_ops_are_recorded(tmp_path):
    bare = _attend()
    with dumper(dump_path=tmp_path / "flex.h5"):
        out = _attend()
    assert torch.equal(out, bare)
    with load_dump(tmp_path / "flex.h5") as d:
        assert d.attrs["complete"] and "higher_order_ops_not_recorded" not in d.attrs
        ops = {r.op for r in d.records}
    # the attention's own math and the user's score_mod (its causal where) are rows
    assert {"aten.where.self", "aten.logsumexp.default"} <= ops, ops
    assert any("matmul" in o or "bmm" in o or "mm." in o for o in ops), ops


def _branchy(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = x @ w
    return torch.cond(y.sum() > 0, lambda t: (t.sin() * 2).cos(), lambda t: t.exp(), (y,)).sum()


def _cond_step() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 8, generator=g)
    w = torch.randn(8, 8, generator=g).abs().requires_grad_()  # y > 0: the sin branch
    loss = _branchy(x.abs(), w)
    loss.backward()
    return loss.detach(), w.grad


def test_torch_cond_in_eager_runs_forward_and_backward_and_records_the_branch(tmp_path):
    bare = _cond_step()
    with dumper(dump_path=tmp_path / "cond.h5"):
        got = _cond_step()
    assert all(torch.equal(a, b) for a, b in zip(got, bare, strict=True))
    with load_dump(tmp_path / "cond.h5") as d:
        assert "higher_order_ops_not_recorded" not in d.attrs
        fwd = {r.op for r in d.records if r.phase == "forward"}
        assert {"aten.sin.default", "aten.cos.default"} <= fwd
        assert "aten.exp.default" not in fwd  # the branch not taken runs nothing


def test_a_hop_the_dumper_cannot_run_inside_is_said_first(tmp_path, monkeypatch):
    """A HOP with no eager implementation we can find (a future torch's) runs as torch runs
    it without the mode: the step goes on, and every reader says those ops are missing."""
    bare = _cond_step()
    monkeypatch.setattr(hops, "dense_kernel", lambda func, args, kwargs: None)
    with dumper(dump_path=tmp_path / "my.h5"):
        got = _cond_step()
    monkeypatch.undo()
    assert all(torch.equal(a, b) for a, b in zip(got, bare, strict=True))
    with load_dump(tmp_path / "my.h5") as d:
        assert d.attrs["higher_order_ops_not_recorded"] == {"cond": 2}  # forward, backward
        assert "aten.sin.default" not in {r.op for r in d.records}
    assert "BLIND: 2 call(s) of higher-order op cond ran without the ops inside them " \
           "recorded" in describe(tmp_path / "my.h5").format()
    with dumper(dump_path=tmp_path / "golden.h5"):
        _cond_step()
    text = compare(tmp_path / "my.h5", tmp_path / "golden.h5").format()
    head = text.split("  rows ")[0].splitlines()[1:]  # the BLIND lines, before any count
    assert "  BLIND: my dump: 2 call(s) of higher-order op cond ran without the ops" \
        " inside them recorded" in "\n".join(head)
    assert "1 higher-order op(s) run without their ops recorded" in text
