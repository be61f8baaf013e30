"""Build and load the project's C++ torch extensions, once per machine, in the shared cache.

Why here: the C kernels (`accuracy.native`) and every C++ extension live under one root,
`$ACCURACY_CACHE_DIR` (default `~/.cache/accuracy`), so a clean CI clone builds each once and
one folder holds all there is to clear. An extension's folder is
`torch_extensions/<name>-<digest>`, the digest covering its sources, torch's version and ABI,
Python's ABI tag and the compiler, so an upgrade of any of them builds anew beside the old.

Concurrent processes (pytest-xdist workers, ranks) take a file lock: one builds, the others
wait for it, then load what it built. A build is only trusted once its manifest names the
library and the hash of its bytes; a folder without one (a build cut short) is removed and built
again, and a folder or library another user could write is never loaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

from accuracy.errors import ExtensionUnavailableError
from accuracy.native import _identity, _owned_privately, cache_dir

log = logging.getLogger(__name__)

_MANIFEST = "BUILT.json"
_FLAGS = ("-O2",)  # cpp_extension.load adds no optimisation of its own
_lock = threading.Lock()
_loaded: dict[str, ModuleType] = {}
built_here: list[str] = []  # extensions this process compiled (the others it found built)


def _compiler() -> list[str]:
    """What torch.utils.cpp_extension compiles with: $CXX, else c++."""
    words = shlex.split(os.environ.get("CXX", "")) or ["c++"]
    if not shutil.which(words[0]):
        raise ExtensionUnavailableError(
            f"no C++ compiler: {words[0]!r} is not on PATH (install g++ or set CXX)")
    return words


def _digest(name: str, sources: Sequence[Path], cflags: Sequence[str], cxx: list[str]) -> str:
    import torch

    h = hashlib.sha256()
    folders = sorted({p.parent for p in sources})
    files = sorted({*sources, *(f for d in folders for f in d.glob("*.h"))})
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    for part in (name, torch.__version__, str(torch.version.git_version),
                 str(torch._C._GLIBCXX_USE_CXX11_ABI), sys.implementation.cache_tag,
                 platform.machine(), *_identity(cxx), *_FLAGS, *cflags):
        h.update(str(part).encode() + b"\0")
    return h.hexdigest()[:16]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _private_folder(path: Path) -> Path:
    """Make `path` (mode 0700) or check it is ours alone."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise ExtensionUnavailableError(
            f"cannot create the build cache {path} ({e.strerror}): set ACCURACY_CACHE_DIR to a "
            f"folder you can write") from e
    if not _owned_privately(path):
        raise ExtensionUnavailableError(
            f"the build cache {path} is not a folder only you can write: set ACCURACY_CACHE_DIR "
            f"to one that is")
    return path


def _built(folder: Path) -> Path | None:
    """The library a finished build left in `folder`, verified, or None."""
    manifest = folder / _MANIFEST
    if not manifest.is_file():
        return None
    if not (_owned_privately(folder) and _owned_privately(manifest)):
        raise ExtensionUnavailableError(
            f"{folder} is writable by others or not yours: not loaded (remove it, or set "
            f"ACCURACY_CACHE_DIR to a private folder)")
    try:
        entry = json.loads(manifest.read_text())
        library = folder / Path(str(entry["library"])).name
        good = _owned_privately(library) and _sha256(library) == entry["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        good = False
    if not good:
        log.warning("%s: the built library does not match its manifest; built again", folder)
        return None
    return library


@contextlib.contextmanager
def _locked(path: Path, what: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process building %s", what)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock (a killed holder's lock goes with it)


def _import(module_name: str, library: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(module_name, library)
    if spec is None or spec.loader is None:
        raise ExtensionUnavailableError(f"cannot load {library}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[module_name] = module
    return module


def _build(name: str, module_name: str, folder: Path, sources: Sequence[Path],
           cflags: Sequence[str], log_path: Path) -> Path:
    from torch.utils import cpp_extension

    if folder.exists():
        shutil.rmtree(folder)  # a build cut short: nothing in it is trusted
    _private_folder(folder)
    started = time.perf_counter()
    try:
        cpp_extension.load(name=module_name, sources=[str(s) for s in sources],
                           extra_cflags=[*_FLAGS, *cflags], build_directory=str(folder),
                           verbose=False, is_python_module=True)
    except subprocess.CalledProcessError as e:  # torch runs the compiler (CXX --version) first
        output = e.output.decode(errors="replace") if isinstance(e.output, bytes) else ""
        log_path.write_text(f"{e}\n{output}")
        command = shlex.join(map(str, e.cmd)) if isinstance(e.cmd, list | tuple) else str(e.cmd)
        raise ExtensionUnavailableError(
            f"cannot build the C++ extension {name}: `{command}` failed (exit {e.returncode}): "
            f"set CXX to a working C++ compiler (now {shlex.join(_compiler())!r}; full log: "
            f"{log_path})") from e
    except (RuntimeError, OSError, ImportError) as e:
        text = str(e)
        log_path.write_text(text)
        lines = text.splitlines()
        first = next((ln for ln in lines if ": error:" in ln or "fatal error" in ln),
                     lines[0] if lines else "no output")
        raise ExtensionUnavailableError(
            f"cannot build the C++ extension {name}: {first.strip()[:300]} "
            f"(full log: {log_path})") from e
    library = folder / f"{module_name}.so"
    if not library.is_file():
        raise ExtensionUnavailableError(f"building {name} left no {library.name} in {folder}")
    with open(library, "rb") as f:
        os.fsync(f.fileno())
    for obj in folder.glob("*.o"):  # only the library is loaded from here on
        obj.unlink()
    tmp = folder / (_MANIFEST + ".tmp")
    tmp.write_text(json.dumps({"library": library.name, "sha256": _sha256(library),
                               "seconds": round(time.perf_counter() - started, 1)}))
    os.replace(tmp, folder / _MANIFEST)
    log.info("built %s in %.1f s into %s", name, time.perf_counter() - started, folder)
    built_here.append(name)
    return library


def extension_folder(name: str, sources: Sequence[Path], cflags: Sequence[str] = ()) -> Path:
    """Where `name` built from `sources` lives (or will) in the cache."""
    digest = _digest(name, sources, cflags, _compiler())
    return cache_dir() / "torch_extensions" / f"{name}-{digest}"


def load_extension(name: str, sources: Sequence[Path], cflags: Sequence[str] = ()) -> ModuleType:
    """The Python module of the C++ extension `name` built from `sources` (built on first use,
    then loaded from the cache). Raises ExtensionUnavailableError with the reason where it
    cannot be had (no compiler or ninja, a cache folder others can write, a compile error)."""
    sources = [Path(s).resolve() for s in sources]
    with _lock:
        if name in _loaded:
            return _loaded[name]
        folder = extension_folder(name, sources, cflags)
        module_name = f"{name}_{folder.name.rsplit('-', 1)[1]}"
        if module_name in sys.modules:  # loaded by an earlier call under another cache root
            _loaded[name] = sys.modules[module_name]
            return _loaded[name]
        root = _private_folder(folder.parent)
        library = _built(folder) if folder.is_dir() else None
        if library is None:
            with _locked(root / f"{folder.name}.lock", name):
                library = (_built(folder) if folder.is_dir() else None) or _build(
                    name, module_name, folder, sources, cflags, root / f"{folder.name}.log")
        if module_name in sys.modules:  # _build imported it already
            module = sys.modules[module_name]
        else:
            module = _import(module_name, library)
        _loaded[name] = module
        return module
