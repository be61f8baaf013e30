"""The series writer: when rows reach the file (batches, a time limit, an explicit flush)."""

from __future__ import annotations

import pytest

from accuracy.monitor import series as series_mod
from accuracy.monitor.series import SeriesWriter, read_series


def _row(step: int) -> dict:
    return {"step": step, "loss": float(step), "grad_norm": 1.0, "module_names": ["m"],
            "param_names": ["p"], "module": {"act_norm": [1.0]}, "param": {"norm": [2.0]},
            "state": {}}


def _steps(path) -> list[int]:
    return [int(s) for s in read_series(path).step]


def test_rows_reach_the_file_first_at_once_then_in_batches(tmp_path):
    path = tmp_path / "b.monitor.h5"
    w = SeriesWriter(path, flush_every=4, flush_seconds=None)
    w.append(_row(0))
    assert _steps(path) == [0]  # the file shows at once that the run has begun
    for i in range(1, 4):
        w.append(_row(i))
    assert _steps(path) == [0]  # three rows wait
    w.append(_row(4))
    assert _steps(path) == [0, 1, 2, 3, 4]
    w.append(_row(5))
    w.flush()  # a trigger's flush: what waits is written now
    assert _steps(path) == list(range(6))
    w.close()


def test_a_row_waits_no_longer_than_flush_seconds(tmp_path, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(series_mod.time, "monotonic", lambda: now[0])
    path = tmp_path / "t.monitor.h5"
    w = SeriesWriter(path, flush_every=1000, flush_seconds=2.0)
    w.append(_row(0))
    w.append(_row(1))  # waits from t=100
    now[0] = 101.5
    w.append(_row(2))
    assert _steps(path) == [0]
    now[0] = 102.0  # the oldest waiting row is 2 s old: all that wait are written
    w.append(_row(3))
    assert _steps(path) == [0, 1, 2, 3]
    w.close()


def test_flush_every_one_writes_each_row(tmp_path):
    path = tmp_path / "o.monitor.h5"
    w = SeriesWriter(path, flush_every=1)
    for i in range(3):
        w.append(_row(i))
        assert _steps(path) == list(range(i + 1))
    w.close()


@pytest.mark.parametrize("every", [3, 64, 130])
def test_batched_rows_read_back_as_written(tmp_path, every):
    path = tmp_path / "r.monitor.h5"
    w = SeriesWriter(path, flush_every=every, flush_seconds=None)
    for i in range(200):
        w.append(_row(i))
    w.close()
    s = read_series(path)
    assert list(s.step) == list(range(200)) and list(s.loss) == [float(i) for i in range(200)]
