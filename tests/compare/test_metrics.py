"""Metric values against hand-computed cases and independent numpy formulas (issue 5)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from accuracy.compare.metrics import (
    ALL_ALGORITHMS,
    DEFAULT_ALGORITHMS,
    StreamingMetrics,
    resolve_algorithms,
    statistics_metrics,
)
from tests._support.native import PATHS, take_path

EPS32 = float(np.finfo(np.float32).eps)


@pytest.fixture(autouse=True, params=PATHS)
def metrics_path(request, monkeypatch):
    """Every test here runs with the fused C pass (accuracy/native, taken for plain chunks:
    finite values, no KL, masks or user metrics) and with the numpy passes alone."""
    return take_path(request.param, monkeypatch)


def run(x, y, algs=DEFAULT_ALGORITHMS, chunk=None, eps=EPS32, finite=False):
    x = np.asarray(x, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    kl = None
    if "kl_div" in algs:
        fx, fy = x[np.isfinite(x)], y[np.isfinite(y)]
        kl = ((fx.min(), fx.max()) if fx.size else (0, 0), (fy.min(), fy.max()) if fy.size
              else (0, 0))
    acc = StreamingMetrics(rel_eps=eps, kl_range=kl)
    step = chunk or max(1, x.size)
    for s in range(0, max(x.size, 1), step):
        acc.update(x[s:s + step], y[s:s + step], finite=finite)
    return acc.result(tuple(algs)), acc


def reference(x, y, eps=EPS32):
    """Independent textbook formulas, whole-array numpy."""
    x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
    d = x - y
    rel = np.abs(d) / np.maximum(np.abs(y), eps)
    p = np.maximum((y - y.min()) / (y.max() - y.min()), 1e-10)
    q = np.maximum((x - x.min()) / (x.max() - x.min()), 1e-10)
    p, q = p / p.sum(), q / q.sum()
    return {
        "cosine": float(x @ y / np.linalg.norm(x) / np.linalg.norm(y)),
        "max_abs_err": float(np.abs(d).max()),
        "mean_abs_err": float(np.abs(d).mean()),
        "rmse": float(np.sqrt(np.mean(d ** 2))),
        "euc_dist": float(np.linalg.norm(d)),
        "rel_euc_dist": float(np.linalg.norm(d) / np.linalg.norm(y)),
        "max_rel_err": float(rel.max()),
        "mean_rel_err": float(rel.mean()),
        "acc_rel_err": float(rel.sum()),
        "one_thousandth_err_ratio": float(np.mean(rel < 0.001)),
        "five_thousandths_err_ratio": float(np.mean(rel < 0.005)),
        "kl_div": float(np.sum(p * np.log(p / q))),
    }


def test_hand_computed():
    m, _ = run([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 5.0])
    assert m["max_abs_err"] == 1.0
    assert m["mean_abs_err"] == 0.25
    assert m["rmse"] == pytest.approx(0.5)
    assert m["euc_dist"] == 1.0
    assert m["rel_euc_dist"] == pytest.approx(1 / math.sqrt(39))
    assert m["cosine"] == pytest.approx(34 / math.sqrt(30 * 39))
    assert m["max_rel_err"] == pytest.approx(0.2)
    assert m["mean_rel_err"] == pytest.approx(0.05)
    assert m["acc_rel_err"] == pytest.approx(0.2)
    assert m["one_thousandth_err_ratio"] == 0.75
    assert m["five_thousandths_err_ratio"] == 0.75


def test_half_percent_boundaries():
    # rel errors 0.0005, 0.002, 0.01 -> below 0.001: 1/3, below 0.005: 2/3
    m, _ = run([1.0005, 1.002, 1.01], [1.0, 1.0, 1.0])
    assert m["one_thousandth_err_ratio"] == pytest.approx(1 / 3)
    assert m["five_thousandths_err_ratio"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("chunk", [None, 7, 1000])
def test_random_against_numpy(seed, chunk):
    rng = np.random.default_rng(seed)
    y = rng.standard_normal(5000) * 10 ** rng.uniform(-3, 3)
    x = y + rng.standard_normal(5000) * 1e-3 * np.abs(y).mean()
    m, _ = run(x, y, chunk=chunk)
    ref = reference(x, y)
    for k in DEFAULT_ALGORITHMS:
        assert m[k] == pytest.approx(ref[k], rel=1e-9, abs=1e-12), k
    m, _ = run(x, y, chunk=chunk, algs=ALL_ALGORITHMS)
    assert m["kl_div"] == pytest.approx(ref["kl_div"], rel=1e-9, abs=1e-12)


def test_streaming_equals_whole():
    rng = np.random.default_rng(5)
    x, y = rng.random(10_001), rng.random(10_001)
    a, _ = run(x, y, chunk=333, algs=ALL_ALGORITHMS)
    b, _ = run(x, y, algs=ALL_ALGORITHMS)
    for k in ALL_ALGORITHMS:
        assert a[k] == pytest.approx(b[k], rel=1e-10), k


def test_identical_tensors():
    x = np.linspace(-3, 3, 101)
    m, _ = run(x, x, algs=ALL_ALGORITHMS)
    assert m["cosine"] == pytest.approx(1.0)
    assert m["max_abs_err"] == 0 and m["rel_euc_dist"] == 0 and m["kl_div"] == pytest.approx(0)
    assert m["one_thousandth_err_ratio"] == 1.0


def test_identical_fast_path_matches_slow_path():
    x = np.random.default_rng(3).standard_normal(1000)
    slow = StreamingMetrics(rel_eps=EPS32)
    slow.update(x, x.copy())
    fast = StreamingMetrics(rel_eps=EPS32)
    fast.update(x, x.copy(), finite=True, identical=True)
    assert slow.result(DEFAULT_ALGORITHMS) == pytest.approx(fast.result(DEFAULT_ALGORITHMS))


def test_zero_golden_values_use_eps_floor():
    m, _ = run([0.0, 1e-7, 1.0], [0.0, 0.0, 1.0])
    # |1e-7 - 0| / eps32 ~ 0.84; zero vs zero is no error
    assert m["max_rel_err"] == pytest.approx(1e-7 / EPS32)
    assert m["one_thousandth_err_ratio"] == pytest.approx(2 / 3)


def test_all_zero_sides():
    m, _ = run([0.0, 0.0], [0.0, 0.0])
    assert m["cosine"] == 1.0 and m["rel_euc_dist"] == 0.0 and m["max_rel_err"] == 0.0
    m, _ = run([1.0, 0.0], [0.0, 0.0])
    assert m["cosine"] == 0.0 and m["rel_euc_dist"] == math.inf


def test_constant_tensors_kl_uniform():
    m, _ = run([2.0, 2.0, 2.0], [2.0, 2.0, 2.0], algs=ALL_ALGORITHMS)
    assert m["kl_div"] == pytest.approx(0.0)
    m, _ = run([1.0, 2.0, 3.0], [5.0, 5.0, 5.0], algs=ALL_ALGORITHMS)
    assert m["kl_div"] >= 0.0 and math.isfinite(m["kl_div"])


def test_zero_dim_and_empty():
    m, _ = run(np.float64(-2.0), np.float64(2.0))
    assert m["cosine"] == -1.0 and m["max_abs_err"] == 4.0 and m["max_rel_err"] == 2.0
    m, acc = run([], [], chunk=1)
    assert acc.n == 0 and all(v is None for v in m.values())


def test_nan_inf_mismatch_counts_and_finite_subset():
    x = [np.nan, 1.0, np.inf, 2.0, np.nan, -np.inf]
    y = [np.nan, 1.0, np.inf, np.nan, 3.0, np.inf]
    m, acc = run(x, y, algs=DEFAULT_ALGORITHMS)
    assert acc.nan_mismatch == 2  # positions 3 and 4
    assert acc.inf_mismatch == 1  # -inf vs +inf
    assert acc.n_cmp == 1 and m["max_abs_err"] == 0.0


def test_all_nan_has_no_metrics():
    m, acc = run([np.nan] * 3, [np.nan] * 3, algs=DEFAULT_ALGORITHMS)
    assert acc.nan_mismatch == 0 and all(v is None for v in m.values())


def test_statistics_metrics():
    s = statistics_metrics({"max": 2.0, "min": -1.0, "mean": 0.5, "l2": 3.0},
                           {"max": 2.0, "min": -2.0, "mean": 0.5, "l2": 4.0})
    assert s["max_diff"] == 0 and s["min_diff"] == 1.0 and s["min_rel_diff"] == 0.5
    assert s["l2_rel_diff"] == 0.25
    assert statistics_metrics({"max": math.nan}, {"max": 1.0})["max_diff"] is None


def test_resolve_algorithms_aliases_and_user_metric():
    assert resolve_algorithms(None) == DEFAULT_ALGORITHMS
    assert resolve_algorithms(["Cosine", "MaxAbsErr", "KullbackLeiblerDivergence"]) == (
        "cosine", "max_abs_err", "kl_div")
    assert resolve_algorithms("all") == ALL_ALGORITHMS
    assert resolve_algorithms(["numpy:ptp"])[0] == "ptp"
    with pytest.raises(ValueError, match="unknown metric"):
        resolve_algorithms(["nope"])


def test_the_fused_pass_takes_plain_chunks_and_leaves_the_rest(metrics_path):
    """Plain chunks (finite, no KL, masks or kept values) go through the one C pass; a chunk
    with a non-finite value, or any option it does not cover, is left to the numpy passes
    (which set non-finite pairs apart), and so counts the same either way. With the kernels
    off (ACCURACY_NATIVE=0) no chunk takes it."""
    fused = metrics_path == "fused"
    x = np.random.default_rng(0).standard_normal(4096)
    y = x + 1e-4
    assert StreamingMetrics(rel_eps=EPS32)._fused_update(x, y) is fused
    x[7] = np.nan
    assert not StreamingMetrics(rel_eps=EPS32)._fused_update(x, y)
    x[7] = 0.0
    assert not StreamingMetrics(rel_eps=EPS32, mask_at=1e30)._fused_update(x, y)
    assert not StreamingMetrics(rel_eps=EPS32, keep_values=True)._fused_update(x, y)
    assert not StreamingMetrics(rel_eps=EPS32)._fused_update(x.astype(np.float32), y)


def test_counts_at_both_thresholds_match_the_formulas():
    """rel errors straddling 1e-3 and 5e-3, over a chunk larger than one SIMD register."""
    y = np.ones(1000)
    rel = np.linspace(0, 0.01, 1000)
    m, acc = run(y + rel, y)
    assert acc.c1 == int(np.count_nonzero(np.abs((y + rel) - y) < 0.001))
    assert acc.c5 == int(np.count_nonzero(np.abs((y + rel) - y) < 0.005))
    assert m["max_rel_err"] == pytest.approx(0.01)
