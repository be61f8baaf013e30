"""Small C kernels for the hottest loops, compiled on first use and loaded with ctypes.

Why C: a statistics dump reduces every large tensor the step makes, and a compare every pair of
tensors. torch and numpy need one pass per figure (min/max, sums, the checksum; a compare's
dot products, differences, relative errors and their counts) and a Python call each; one fused
pass (`kernels.c`) is 3-4x faster. Why not a built extension: the package stays pure Python
(pip installs it anywhere); the helper is built for this machine's CPU with the C compiler
that Inductor needs anyway, once per user, in `$ACCURACY_CACHE_DIR` (default
`~/.cache/accuracy`). Without a compiler, or with `ACCURACY_NATIVE=0`, every caller keeps its
torch/numpy path: the figures are the same, only slower.

The cache is untrusted like any file: the library's name carries the hash of its source, the
compiler and the CPU, and a folder or file another user could write is refused, never loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import stat
import threading
from pathlib import Path

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("kernels.c")
_FLAGS = ["-O3", "-fopenmp-simd", "-fPIC", "-shared", "-fno-math-errno"]
_NATIVE_CPU = ["-march=native"]  # tried first; a compiler that refuses it builds without
_lock = threading.Lock()
_resolved: list[ctypes.CDLL | None] = []  # [the library or None] once resolved


def cache_dir() -> Path:
    """Where built helpers live: $ACCURACY_CACHE_DIR, else $XDG_CACHE_HOME/accuracy or
    ~/.cache/accuracy."""
    env = os.environ.get("ACCURACY_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accuracy"


def _compiler() -> str | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") \
        or shutil.which("clang")
    return cc if cc and shutil.which(cc) else None


def _cpu_tag() -> str:
    """What -march=native depends on: the CPU's model and feature flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    keep = [ln for ln in lines if ln.split(":")[0].strip() in (
        "model name", "flags", "Features", "CPU part")]
    return platform.machine() + "\n".join(dict.fromkeys(keep))


def _owned_privately(path: Path) -> bool:
    """Ours and writable by no one else: a helper someone else could swap is never loaded."""
    try:
        st = path.lstat()
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode):
        return False
    return st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _build(cc: str, target: Path) -> bool:
    import subprocess  # only here: most processes find the kernels built
    import tempfile

    folder = target.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not _owned_privately(folder):
        log.warning("native kernels: %s is not a folder only you can write; not used "
                    "(set ACCURACY_CACHE_DIR to one that is)", folder)
        return False
    fd, tmp = tempfile.mkstemp(prefix=target.name, suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        for cpu in (_NATIVE_CPU, []):
            try:
                done = subprocess.run([cc, *_FLAGS, *cpu, str(_SOURCE), "-o", tmp],
                                      capture_output=True, text=True, timeout=120, check=False)
            except subprocess.SubprocessError as e:  # a compiler that hangs
                log.info("native kernels: %s did not build %s (%s); the torch/numpy path is "
                         "used", cc, _SOURCE.name, e)
                return False
            if done.returncode == 0:
                os.chmod(tmp, 0o755)
                os.replace(tmp, target)  # atomic: ranks building at once each get a whole file
                return True
        log.info("native kernels: %s could not build %s (%s); the torch/numpy path is used",
                 cc, _SOURCE.name, done.stderr.strip().splitlines()[-1:] or done.returncode)
        return False
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def kernels() -> ctypes.CDLL | None:
    """The built `kernels.c` (functions in `_SIGNATURES`), or None where it cannot
    be had (no compiler, ACCURACY_NATIVE=0, a cache folder others can write). Resolved once
    per process: it is asked for every tensor a dump describes."""
    if _resolved:
        return _resolved[0]
    with _lock:
        if not _resolved:
            enabled = os.environ.get("ACCURACY_NATIVE", "1") != "0"
            _resolved.append(_load() if enabled else None)
    return _resolved[0]


def _load() -> ctypes.CDLL | None:
    cc = _compiler()
    if cc is None:
        log.info("native kernels: no C compiler found (set CC); the torch/numpy path is used")
        return None
    try:
        real = os.path.realpath(shutil.which(cc) or cc)
        st = os.stat(real)  # which compiler, by its file: no `cc --version` at every start
        digest = hashlib.sha256("\0".join([
            _SOURCE.read_text(), real, str(st.st_size), str(st.st_mtime_ns), " ".join(_FLAGS),
            _cpu_tag()]).encode()).hexdigest()[:20]
        target = cache_dir() / f"kernels-{digest}.so"
        if not target.exists() and not _build(cc, target):
            return None
        if not (_owned_privately(target.parent) and _owned_privately(target)):
            log.warning("native kernels: %s or its folder is writable by others or not yours; "
                        "not loaded (the torch/numpy path is used)", target)
            return None
        lib = ctypes.CDLL(str(target))
    except OSError as e:
        log.info("native kernels unavailable (%s); the torch/numpy path is used", e)
        return None
    for name, argtypes in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = None
    return lib


_P, _N = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "stats_f32": [_P, _N, _P, _P],  # (values, count, out double[4], counts int64[2])
    "stats_f64": [_P, _N, _P, _P],
    # (mine, golden, count, rel_eps, sums double[8], counts int64[3])
    "compare_f64": [_P, _P, _N, ctypes.c_double, _P, _P],
}
