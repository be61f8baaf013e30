"""The statistics dump's C++ per-tensor path (accuracy/native/stats.cpp via fastpath.py)
against its Python fallback (`python_tensor_stats`): the same figures for every dtype the
dumper records, every layout, zero-size, NaN and inf; the same figures at any thread count;
what it does not take goes to the Python path; a build that fails, or ACCURACY_NATIVE=0,
leaves the Python path with one log line and the dump whole."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from accuracy import dumper, load_dump
from accuracy.dumpfile import stats as stats_mod
from accuracy.dumpfile.stats import python_tensor_stats
from accuracy.errors import ExtensionUnavailableError
from accuracy.native import cppext, fastpath

FP8 = [d for d in (getattr(torch, n, None) for n in (
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")) if d is not None]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, *FP8, torch.int64,
          torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
LARGE = 3 * (1 << 16) + 5  # past the C++ path's 64 Ki chunks: reduced over threads


@pytest.fixture(scope="module")
def ext():
    module = fastpath.load()
    if module is None:
        pytest.skip("no C++ toolchain here: the statistics module is not built")
    return module


def _tensor(dtype: torch.dtype, n: int, layout: str, special: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(n + len(layout))
    base = torch.randn(2 * n + 8, generator=g, dtype=torch.float64) * 50
    if dtype == torch.bool:
        base = base > 0
    elif not dtype.is_floating_point:
        base = base.round()
    if special and dtype.is_floating_point:
        base[3], base[n // 2 + 3], base[n + 1] = math.nan, math.inf, -math.inf
    base = base.to(dtype)
    if layout == "contiguous":
        return base[3: n + 3]
    if layout == "transposed":  # dense, not contiguous
        return base[: (n // 4) * 4].view(4, -1).t()
    if layout == "strided":  # not dense: copied
        return base[: 2 * n: 2]
    return base[:n].view(1, n, 1).expand(3, n, 1)  # stride 0: not dense


def _same(got, want, dtype) -> None:
    (mn, mx, mean, l2, nans, infs), cs = got
    (wmn, wmx, wmean, wl2, wnans, winfs), wcs = want
    assert (nans, infs, cs) == (wnans, winfs, wcs)
    for a, b in ((mn, wmn), (mx, wmx)):
        assert (math.isnan(a) and math.isnan(b)) or a == b
    # the Python path sums large fp32/fp16/bf16 tensors in fp32, the C++ one in fp64
    rel = 1e-5 if dtype in (torch.float64, torch.int64, torch.int32) else 1e-4
    for a, b in ((mean, wmean), (l2, wl2)):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=rel, abs=1e-3)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 100, LARGE])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "expanded"])
def test_the_cpp_path_gives_the_python_paths_figures(ext, dtype, n, layout):
    t = _tensor(dtype, n, layout, special=False)
    for sums in (True, False):
        _same(ext.stats(t, sums), python_tensor_stats(t, sums), dtype)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d.is_floating_point], ids=str)
@pytest.mark.parametrize("n", [100, LARGE])
def test_nan_and_inf_are_counted_as_the_python_path_counts_them(ext, dtype, n):
    t = _tensor(dtype, n, "contiguous", special=True)
    got = ext.stats(t, True)
    _same(got, python_tensor_stats(t, True), dtype)
    (mn, mx, _mean, _l2, nans, infs), _cs = got
    if dtype not in (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz):
        assert (nans, infs) == (1, 2) and math.isnan(mn) and math.isnan(mx)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_zero_size_and_zero_dim_tensors(ext, dtype):
    for t in (torch.empty(0, 3, dtype=dtype), torch.ones((), dtype=dtype)):
        _same(ext.stats(t, True), python_tensor_stats(t, True), dtype)


def test_a_lazily_negated_view_is_described_by_its_values(ext):
    x = torch.randn(1000)
    assert ext.stats(torch._neg_view(x), True) == ext.stats((-x).clone(), True)


def test_the_figures_do_not_depend_on_the_thread_count(ext):
    t = torch.randn(40 * (1 << 16) + 3, dtype=torch.float32) * 1e3
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ext.stats(t, True)
        torch.set_num_threads(max(2, before))
        many = ext.stats(t, True)
    finally:
        torch.set_num_threads(before)
    assert one == many


def test_what_it_does_not_take_goes_to_the_python_path(ext):
    for t in (torch.randn(4, dtype=torch.complex64), torch.randn(4, device="meta"),
              torch.randn(4).to_sparse(), torch.zeros(4, dtype=torch.uint16)):
        assert ext.stats(t, True) is None
    z = torch.complex(torch.randn(50), torch.randn(50))
    assert stats_mod.tensor_stats(z) == python_tensor_stats(z)


def test_accuracy_native_0_never_builds(monkeypatch):
    monkeypatch.setenv("ACCURACY_NATIVE", "0")
    monkeypatch.setattr(fastpath, "_resolved", [])

    asked = []
    monkeypatch.setattr(cppext, "load_extension", lambda *a, **k: asked.append(a))
    assert fastpath.load() is None and fastpath.loaded() is None
    assert asked == []  # nothing built or loaded


def test_a_failed_build_logs_one_line_and_the_dump_keeps_its_figures(tmp_path, monkeypatch,
                                                                       caplog):
    monkeypatch.setattr(fastpath, "_resolved", [])

    def broken(*a, **k):
        raise ExtensionUnavailableError("cannot build the C++ extension accuracy_stats: boom")

    monkeypatch.setattr(cppext, "load_extension", broken)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    with caplog.at_level(logging.WARNING, logger="accuracy.native"), \
            dumper(dump_path=tmp_path / "d.h5", mode="statistics"):
        model(torch.randn(4, 8)).sum().backward()
    lines = [r for r in caplog.records if r.name.startswith("accuracy.native")]
    assert len(lines) == 1 and "slower paths" in lines[0].getMessage()
    rows = load_dump(tmp_path / "d.h5").tensors
    assert rows and all(r.stats["nan_count"] == 0 and math.isfinite(r.stats["max"])
                        for r in rows if r.dtype == "float32" and math.prod(r.shape) > 0)


@pytest.mark.filterwarnings("ignore::accuracy.overflow.OverflowWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_check_overflow_writes_the_same_births_with_either_path(ext, tmp_path, monkeypatch,
                                                                dtype):
    """The overflow check judges each op by its own probes and writes its births through the
    recorder: the same births, with the same figures (their inf counted), either path."""
    big = torch.finfo(dtype).max / 4

    def step() -> None:
        x = torch.full((64,), big, dtype=dtype)
        y = (x * 8).float()  # inf born here
        (y - y).sum()  # nan from inf: inherited, not a birth

    rows = {}
    for path in ("cpp", "python"):
        if path == "python":
            monkeypatch.setattr(fastpath, "_resolved", [None])
        with dumper(tmp_path / f"{path}.h5", check_overflow=True):
            step()
        with load_dump(tmp_path / f"{path}.h5") as d:
            rows[path] = [(r.op, [(t.dtype, t.stats) for t in r.outputs]) for r in d.records]
    assert rows["cpp"] and rows["cpp"][0][0] == "aten.mul.Tensor"
    assert rows["cpp"][0][1][0][1]["inf_count"] == 64
    assert len(rows["cpp"]) == len(rows["python"])
    for (op, outs), (op2, outs2) in zip(rows["cpp"], rows["python"], strict=True):
        assert op == op2
        for (_d, s), (_d2, s2) in zip(outs, outs2, strict=True):
            assert {k: v for k, v in s.items() if v == v} == {k: v for k, v in s2.items()
                                                              if v == v}


def test_a_dump_loads_the_module_when_it_opens_not_inside_the_step(ext, tmp_path):
    """A fresh process: nothing has asked for the module before the dump opens; by the first
    op of the step it is loaded (the per-tensor path only takes one already loaded, so a
    build never runs inside the user's step)."""
    code = (
        "import torch\n"
        "from accuracy import dumper\n"
        "from accuracy.native import fastpath\n"
        "assert fastpath.loaded() is None\n"
        f"with dumper(dump_path={str(tmp_path / 'd.h5')!r}, mode='statistics'):\n"
        "    assert fastpath.loaded() is not None\n"
        "    torch.ones(3) + 1\n"
        "print('ok')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


class _Stranger(torch.nn.Module):
    """A model this project did not write: a small CNN, a GRU and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 8, 3, padding=1)
        self.gru = torch.nn.GRU(8, 16, batch_first=True)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)).transpose(1, 2)
        out, _ = self.gru(h)
        return self.head(out[:, -1])


def _stranger_step(path: Path) -> None:
    torch.manual_seed(0)
    model = _Stranger()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(3, 4, 10, generator=g), torch.randint(0, 5, (3,), generator=g)
    with dumper(dump_path=path, mode="statistics"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()


def test_a_strangers_step_gives_the_same_rows_with_either_path(ext, tmp_path, monkeypatch):
    """A CNN + GRU under bf16 autocast with AdamW (fp32, bf16, int64 and bool tensors, views):
    every row of the dump holds the same figures with the C++ path and without it."""
    _stranger_step(tmp_path / "cpp.h5")
    monkeypatch.setattr(fastpath, "_resolved", [None])
    _stranger_step(tmp_path / "python.h5")
    with load_dump(tmp_path / "cpp.h5") as a, load_dump(tmp_path / "python.h5") as b:
        rows_a, rows_b = a.tensors, b.tensors
        assert len(rows_a) == len(rows_b) > 100
        assert {"float32", "bfloat16", "int64"} <= {r.dtype for r in rows_a}
        for x, y in zip(rows_a, rows_b, strict=True):
            assert (x.address, x.dtype, x.shape, x.first) == (y.address, y.dtype, y.shape,
                                                               y.first)
            for key, v in x.stats.items():
                w = y.stats[key]
                assert (v != v and w != w) or v == pytest.approx(w, rel=1e-5, abs=1e-6), \
                    (x.address, key, v, w)


def test_a_tensor_whose_storage_was_freed_is_an_error_not_a_read(ext):
    """FSDP frees an unsharded parameter by resizing its storage to 0: a view of it reads no
    memory of its own. The C++ path says so (the loop counts the op unrecorded and the step
    goes on) instead of reading address 0."""
    x = torch.randn(10)
    x.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match="past the end of its storage"):
        ext.stats(x, True)
    y = torch.randn(100)
    y.untyped_storage().resize_(40 * 4)  # 40 elements left, the view reads 100
    with pytest.raises(ValueError, match="past the end of its storage"):
        ext.stats(y, True)


def test_the_monitors_norms_read_no_freed_storage_and_decline_what_they_do_not_take(ext):
    """`norms` (the monitor's figures of many tensors in one call): a tensor whose storage was
    freed or cut short is not read and not declined (NaN: not measured); another device's,
    dtype's or layout's tensor, an empty one and one holding inf go to the torch path. A
    child process: a read of freed memory kills the process, as it would the user's."""
    code = textwrap.dedent("""
        import math, torch
        from accuracy.native import fastpath
        freed, short = torch.randn(10), torch.randn(100)
        freed.untyped_storage().resize_(0)
        short.untyped_storage().resize_(40 * 4)
        inf = torch.ones(4)
        inf[1] = math.inf
        ts = [torch.tensor([3.0, -4.0]), freed, short, torch.randn(4, 4).t(),
              torch.empty(0), inf, torch.arange(3), torch.randn(3, device="meta"),
              torch._neg_view(torch.tensor([1.0, 2.0]))]  # its bits are not its values
        vals, declined = fastpath.load().norms(ts)
        assert vals[:3] == [5.0, -4.0, 3.0], vals[:3]
        assert all(math.isnan(v) for v in vals[3:]), vals
        # the meta tensor has no memory to read: not measured, as a freed one
        assert declined == [3, 4, 5, 6, 8], declined
        print("ok")
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode,
                                                                   done.stderr[-2000:])
