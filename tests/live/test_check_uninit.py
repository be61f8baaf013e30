"""The live check follows uninitialised memory as the dumper does (accuracy/dumper/uninit.py):
an op reading bytes no op has written since their `empty` is not judged, however many calls
later it runs, and ops on the same buffer once it is filled are."""

from __future__ import annotations

import torch
from torch import nn

from accuracy.device_backend import sim
from accuracy.live import live_check

N = 32


class Staged(nn.Module):
    """A layer that gathers its input into a buffer allocated with `torch.empty` and filled in
    two parts (as FSDP2's all-gather buffer: the copy-in, then the rest), the first part more
    than 16 calls after the `empty`; in between, the layer already reads the whole buffer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(N, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        buf = torch.empty(2, N)
        # What the memory held: planted below every dispatch mode (nothing sees this write),
        # so the garbage is the same on every run. 1e6 is beyond fp16's range.
        with torch._C._DisableTorchDispatch():
            buf.copy_(torch.linspace(-1e6, 1e6, 2 * N).reshape(2, N))
        h = x
        for _ in range(10):  # 30 small ops
            h = torch.tanh(h * 0.9 + 0.1)
        buf[0].copy_(h)  # the first part, long after the empty
        early = self.proj(buf)  # row 1 still garbage: not data
        buf[1].copy_(h.flip(0))  # the rest
        return self.proj(buf).sum() + early[0].sum()


def test_live_check_does_not_judge_a_buffer_filled_long_after_its_empty():
    model, x = Staged(), torch.linspace(-1, 1, N)
    with torch.no_grad(), sim(profile="fp16-cube"), live_check() as chk:
        model(x)
    assert chk.errors() == [], [r.describe() for r in chk.errors()]  # no false culprit
    (empty,) = [r for r in chk.results if r.op == "aten.empty.memory_format"]
    first, second = [r for r in chk.results if r.op == "aten.addmm.default"]
    assert first.seq - empty.seq > 16
    assert first.status == "skipped" and first.reason.startswith("uninitialised memory")
    assert second.status == "ok" and second.verdict == "pass"  # filled: judged
    copies = [r for r in chk.results if r.op == "aten.copy_.default"]
    assert len(copies) == 2 and all(r.status == "ok" for r in copies)  # they fill it: judged


def test_a_scalar_read_of_unfilled_bytes_is_said_not_data():
    """`.item()` and `torch.equal` on a buffer no op has filled return Python values, so no
    output of theirs carries the taint: the check itself must see that they read unfilled
    bytes, and say so, rather than count them as checked ops."""
    with torch.no_grad(), live_check() as chk:
        buf = torch.empty(8)
        with torch._C._DisableTorchDispatch():  # garbage planted below every mode
            buf.copy_(torch.linspace(-1, 1, 8))
        torch.equal(buf, torch.zeros(8))
        buf.max().item()
    scalar = [r for r in chk.results
              if r.op in ("aten.equal.default", "aten._local_scalar_dense.default")]
    assert len(scalar) == 2
    assert all(r.status == "skipped" and r.reason.startswith("uninitialised memory")
               for r in scalar), [(r.op, r.status, r.reason) for r in scalar]
