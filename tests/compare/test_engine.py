"""The compare's fast paths give the rows the full computation gives (issue 31): a pair whose
content hashes are equal is metered from the golden side alone, and only when both sides carry
a content hash; chunks whose relative errors all sit below a threshold are counted whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from accuracy import dumper
from accuracy.compare import compare
from accuracy.compare.metrics import DEFAULT_ALGORITHMS, StreamingMetrics
from tests._support.native import PATHS, take_path
from tests.dumpfile.test_checksum import _as_schema_2


def _dump(path: Path, scale: float) -> Path:
    x = torch.arange(4096, dtype=torch.float32).reshape(64, 64) / 977
    with dumper(dump_path=path, overwrite=True):
        ((x * scale) @ x).relu()
    return path


def _rows(my: Path, golden: Path) -> dict[str, dict]:
    return {r.my_address: r.as_dict() for r in compare(my, golden).rows if r.my_address}


@pytest.mark.parametrize("schema", [3, 2])
def test_equal_hashes_are_exact_and_different_bytes_are_measured(tmp_path, schema):
    golden = _dump(tmp_path / "golden.h5", 1.0)
    my = _dump(tmp_path / "my.h5", 1.001)
    if schema == 2:  # no content hash on either side: every pair compared chunk by chunk
        _as_schema_2(golden)
        _as_schema_2(my)
    rows = _rows(my, golden)
    same = [r for a, r in rows.items() if "aten.mul" in a and "/input/0" in a]
    differ = [r for a, r in rows.items() if "aten.mm" in a and "/output/" in a]
    assert same and differ
    for r in same:
        assert r["bit_exact"] is True and r["max_abs_err"] == 0.0 and r["cosine"] == 1.0
        assert r["one_thousandth_err_ratio"] == 1.0
    for r in differ:  # 0.1% apart: measured, not taken for equal
        assert r["bit_exact"] is False
        assert r["max_rel_err"] == pytest.approx(1e-3, rel=0.05)
        assert 0.0 < r["mean_abs_err"] and r["cosine"] == pytest.approx(1.0)


def test_equal_hash_rows_equal_the_chunk_by_chunk_rows(tmp_path):
    """Bit-identical pairs: the golden-only path gives the same figures as comparing both."""
    golden = _dump(tmp_path / "golden.h5", 1.0)
    copy = _dump(tmp_path / "copy.h5", 1.0)
    fast = _rows(copy, golden)
    _as_schema_2(golden)
    _as_schema_2(copy)
    slow = _rows(copy, golden)
    keys = (*DEFAULT_ALGORITHMS, "bit_exact", "nan_mismatch", "inf_mismatch")
    assert fast.keys() == slow.keys()
    for a in fast:
        assert {k: fast[a][k] for k in keys} == {k: slow[a][k] for k in keys}, a


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rel", [1e-4, 3e-3, 2e-2])
def test_chunks_below_a_threshold_count_whole(rel, path, monkeypatch):
    """Relative errors all below 0.001, between 0.001 and 0.005, above 0.005 (and a golden
    value below the eps floor in one chunk): the counts equal a direct count, with the C
    kernel and with numpy's passes (whose chunks below a threshold count whole)."""
    take_path(path, monkeypatch)
    rng = np.random.default_rng(7)
    y = rng.standard_normal(3000) + 3.0
    x = y * (1 + rel * rng.uniform(-1, 1, 3000))
    y[2500], x[2500] = 1e-9, 2e-9  # rel error measured against the floor eps
    eps = float(np.finfo(np.float32).eps)
    acc = StreamingMetrics(rel_eps=eps)
    for s in range(0, 3000, 1000):
        acc.update(x[s:s + 1000], y[s:s + 1000], finite=True)
    r = np.abs(x - y) / np.maximum(np.abs(y), eps)
    assert acc.c1 == int(np.count_nonzero(r < 0.001))
    assert acc.c5 == int(np.count_nonzero(r < 0.005))
    assert acc.max_rel == float(r.max())
    assert acc.srel == pytest.approx(float(r.sum()), rel=1e-12)
