"""The kernels recorded are the kernels that run: a launch site's description against the
module that launches it.

A launch site's description (its buffers, origin nodes, replay reference) is written at code
generation and registered when the generated module loads; a dumper may record the program
long after (accuracy/dumper/compiled/standing.py). Before the launches of a site are recorded,
the digest of its kernel's definition as generated (`KernelInfo.src`, taken from
`define_kernel`) is compared with the digest of the definition in the module running it: the
file Inductor's code cache loaded it from (its name is Inductor's hash of that source), read
with `ast`, never run. A site whose digests differ, or whose running definition cannot be
found, is not recorded: its region reads `BLIND:` with this module's reason.
"""

from __future__ import annotations

import ast
import hashlib
import logging
import os
import threading
from typing import Any

log = logging.getLogger(__name__)

_lock = threading.Lock()
# module file -> ((mtime_ns, size), kernel name -> digest of its definition)
_FILES: dict[str, tuple[tuple[int, int], dict[str, str]]] = {}
_MAX_FILES = 256


def digest(definition: str) -> str:
    """The digest of a kernel's definition text (what follows `name = ` in the module)."""
    return hashlib.sha256(definition.strip().encode()).hexdigest()[:16]


def _definitions(path: str) -> dict[str, str]:
    """Kernel name -> digest of its definition, for every top-level `name = call(...)` of the
    module file at `path` (cached while the file is unchanged)."""
    st = os.stat(path)
    stamp = (st.st_mtime_ns, st.st_size)
    with _lock:
        got = _FILES.get(path)
    if got is not None and got[0] == stamp:
        return got[1]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    out: dict[str, str] = {}
    for node in ast.parse(text, filename=path).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call):
            seg = ast.get_source_segment(text, node.value)
            if seg is not None:
                out[node.targets[0].id] = digest(seg)
    with _lock:
        if len(_FILES) >= _MAX_FILES:
            _FILES.pop(next(iter(_FILES)))
        _FILES[path] = (stamp, out)
    return out


def mismatch(kernel: str, src: str, module_globals: dict[str, Any]) -> str | None:
    """Why the launches of `kernel` (described with definition digest `src`) cannot be taken
    as the running program's: None when the module running it defines it with that digest."""
    if not src:
        return "its description carries no digest of the kernel's source"
    path = module_globals.get("__file__")
    if not isinstance(path, str):
        return "the module running it has no source file to check it against"
    try:
        running = _definitions(path).get(kernel)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError) as e:
        return f"the running module's source {path} cannot be read ({type(e).__name__})"
    if running is None:
        return f"the running module {os.path.basename(path)} does not define it"
    if running != src:
        return (f"its source digest {src} differs from the running definition's {running} "
                f"(module {os.path.basename(path)})")
    return None
