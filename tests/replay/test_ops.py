"""Each replayed row's op is checked against the allow-list once per distinct call text."""

from __future__ import annotations

import torch

from accuracy import dumper
from accuracy.replay import ops, replay


def test_the_cache_of_checked_calls_stays_bounded(tmp_path, monkeypatch):
    # a long replay (many steps, many shapes) must not grow the cache without end
    monkeypatch.setattr(ops, "_MAX_ALLOWED", 2)
    monkeypatch.setattr(ops, "_ALLOWED", {})
    x = torch.randn(8)
    with dumper(dump_path=tmp_path / "d.h5", mode="tensor"):
        (x.exp() + 1).mul(2).sum().neg()
    r = replay(tmp_path / "d.h5", tmp_path / "r.h5")
    assert r.ok == 5 and r.failed == 0
    assert 0 < len(ops._ALLOWED) <= 2
