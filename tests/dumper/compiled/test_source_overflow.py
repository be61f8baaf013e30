"""check_overflow inside a `torch.compile`d model: Inductor's kernels are judged as ops are.

Each kernel launch reached the recorder directly, never the overflow check: an overflow inside
compiled code raised no warning, the summary listed no event, `overflow_raise` raised nothing,
and `accuracy overflow` printed "no op produced inf/nan from finite inputs" with the guilty
fused kernel among the ops that only carried it.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from accuracy import dumper, load_dump
from accuracy.overflow import OverflowDetected, OverflowWarning, scan

pytestmark = pytest.mark.filterwarnings("ignore::accuracy.overflow.OverflowWarning")


class _Net(nn.Module):
    def __init__(self, boom: bool) -> None:
        super().__init__()
        self.fc1, self.fc2, self.boom = nn.Linear(8, 16), nn.Linear(16, 4), boom

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        if self.boom:
            h = h * 1e39  # inf in float32: an overflow
        return self.fc2(h)


def _step(net: nn.Module, path, **kw) -> None:
    torch.manual_seed(0)
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    with dumper(path, check_overflow=True, overflow_nums=-1, **kw):
        nn.functional.cross_entropy(net(x), y).backward()


@pytest.fixture
def no_compile_cache():
    """A kernel loaded from torch's on-disk compile cache names the source lines of the
    program that first compiled the same graph (another file, on this machine): compiled
    afresh here so the line asserted is this file's."""
    from torch._functorch import config as fconfig
    from torch._inductor import config

    with config.patch(fx_graph_cache=False), fconfig.patch(enable_autograd_cache=False):
        yield


def test_an_overflow_inside_compiled_code_is_born_at_its_kernel(tmp_path, no_compile_cache):
    torch._dynamo.reset()
    torch.manual_seed(0)
    clean = torch.compile(_Net(False))
    _step(clean, tmp_path / "clean.h5")
    assert not scan(tmp_path / "clean.h5").births

    bad = torch.compile(_Net(True))
    with pytest.warns(OverflowWarning, match="inductor.cpp_fused"):
        _step(bad, tmp_path / "bad.h5")
    rep = scan(tmp_path / "bad.h5")
    line = inspect.getsourcelines(_Net.forward)[1] + 3
    assert len(rep.births) == 1 and rep.births[0].op.startswith("inductor.cpp_fused")
    assert rep.births[0].source.endswith(f"test_source_overflow.py:{line}")
    assert rep.ops_scanned > 1  # the kernels were judged, not only written
    with load_dump(tmp_path / "bad.h5") as d:
        assert [r.op for r in d.records] == [rep.births[0].op]  # only the birth is written

    with pytest.raises(OverflowDetected, match="inductor.cpp_fused"):
        _step(bad, tmp_path / "raise.h5", overflow_raise=True)
