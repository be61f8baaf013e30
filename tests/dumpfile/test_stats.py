"""Every path of `tensor_stats` (the fused C pass for contiguous fp32/fp64 CPU tensors, numpy
for small CPU tensors, the large CPU float path, torch elsewhere) stores the same figures:
min/max exact, mean and L2 to float accuracy, non-finite counts exact, and the checksum equal
to the reader's bit-pattern sum of the tensor's bytes."""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from accuracy import native
from accuracy.dumpfile.checksum import checksum, part_size
from accuracy.dumpfile.stats import _SMALL, tensor_stats
from tests._support.native import STATS_PATHS, take_path


def _reference(t: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(the bit-pattern sum of `t`'s bytes as the reader computes it, `t` in float64)."""
    flat = t.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy()
    dtype = str(flat.dtype).removeprefix("torch.")
    return checksum(raw, part_size(dtype, flat.element_size())), flat.double()


@pytest.mark.parametrize("n", [100, _SMALL + 7, 3 * _SMALL])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int32,
                                   torch.int64])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "offset"])
def test_every_path_stores_the_same_figures(stats_path, n, dtype, layout):
    g = torch.Generator().manual_seed(n)
    base = (torch.randn(2 * n + 4, generator=g) * 1000).to(dtype)
    if layout == "contiguous":
        t = base[:n]
    elif layout == "transposed":
        t = base[: (n // 4) * 4].view(4, -1).t()  # dense, not contiguous
    elif layout == "strided":
        t = base[: 2 * n: 2]  # not dense
    else:
        t = base[3: n + 3]  # a view at an offset into its storage
    (mn, mx, mean, l2, nans, infs), cs = tensor_stats(t)
    ref_cs, v = _reference(t)
    assert (mn, mx) == (v.min().item(), v.max().item())
    assert mean == pytest.approx(v.mean().item(), rel=1e-5, abs=1e-3)
    assert l2 == pytest.approx(v.norm().item(), rel=1e-5)
    assert (nans, infs) == (0, 0)
    assert cs == ref_cs


@pytest.mark.parametrize("n", [100, 3 * _SMALL])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_non_finite_values_are_counted_on_every_path(stats_path, n, dtype):
    t = torch.randn(n).to(dtype)
    t[5], t[7], t[9], t[11] = math.nan, math.inf, -math.inf, math.nan
    (mn, mx, _mean, l2, nans, infs), cs = tensor_stats(t)
    assert (nans, infs) == (2, 2)
    assert math.isnan(mn) or mn == -math.inf
    assert math.isnan(l2)
    assert cs == _reference(t)[0]


@pytest.fixture(params=STATS_PATHS)
def stats_path(request, monkeypatch):
    """Each test below runs with the C++ module, the fused C pass and the torch/numpy paths
    alone."""
    return take_path(request.param, monkeypatch)


def test_the_fused_pass_is_built_where_there_is_a_c_compiler():
    if not (os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler on PATH")
    assert native.kernels() is not None


@pytest.mark.parametrize("n", [100, 3 * _SMALL])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_and_torch_numpy_paths_store_the_same_figures(stats_path, n, dtype):
    g = torch.Generator().manual_seed(n)
    t = (torch.randn(n + 3, generator=g, dtype=torch.float64) * 1000).to(dtype)[3:]
    (mn, mx, mean, l2, nans, infs), cs = tensor_stats(t)
    ref_cs, v = _reference(t)
    assert (mn, mx) == (v.min().item(), v.max().item())
    assert mean == pytest.approx(v.mean().item(), rel=1e-5, abs=1e-3)
    assert l2 == pytest.approx(v.norm().item(), rel=1e-6)
    assert (nans, infs) == (0, 0)
    assert cs == ref_cs
    assert tensor_stats(t, sums=False)[1] == 0  # a tensor dump's bytes carry a hash instead


@pytest.mark.parametrize("n", [100, 3 * _SMALL])
def test_huge_finite_fp32_values_give_finite_figures_on_every_path(stats_path, n):
    """fp32 sums of squares of 1e30 overflow: the figures are those of fp64, as the small
    path's numpy upcast gives, never inf beside a finite min and max."""
    t = torch.full((n,), 1e30, dtype=torch.float32)
    t[::2] = -3e29
    (mn, mx, mean, l2, nans, infs), _cs = tensor_stats(t)
    v = t.double()
    assert (nans, infs) == (0, 0)
    assert mean == pytest.approx(v.mean().item(), rel=1e-6)
    assert l2 == pytest.approx(v.norm().item(), rel=1e-6)


@pytest.mark.parametrize("n", [100, 3 * _SMALL])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_non_finite_values_are_counted_with_the_fused_pass_too(stats_path, n, dtype, value):
    """One inf, or one NaN (which no min or max comparison sees), anywhere."""
    t = torch.randn(n, dtype=dtype)
    t[n - 1 if value == math.inf else n // 3] = value
    (_mn, mx, _mean, _l2, nans, infs), cs = tensor_stats(t)
    assert (nans, infs) == ((0, 1) if value == math.inf else (1, 0))
    assert mx == math.inf if value == math.inf else math.isnan(mx)
    assert cs == _reference(t)[0]


def test_a_cache_folder_others_can_write_is_never_loaded_from(tmp_path, monkeypatch, caplog):
    """Someone who can write the cache could swap the helper for their own code: a folder
    writable by group or others is refused, and its library never loaded."""
    if native.kernels() is None:
        pytest.skip("no C compiler here: nothing is built")
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("ACCURACY_CACHE_DIR", str(shared))
    monkeypatch.setattr(native, "_resolved", [])
    assert native.kernels() is not None  # built in a private folder: used
    built = next(shared.glob("kernels-*.so"))
    monkeypatch.setattr(native, "_resolved", [])
    shared.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="accuracy.native"):
        assert native.kernels() is None
    assert "writable by others" in caplog.text
    t = torch.randn(3 * _SMALL)
    assert tensor_stats(t)[0][0] == t.min().item()  # the torch/numpy path still answers
    shared.chmod(0o700)
    built.chmod(0o666)  # the library itself writable by others: never loaded, built afresh
    monkeypatch.setattr(native, "_resolved", [])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="accuracy.native"):
        lib = native.kernels()
    assert "writable by others" in caplog.text
    assert lib is not None and built.stat().st_mode & 0o022 == 0  # ours, replaced


@pytest.mark.parametrize("n", [100, 3 * _SMALL])
@pytest.mark.parametrize("value", [1e-25, 1e-40])
def test_tiny_fp32_values_keep_their_l2_on_every_path(stats_path, n, value):
    """fp32 squares of 1e-25 underflow to 0: an AdamW second moment of tiny gradients read
    l2 0 beside a non-zero max. Every path gives the fp64 figure."""
    t = torch.full((n,), value, dtype=torch.float32)
    (_mn, mx, mean, l2, _nans, _infs), _cs = tensor_stats(t)
    v = t.double()
    assert mx > 0
    assert l2 == pytest.approx(v.norm().item(), rel=1e-6, abs=0)
    assert mean == pytest.approx(v.mean().item(), rel=1e-6, abs=0)


@pytest.mark.parametrize(("path", "n"), [("cpp", 99), ("cpp", 3 * _SMALL), ("fused", 99),
                                         ("fused", 3 * _SMALL), ("python", 99)])
def test_the_fused_mean_is_an_fp64_sum(monkeypatch, path, n):
    """1 beside 1e8 is lost in an fp32 sum; numpy's small-tensor path summed in fp64, and so
    does the fused pass at any size (the torch path for large tensors keeps fp32 sums)."""
    take_path(path, monkeypatch)
    t = torch.tensor([1e8, 1.0, -1e8] * (n // 3), dtype=torch.float32)
    (_mn, _mx, mean, _l2, _nans, _infs), _cs = tensor_stats(t)
    assert mean == pytest.approx(1 / 3, rel=1e-9)


@pytest.mark.parametrize("n", [100, 3 * _SMALL])
def test_lazily_negated_and_conjugated_views_are_described_by_their_values(stats_path, n):
    """`torch._neg_view` and `.conj()` set a bit instead of writing values: the statistics and
    checksum are those of the values the tensor reads as (it raised before)."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(1))
    assert tensor_stats(torch._neg_view(x)) == tensor_stats((-x).clone())
    z = torch.complex(x, x.flip(0))
    assert tensor_stats(z.conj()) == tensor_stats(z.conj().resolve_conj())


@pytest.mark.parametrize("path", ["fused", "python"])
def test_a_tensor_whose_storage_was_freed_is_an_error_not_a_crash(path, monkeypatch):
    """FSDP frees an unsharded parameter by resizing its storage to 0. Without the C++ module
    (no compiler), the statistics of such a tensor, large (the C pass) or small (numpy), raise
    the error the loop counts, as the C++ path does, instead of reading address 0 and killing
    the user's process. Run in a child process: the old failure was a segfault."""
    take_path(path, monkeypatch)
    script = (
        "import torch\n"
        "from accuracy.dumpfile.stats import tensor_stats\n"
        "for n, keep in ((100_000, 0), (10, 0), (100, 40 * 4)):\n"
        "    x = torch.randn(n)\n"
        "    x.untyped_storage().resize_(keep)\n"
        "    try:\n"
        "        tensor_stats(x)\n"
        "    except ValueError as e:\n"
        "        assert 'past the end of its storage' in str(e), e\n"
        "    else:\n"
        "        raise SystemExit(f'{n}: no error')\n"
        "print('refused')\n")
    env = {**os.environ, "ACCURACY_NATIVE": os.environ.get("ACCURACY_NATIVE", "1")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0 and "refused" in out.stdout, (out.returncode, out.stderr[-500:])
