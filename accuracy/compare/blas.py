"""Keep OpenBLAS single-threaded while comparing.

The metric pass calls BLAS dot products on small chunks; on a busy machine OpenBLAS's own
threads contend with everything else and made a dot ~100x slower than single-threaded. This
limits the OpenBLAS libraries already loaded (as threadpoolctl does, without the dependency)
and restores the previous count afterwards. Linux only; elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Iterator
from contextlib import contextmanager

_SYMBOLS = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
            ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
            ("openblas_get_num_threads", "openblas_set_num_threads"))


def _libraries() -> list[tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]]:
    try:
        maps = open("/proc/self/maps").read()
    except OSError:
        return []
    out = []
    for path in sorted(set(re.findall(r"(/\S*openblas\S*\.so\S*)", maps))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get, set_ in _SYMBOLS:
            if hasattr(lib, get) and hasattr(lib, set_):
                out.append((getattr(lib, get), getattr(lib, set_)))
                break
    return out


@contextmanager
def single_threaded_blas() -> Iterator[None]:
    libs = _libraries()
    before = [get() for get, _ in libs]
    for _, set_ in libs:
        set_(1)
    try:
        yield
    finally:
        for (_, set_), n in zip(libs, before, strict=True):
            set_(n)
