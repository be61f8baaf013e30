"""The C kernels' cache (accuracy/native): what a user's machine may hold there is untrusted.

A library cut short by a crash or damaged since is never loaded (it killed the process with
SIGBUS): its bytes must match the hash in its name, else it is removed and built again. A
compiler given with arguments builds; one that fails, or writes nothing, leaves the
torch/numpy path with a warning.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch

from accuracy import native
from accuracy.dumpfile.stats import tensor_stats

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                                reason="no C compiler on PATH")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("ACCURACY_CACHE_DIR", str(folder))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(native, "_resolved", [])
    return folder


def _fresh(monkeypatch):
    monkeypatch.setattr(native, "_resolved", [])
    return native.kernels()


def test_a_damaged_library_is_rebuilt_not_loaded(cache, tmp_path, monkeypatch):
    assert native.kernels() is not None
    (built,) = cache.glob("kernels-*.so")
    # the same library cut short, as a crash during its first write could leave it; the next
    # process to start finds it (run apart: a library cut short kills the process using it)
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    (other / built.name).write_bytes(built.read_bytes()[:4096])
    code = ("import logging, torch; logging.basicConfig(level=logging.WARNING)\n"
            "from accuracy import native\n"
            "from accuracy.dumpfile.stats import tensor_stats\n"
            "assert native.kernels() is not None\n"
            "x = torch.randn(1000); print(tensor_stats(x)[0][1] == x.max().item())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "ACCURACY_CACHE_DIR": str(other)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True" and "damaged" in done.stderr
    (rebuilt,) = other.glob("kernels-*.so")
    assert rebuilt.read_bytes() == built.read_bytes()


def test_a_compiler_given_with_arguments_builds(cache, monkeypatch):
    monkeypatch.setenv("CC", f"{shutil.which('cc') or shutil.which('gcc')} -pipe")
    assert _fresh(monkeypatch) is not None


@pytest.mark.parametrize("cc", ["false", "true"])
def test_a_compiler_that_fails_or_writes_nothing_leaves_the_torch_path(cache, monkeypatch,
                                                                       caplog, cc):
    monkeypatch.setenv("CC", shutil.which(cc) or f"/bin/{cc}")
    with caplog.at_level(logging.WARNING, logger="accuracy.native"):
        assert _fresh(monkeypatch) is None
    assert "could not build" in caplog.text
    assert not list(cache.glob("*.so")) and not list(cache.glob("*.tmp"))
    x = torch.randn(1000)
    assert tensor_stats(x)[0][1] == x.max().item()


def test_a_cache_folder_that_cannot_be_made_is_said_and_left(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("ACCURACY_CACHE_DIR", str(blocker / "cache"))
    with caplog.at_level(logging.WARNING, logger="accuracy.native"):
        assert _fresh(monkeypatch) is None
    assert "cannot make" in caplog.text


def test_many_blocks_in_one_call_give_each_blocks_own_stats():
    """`stats_passes` (the monitor's one call per step's tensors) gives each block what
    `stats_pass` gives it alone, fp32 and fp64 mixed, a non-finite block flagged alone."""
    if native.kernels() is None:
        pytest.skip("the kernels are not built")
    g = torch.Generator().manual_seed(1)
    a = torch.randn(1000, generator=g)
    b = torch.randn(77, generator=g, dtype=torch.float64) * 1e5
    c = torch.randn(10, generator=g)
    c[4] = float("inf")
    d = torch.tensor([3.0], dtype=torch.float64)
    blocks = [(t.data_ptr(), t.numel(), t.dtype == torch.float32) for t in (a, b, c, d)]
    got = native.stats_passes(blocks)
    assert got is not None and got[2] is None
    for i in (0, 1, 3):
        one = native.stats_pass(*blocks[i])
        assert one is not None and got[i] == one[:4]
    assert got[3] == (3.0, 3.0, 3.0, 9.0)
    assert native.stats_passes([]) == []
