"""Run a test with the C kernels (accuracy/native) and again without them."""

from __future__ import annotations

import pytest

from accuracy import native

PATHS = ["fused", "python"]  # the C kernels; torch/numpy alone (ACCURACY_NATIVE=0)


def take_path(path: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Make `path` the one this test runs: "python" turns the kernels off for it; "fused"
    skips where no C compiler built them."""
    if path == "python":
        monkeypatch.setenv("ACCURACY_NATIVE", "0")
        monkeypatch.setattr(native, "_resolved", [])
    elif native.kernels() is None:
        pytest.skip("no C compiler here: the C kernels are not built")
    return path
