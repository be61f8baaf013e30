"""The statistics window's bookkeeping, on CPU tensors standing in for a device's figures
(the counts on the npu test device: tests/testdevice/test_testdevice_host_traffic.py).

What the writer relies on: each tensor's figures and checksum read back as placed, whatever
mix of checksum widths a window holds; the window closes at its size; a fetch that fails says
"no statistics" (nan, counts -1), never a figure.
"""

from __future__ import annotations

import math

import pytest
import torch

from accuracy.dumper import stats_window
from accuracy.dumper.stats_window import StatsWindow


def _figures(i: int) -> torch.Tensor:
    return torch.tensor([-i - 0.5, i + 0.25, i / 3, math.sqrt(i + 1), 0.0, float(i % 2)],
                        dtype=torch.float64)


def _checksums() -> list:
    return [torch.tensor(-7, dtype=torch.int32), torch.tensor(2**62 + 3, dtype=torch.int64), 0,
            torch.tensor(2**31 - 1, dtype=torch.int32), torch.tensor(-(2**63), dtype=torch.int64)]


def test_each_tensor_reads_back_its_own_figures_and_checksum():
    window = StatsWindow(max_bytes=1 << 30)
    placed = [window.figures((_figures(i), c)) for i, c in enumerate(_checksums())]
    window.close()
    for i, ((floats, checksum), c) in enumerate(zip(placed, _checksums(), strict=True)):
        assert list(floats) == _figures(i).tolist()[:4] + [0, i % 2]
        assert int(checksum) == (int(c) if isinstance(c, torch.Tensor) else 0)


def test_the_window_closes_at_its_size_and_not_before():
    window = StatsWindow(max_bytes=1 << 30, ops=3)
    floats, _ = window.figures((_figures(1), 0))
    window.op_written()
    window.op_written()
    assert not floats._fetch._done.is_set()
    window.op_written()
    assert floats._fetch._done.is_set() and window.windows_closed == 1
    assert list(floats)[:2] == [-1.5, 1.25]


def test_bytes_that_would_fill_an_open_window_close_it_first():
    window = StatsWindow(max_bytes=8192)
    floats, _ = window.figures((_figures(2), 0))
    window.hold(1024)
    assert not floats._fetch._done.is_set()
    window.hold(1024)  # 2 KiB behind the open window: a quarter of 8 KiB
    assert floats._fetch._done.is_set()
    assert window.windows_closed == 1
    copied = window.copy(torch.zeros(256), lambda t: t.clone())  # the next window's first
    window.copy(torch.zeros(512), lambda t: t.clone())  # would fill it: closed first
    assert window.windows_closed == 2 and copied.wait().shape == (256,)


def test_a_failed_fetch_leaves_no_statistics_never_a_figure(monkeypatch, caplog):
    def broken(*_a):
        raise RuntimeError("device lost")

    monkeypatch.setattr(stats_window, "_start_fetch", broken)
    window = StatsWindow(max_bytes=1 << 30)
    floats, checksum = window.figures((_figures(3), torch.tensor(5, dtype=torch.int32)))
    window.close()
    values = list(floats)
    assert all(math.isnan(v) for v in values[:4]) and values[4:] == [-1, -1]
    assert int(checksum) == 0
    assert "failed" in caplog.text


@pytest.mark.parametrize("empty", [True, False])
def test_closing_an_empty_window_fetches_nothing(empty):
    window = StatsWindow(max_bytes=1 << 30)
    if not empty:
        window.figures((_figures(0), 0))
    window.close()
    assert window.windows_closed == (0 if empty else 1)


def test_a_figure_kept_after_it_was_read_keeps_its_own_row_not_its_windows():
    """The dumper keeps the figures of every tensor it has seen (to know it again): one kept
    figure must not keep its whole window's rows (on an accelerator that grew by a window's
    rows, ~40 KB, every step of a statistics dump)."""
    import gc
    import tracemalloc

    kept = []
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for w in range(100):
            window = StatsWindow(max_bytes=1 << 30)
            placed = [window.figures((_figures(i), 0)) for i in range(256)]
            window.close()
            for floats, checksum in placed:  # the writer reads every row
                list(floats), int(checksum)
            assert list(placed[w][0])[1] == w + 0.25
            kept.append(placed[0])  # one figure of the window stays in the dumper's map
            del placed, window
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert [list(f)[0] for f, _ in kept] == [-0.5] * 100 and int(kept[0][1]) == 0
    assert held < 300_000, f"100 kept figures hold {held} bytes"
