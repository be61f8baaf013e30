"""Statistics computed on the helper thread (accuracy/dumper/deferred_stats.py) describe the
tensor as the op saw it: an op that writes memory waits for the pending statistics first,
and so does the end of a recorded step."""

from __future__ import annotations

import math
import time

import pytest
import torch

from accuracy import dumper, load_dump
from accuracy.dumper import deferred_stats, recorder
from accuracy.dumpfile.stats import _SMALL


@pytest.fixture
def slow_helper(monkeypatch):
    """A spare core however many this machine has, and a helper thread slow enough that an
    op running before its job would change the figures."""
    monkeypatch.setenv("ACCURACY_STATS_THREAD", "1")
    monkeypatch.setattr(recorder.os, "cpu_count", lambda: 64)
    real = deferred_stats.cpu_float_stats

    def slow(x):
        time.sleep(0.2)
        return real(x)

    monkeypatch.setattr(deferred_stats, "cpu_float_stats", slow)


def _expected(t: torch.Tensor) -> tuple[float, float, float]:
    with torch._C._DisableTorchDispatch():  # unseen by the dumper: not recorded
        return t.min().item(), t.max().item(), t.double().norm().item()


def test_an_in_place_write_waits_for_the_pending_statistics(tmp_path, slow_helper):
    x = torch.randn(4 * _SMALL)
    with dumper(dump_path=tmp_path / "s.h5", mode="statistics") as d:
        assert d._recorder._deferred is not None  # the helper thread is in use
        y = x * 2
        before = _expected(y)
        y.add_(1000)  # writes y: its recorded statistics must be the ones before
        after = _expected(y)
        y.neg()
    with load_dump(tmp_path / "s.h5") as dump:
        mul, add, neg = dump.records
    for t, want in ((mul.outputs[0], before), (add.inputs[0], before),
                    (add.outputs[0], after), (neg.inputs[0], after)):
        s = t.stats
        assert (s["min"], s["max"]) == want[:2]
        assert s["l2"] == pytest.approx(want[2], rel=1e-5)
        assert s["nan_count"] == 0 and not math.isnan(s["mean"])


def test_an_in_place_op_on_a_tensor_not_seen_before_records_it_as_it_was(tmp_path,
                                                                         slow_helper):
    x = torch.randn(4 * _SMALL)  # made outside the block: its first record is the op's input
    want = _expected(x)
    with dumper(dump_path=tmp_path / "s.h5", mode="statistics") as d:
        assert d._recorder._deferred is not None
        x.mul_(0)
    with load_dump(tmp_path / "s.h5") as dump:
        (mul,) = dump.records
    s = mul.inputs[0].stats
    assert (s["min"], s["max"]) == want[:2]
    assert mul.outputs[0].stats["max"] == 0.0


def test_an_idle_step_waits_for_the_pending_statistics(tmp_path, slow_helper):
    x = torch.randn(4 * _SMALL)
    with dumper(dump_path=tmp_path / "s.h5", mode="statistics", steps=[0]) as d:
        assert d._recorder._deferred is not None
        y = x * 2
        want = _expected(y)
        d.step()  # step 1 is not recorded: no mode installed, ops unseen
        y.mul_(0)
    with load_dump(tmp_path / "s.h5") as dump:
        (mul,) = dump.records
    s = mul.outputs[0].stats
    assert (s["min"], s["max"]) == want[:2]
