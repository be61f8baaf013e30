"""A tensor subclass the dumper cannot see into (torchao's fp8 training tensors are one) is
named first by every reader, never passed over silently (issue 29's torchao finding)."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_map

from accuracy.compare import compare
from accuracy.dumper import dumper
from accuracy.dumpfile import load_dump
from accuracy.dumpfile.describe import describe


class ScaledTensor(torch.Tensor):
    """A toy quantised tensor: int8 codes and a scale; ops see the dequantised values."""

    @staticmethod
    def __new__(cls, codes: torch.Tensor, scale: float):
        return torch.Tensor._make_wrapper_subclass(cls, codes.shape, dtype=torch.float32)

    def __init__(self, codes: torch.Tensor, scale: float) -> None:
        self.codes, self.scale = codes, scale

    def __tensor_flatten__(self):
        return ["codes"], {"scale": self.scale}

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return ScaledTensor(inner["codes"], meta["scale"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def plain(t):
            return t.codes.float() * t.scale if isinstance(t, ScaledTensor) else t
        return func(*tree_map(plain, args), **tree_map(plain, kwargs or {}))


def _step(scale: float) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    w = ScaledTensor(torch.randint(-100, 100, (8, 3), dtype=torch.int8), scale)
    (x @ w).relu().sum()


def test_a_subclass_the_dumper_cannot_see_into_is_said_first(tmp_path):
    g, d = tmp_path / "g.h5", tmp_path / "d.h5"
    with dumper(g):
        _step(0.01)
    with dumper(d):
        _step(0.01)
    with load_dump(d) as dump:
        subs = dump.attrs["tensor_subclasses"]
        assert any(name.endswith("ScaledTensor") for name in subs)
        assert any("tensor_subclasses" in r.extra for r in dump.records)
    info = describe(str(d)).format()
    assert "BLIND:" in info and "ScaledTensor" in info
    text = compare(d, g).format()
    lines = text.splitlines()
    assert "BLIND:" in lines[1] and "ScaledTensor" in lines[1]  # before anything else
    assert "tensor subclass(es) not seen into" in text


def test_plain_and_dtensor_free_steps_say_nothing(tmp_path):
    d = tmp_path / "d.h5"
    with dumper(d):
        torch.randn(4, 8).relu().sum()
    with load_dump(d) as dump:
        assert "tensor_subclasses" not in dump.attrs
    assert "BLIND" not in describe(str(d)).format()
