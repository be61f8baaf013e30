"""Run a test with the C kernels (accuracy/native) and again without them; the statistics
tests also with the dump's C++ per-tensor path (accuracy/native/stats.cpp)."""

from __future__ import annotations

import pytest

from accuracy import native
from accuracy.native import fastpath

PATHS = ["fused", "python"]  # the C kernels; torch/numpy alone (ACCURACY_NATIVE=0)
STATS_PATHS = ["cpp", *PATHS]  # the C++ module first, then what runs without it


def take_path(path: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Make `path` the one this test runs: "cpp" loads the C++ statistics module (skips where
    it cannot be built); "fused" and "python" turn it off, "python" the C kernels too;
    "fused" skips where no C compiler built them."""
    if path == "cpp":
        if fastpath.load() is None:
            pytest.skip("no C++ toolchain here: the statistics module is not built")
        return path
    monkeypatch.setattr(fastpath, "_resolved", [None])
    if path == "python":
        monkeypatch.setenv("ACCURACY_NATIVE", "0")
        monkeypatch.setattr(native, "_resolved", [])
    elif native.kernels() is None:
        pytest.skip("no C compiler here: the C kernels are not built")
    return path
