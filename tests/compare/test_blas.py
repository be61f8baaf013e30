"""OpenBLAS is kept single-threaded around the metric pass without reading /proc/self/maps
for every batch (a Dask worker or a `-j` process enters it per 32 MB batch: 89 reads of
~1.5 ms each per compare of the benchmark step), yet a library loaded later is still found."""

from __future__ import annotations

import ctypes
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from accuracy.compare import blas

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")


def _count_map_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = open

    def counting(path, *a, **k):  # type: ignore[no-untyped-def]
        reads.append(str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(blas, "open", counting, raising=False)
    monkeypatch.setattr(blas, "_cache", None, raising=False)
    return reads


def test_the_libraries_are_looked_up_once_while_nothing_new_is_loaded(monkeypatch):
    np.ones(4) @ np.ones(4)  # numpy's OpenBLAS is loaded
    reads = _count_map_reads(monkeypatch)
    first = blas._libraries()
    for _ in range(5):
        with blas.single_threaded_blas():
            assert all(get() == 1 for get, _ in blas._libraries())
    assert reads == ["/proc/self/maps"]
    assert [f for f, _ in blas._libraries()] == [f for f, _ in first]


def test_a_library_loaded_later_makes_them_looked_up_again(monkeypatch, tmp_path: Path):
    assert blas.load_count() is not None  # glibc says its loads
    reads = _count_map_reads(monkeypatch)
    blas._libraries()
    blas._libraries()
    assert len(reads) == 1
    lib = next((p for p in ("/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib64/libz.so.1",
                            "/usr/lib64/libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1")
                if Path(p).exists()), None)
    if lib is None:
        pytest.skip("no libz to load a copy of")
    copy = tmp_path / "libz_copy_for_blas_test.so"
    shutil.copy(lib, copy)
    before = blas.load_count()
    ctypes.CDLL(str(copy))  # a new object: the loader's count moves
    assert blas.load_count() != before
    blas._libraries()
    assert len(reads) == 2
    blas._libraries()
    assert len(reads) == 2


def test_the_thread_count_is_restored_after_the_pass():
    libs = blas._libraries()
    if not libs:
        pytest.skip("no OpenBLAS loaded")
    get, set_ = libs[0]
    before = get()
    set_(2)
    try:
        with blas.single_threaded_blas():
            assert get() == 1
        assert get() == 2
    finally:
        set_(before)
