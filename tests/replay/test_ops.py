"""Each replayed row's op is checked against the allow-list once per distinct call text."""

from __future__ import annotations

import torch

from accuracy import dumper, safeops
from accuracy.replay import ops, replay


def test_a_call_text_repeated_by_many_rows_is_checked_once(tmp_path, monkeypatch):
    # the check decodes the row's arguments and walks them: per row it was 9% of a replay
    checked: list[str] = []
    real = safeops.check_call

    def spy(fn, *a, **k):
        checked.append(str(fn))
        return real(fn, *a, **k)

    monkeypatch.setattr(safeops, "check_call", spy)
    ops._allowed_call.cache_clear()
    x = torch.randn(8)
    with dumper(dump_path=tmp_path / "d.h5", mode="tensor"):
        for _ in range(4):
            x = x.exp().neg()
    r = replay(tmp_path / "d.h5", tmp_path / "r.h5")
    assert r.ok == 8 and r.failed == 0
    assert sorted(checked) == sorted({*checked}) and len(checked) == 2  # exp, neg: once each
