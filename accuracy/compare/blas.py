"""Keep OpenBLAS single-threaded while comparing.

The metric pass calls BLAS dot products on small chunks; on a busy machine OpenBLAS's own
threads contend with everything else and made a dot ~100x slower than single-threaded. This
limits the OpenBLAS libraries already loaded (as threadpoolctl does, without the dependency)
and restores the previous count afterwards. Linux only; elsewhere it does nothing.

Finding the libraries reads /proc/self/maps (~1.5 ms in a Dask worker: hundreds of
mappings). A worker enters this once per 32 MB batch, 89 times per compare of the benchmark
step, so the list is kept per process and read again only when the dynamic loader has loaded
or unloaded a library since (glibc counts both: `dl_iterate_phdr`'s `dlpi_adds`/`dlpi_subs`).
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Iterator
from contextlib import contextmanager

_SYMBOLS = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
            ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
            ("openblas_get_num_threads", "openblas_set_num_threads"))
Libraries = list[tuple[ctypes._CFuncPtr, ctypes._CFuncPtr]]


class _PhdrInfo(ctypes.Structure):
    """The head of glibc's `struct dl_phdr_info` (link.h), up to the load counters."""

    _fields_ = [("addr", ctypes.c_void_p), ("name", ctypes.c_char_p),
                ("phdr", ctypes.c_void_p), ("phnum", ctypes.c_uint16),
                ("adds", ctypes.c_ulonglong), ("subs", ctypes.c_ulonglong)]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_PhdrInfo), ctypes.c_size_t,
                             ctypes.c_void_p)


def _iterate_phdr() -> ctypes._CFuncPtr | None:
    """glibc's dl_iterate_phdr, called holding the GIL (PyDLL): it holds the loader's lock
    while our callback runs, and a callback waiting for the GIL while another thread holds
    the GIL inside dlopen (an import) would wait on each other forever."""
    try:
        return ctypes.PyDLL(None).dl_iterate_phdr
    except (OSError, AttributeError):
        return None


_ITERATE = _iterate_phdr()
_cache: tuple[tuple[int, int], Libraries] | None = None


def load_count() -> tuple[int, int] | None:
    """(libraries loaded, unloaded) by this process so far, or None where the loader does
    not say (not glibc): then the libraries are looked up on every call."""
    if _ITERATE is None:
        return None
    got: list[tuple[int, int]] = []

    def first(info: ctypes._Pointer, size: int, _: object) -> int:
        if size >= ctypes.sizeof(_PhdrInfo):
            got.append((info.contents.adds, info.contents.subs))
        return 1  # the counters are global: the first object says them

    _ITERATE(_CALLBACK(first), None)
    return got[0] if got else None


def _scan() -> Libraries:
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


def _libraries() -> Libraries:
    """The loaded OpenBLAS libraries' (get, set) thread-count functions."""
    global _cache
    key = load_count()
    if key is None:
        return _scan()
    if _cache is None or _cache[0] != key:
        libs = _scan()  # its CDLL calls load nothing new: the key is taken after it
        _cache = (load_count() or key, libs)
    return _cache[1]


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
