"""The statistics dump's C++ per-tensor path (`stats.cpp`), built once and cached.

Why C++: a statistics dump describes every tensor an op reads and makes, and most are small;
the Python path spends a Python call and a numpy or torch reduction per figure on each (tens
of µs), the C++ one a single call and pass. It is a `torch.utils.cpp_extension` module built
through accuracy/native/cppext.py (the cache, its checks and its lock, as the npu test device
is built), so it takes torch tensors as they are.

It is asked for when a dump opens (`load`) or a monitor starts (`load_in_background`), never
inside the step: the first dump on a
machine builds it (tens of seconds, once; later processes load it from the cache). Where it
cannot be had (no C++ compiler or ninja, a cache others can write, a compile error) one line
is logged and every tensor takes the Python path, the same figures, slower;
`ACCURACY_NATIVE=0` asks for the Python path without trying.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("stats.cpp")
CFLAGS = ("-O3", "-fopenmp-simd", "-fno-math-errno")
# tried first, as for kernels.c; the extension's name then carries the CPU's tag, so a cache
# shared by machines with other CPUs never loads a build for another instruction set
NATIVE_CPU = ("-march=native",)
_lock = threading.Lock()
_resolved: list[ModuleType | None] = []  # [the module or None] once resolved


def enabled() -> bool:
    """Whether the native paths are wanted at all (`ACCURACY_NATIVE=0`: never)."""
    return os.environ.get("ACCURACY_NATIVE", "1") != "0"


def load() -> ModuleType | None:
    """The built extension, or None (logged once per process) where it cannot be had."""
    if _resolved:
        return _resolved[0]
    with _lock:
        if not _resolved:
            _resolved.append(_load() if enabled() else None)
    return _resolved[0]


def loaded() -> ModuleType | None:
    """The extension if `load` has resolved it already, else None: never builds (what the
    per-tensor path asks, so a tensor described outside a dump never waits for a build)."""
    return _resolved[0] if _resolved else None


def load_in_background() -> None:
    """Resolve the C kernels (`accuracy.native.kernels`), then `load`, on a thread of its own
    (the monitor, whose figures take the C++ module once loaded, the C kernels until then and
    torch's path before either: a first build of either never stalls a training step)."""
    from accuracy import native

    if not enabled() or (_resolved and native.kernels_if_built() is not None):
        return
    threading.Thread(target=_load_both, name="accuracy-native-load", daemon=True).start()


def _load_both() -> None:
    from accuracy import native

    native.kernels()
    load()


def _load() -> ModuleType | None:
    import hashlib

    from accuracy.errors import ExtensionUnavailableError
    from accuracy.native import _cpu_tag
    from accuracy.native.cppext import load_extension

    cpu = hashlib.sha256(_cpu_tag().encode()).hexdigest()[:8]
    try:
        try:
            return load_extension(f"accuracy_stats_{cpu}", [SOURCE], (*CFLAGS, *NATIVE_CPU))
        except ExtensionUnavailableError as e:
            if "-march" not in str(e):
                raise
        return load_extension("accuracy_stats", [SOURCE], CFLAGS)
    except ExtensionUnavailableError as e:
        log.warning("the C++ statistics module is unavailable (%s): the statistics dump and "
                    "the monitor take their slower paths, with the same figures", e)
    except Exception as e:  # noqa: BLE001 - a broken toolchain never breaks the user's step
        log.warning("the C++ statistics module failed to load (%s: %s): the statistics dump "
                    "and the monitor take their slower paths, with the same figures",
                    type(e).__name__, e)
    return None


def reset() -> None:
    """Forget the resolution (tests switching ACCURACY_NATIVE)."""
    with _lock:
        _resolved.clear()
