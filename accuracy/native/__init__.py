"""Small C kernels for the hottest loops, compiled on first use and loaded with ctypes.

Why C: a statistics dump reduces every large tensor the step makes, and a compare (and a
replay, per output) every pair of tensors. torch and numpy need one pass per figure (min/max,
sums, the checksum; a compare's dot products, differences, relative errors and their counts)
and a Python call each; one fused pass (`kernels.c`) is 3-5x faster. Why not a built
extension: the package stays pure Python (pip installs it anywhere); the kernels are built for
this machine's CPU with the C compiler that Inductor needs anyway, once per user, in
`$ACCURACY_CACHE_DIR` (default `~/.cache/accuracy`). Without a compiler, or with
`ACCURACY_NATIVE=0`, every caller keeps its torch/numpy path: the same figures, slower.

The cache is untrusted like any file: a library's name carries the hash of the source, the
compiler and the CPU, and the hash of its own bytes, checked before each load (one cut short
by a crash is removed and built again); a folder or file another user could write is never
loaded.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shlex
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
    """Where built kernels live: $ACCURACY_CACHE_DIR, else $XDG_CACHE_HOME/accuracy or
    ~/.cache/accuracy."""
    env = os.environ.get("ACCURACY_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accuracy"


def _compiler() -> list[str] | None:
    """The compiler command: $CC (words: `ccache gcc` works), else cc, gcc or clang."""
    words = shlex.split(os.environ.get("CC", ""))
    if words:
        return words if shutil.which(words[0]) else None
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    return None


def _identity(cc: list[str]) -> list[str]:
    """Which compiler, by its files (path, size, mtime) and words: a compiler upgrade makes a
    new library, without running `cc --version` at every start."""
    out = list(cc)
    for word in cc:
        found = shutil.which(word)
        if found:
            real = os.path.realpath(found)
            st = os.stat(real)
            out += [real, str(st.st_size), str(st.st_mtime_ns)]
    return out


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


def _content_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _build(cc: list[str], folder: Path, stem: str) -> Path | None:
    """Compile into `folder` as `<stem>-<hash of the library's bytes>.so`: a file whose bytes
    do not match its name (cut short by a crash, damaged since) is never loaded."""
    import subprocess  # only here: most processes find the kernels built
    import tempfile

    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        log.warning("native kernels: cannot make %s (%s); the torch/numpy path is used, ~3x "
                    "slower (set ACCURACY_CACHE_DIR to a folder you can write)", folder, e)
        return None
    if not _owned_privately(folder):
        log.warning("native kernels: %s is not a folder only you can write; not used, the "
                    "torch/numpy path is (set ACCURACY_CACHE_DIR to one that is)", folder)
        return None
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=stem, suffix=".tmp", dir=folder)
    except OSError as e:
        log.warning("native kernels: cannot write in %s (%s); the torch/numpy path is used",
                    folder, e)
        return None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        why = ""
        for cpu in (_NATIVE_CPU, []):
            try:
                done = subprocess.run([*cc, *_FLAGS, *cpu, str(_SOURCE), "-o", str(tmp)],
                                      capture_output=True, text=True, timeout=120, check=False)
            except (OSError, subprocess.SubprocessError) as e:  # a compiler that hangs
                why = str(e)
                break
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            if done.returncode == 0 and tmp.stat().st_size > 0:
                with open(tmp, "rb") as f:
                    os.fsync(f.fileno())  # whole on disk before its name says it is
                os.chmod(tmp, 0o755)
                target = folder / f"{stem}-{_content_hash(tmp)}.so"
                os.replace(tmp, target)  # atomic: ranks building at once each get a whole file
                return target
            if done.returncode == 0:
                why = "the compiler wrote nothing"
        log.warning("native kernels: %s could not build %s (%s); the torch/numpy path is "
                    "used, ~3x slower", " ".join(cc), _SOURCE.name, why)
        return None
    finally:
        if tmp.exists():
            tmp.unlink()


def _verified(folder: Path, stem: str) -> Path | None:
    """A built library whose bytes match the hash in its name; damaged ones are removed
    (the folder is ours alone)."""
    for path in sorted(folder.glob(f"{stem}-*.so")):
        if not _owned_privately(path):
            log.warning("native kernels: %s is writable by others or not yours; not loaded",
                        path)
            continue
        try:
            good = path.name == f"{stem}-{_content_hash(path)}.so"
        except OSError:
            continue
        if good:
            return path
        log.warning("native kernels: %s is damaged (its bytes do not match its name); "
                    "removed and built again", path)
        path.unlink(missing_ok=True)
    return None


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


_stems: dict[tuple[str, ...], str] = {}


def _stem(cc: list[str]) -> str:
    """The library's name before its content hash: source, compiler, flags and CPU."""
    key = tuple(cc)
    if key not in _stems:
        digest = hashlib.sha256("\0".join([
            _SOURCE.read_text(), *_identity(cc), " ".join(_FLAGS), _cpu_tag()]).encode()
        ).hexdigest()[:20]
        _stems[key] = f"kernels-{digest}"
    return _stems[key]


def _load() -> ctypes.CDLL | None:
    cc = _compiler()
    if cc is None:
        log.info("native kernels: no C compiler found (set CC); the torch/numpy path is used")
        return None
    try:
        folder, stem = cache_dir(), _stem(cc)
        if folder.exists() and not _owned_privately(folder):
            log.warning("native kernels: %s is writable by others or not yours; not used, "
                        "the torch/numpy path is (set ACCURACY_CACHE_DIR to a private folder)",
                        folder)
            return None
        path = (_verified(folder, stem) if folder.exists() else None) or _build(
            cc, folder, stem)
        if path is None:
            return None
        lib = ctypes.CDLL(str(path))
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = None
    except (OSError, AttributeError) as e:
        log.warning("native kernels unavailable (%s); the torch/numpy path is used", e)
        return None
    return lib


_P, _N = ctypes.c_void_p, ctypes.c_int64
_SIGNATURES = {
    "stats_f32": [_P, _N, _P, _P],  # (values, count, out double[4], counts int64[2])
    "stats_f64": [_P, _N, _P, _P],
    # (pointers, counts, fp32 flags int8, k, out double[4k], non-finite flags int64[k])
    "stats_many": [_P, _P, _P, _N, _P, _P],
    # (mine, golden, count, rel_eps, sums double[8], counts int64[3])
    "compare_f64": [_P, _P, _N, ctypes.c_double, _P, _P],
    "compare_f32_f64": [_P, _P, _N, ctypes.c_double, _P, _P],  # mine fp32, golden fp64
}


def stats_pass(ptr: int, n: int, fp32: bool) -> tuple[float, float, float, float, int] | None:
    """(min, max, sum, sum of squares, checksum) of `n` contiguous fp32 (`fp32`) or fp64
    values at `ptr` in one pass; None where the kernels are not built or a value is not
    finite (the caller's torch/numpy path counts NaN and inf apart)."""
    lib = kernels()
    if lib is None:
        return None
    out, counts = (ctypes.c_double * 4)(), (ctypes.c_int64 * 2)()
    (lib.stats_f32 if fp32 else lib.stats_f64)(ptr, n, out, counts)
    if counts[0]:
        return None
    return out[0], out[1], out[2], out[3], counts[1]


def kernels_if_built() -> ctypes.CDLL | None:
    """`kernels()` where that needs no compile: resolved already, or a build in the cache to
    load (so a step's figures take them from the first step, as before); else None, left
    unresolved: a training step's path, which never waits for a first build (the monitor
    builds them on a thread of its own)."""
    if _resolved:
        return _resolved[0]
    cc = _compiler()
    if cc is not None and os.environ.get("ACCURACY_NATIVE", "1") != "0":
        try:
            if not any(cache_dir().glob(f"{_stem(cc)}-*.so")):
                return None
        except OSError:
            return None
    return kernels()


def stats_passes(blocks: list[tuple[int, int, bool]], build: bool = True
                 ) -> list[tuple[float, float, float, float] | None] | None:
    """`stats_pass` of many blocks `(ptr, n, fp32)` in one call: (min, max, sum, sum of
    squares) per block, None for a block holding a non-finite value; None where the kernels
    are not built (with `build=False`, also while a first build is under way). One ctypes call
    however many blocks: a step's small tensors cost their passes, not a call each."""
    lib = kernels() if build else kernels_if_built()
    if lib is None:
        return None
    k = len(blocks)
    if k == 0:
        return []
    ptrs = (ctypes.c_void_p * k)(*[b[0] for b in blocks])
    ns = (ctypes.c_int64 * k)(*[b[1] for b in blocks])
    kinds = (ctypes.c_int8 * k)(*[1 if b[2] else 0 for b in blocks])
    out, flags = (ctypes.c_double * (4 * k))(), (ctypes.c_int64 * k)()
    lib.stats_many(ptrs, ns, kinds, k, out, flags)
    vals = out[:]
    return [None if flags[i] else (vals[4 * i], vals[4 * i + 1], vals[4 * i + 2],
                                   vals[4 * i + 3]) for i in range(k)]


def compare_pass(mine: int, golden: int, n: int, rel_eps: float, mine_fp32: bool = False
                 ) -> tuple[list[float], int, int] | None:
    """One compare pass over `n` contiguous values (golden fp64; mine fp64, or fp32 with
    `mine_fp32`): ([x.x, y.y, x.y, d.d, sum |d|, max |d|, sum rel, max rel], count of rel <
    1e-3, count of rel < 5e-3); None where the kernels are not built or a value is not finite
    (the caller's numpy/torch path sets such pairs apart)."""
    lib = kernels()
    if lib is None:
        return None
    sums, counts = (ctypes.c_double * 8)(), (ctypes.c_int64 * 3)()
    (lib.compare_f32_f64 if mine_fp32 else lib.compare_f64)(mine, golden, n, rel_eps, sums,
                                                            counts)
    if counts[0]:
        return None
    return list(sums), counts[1], counts[2]
